"""AstraFlow's shared store: trajectory tables, versioned weights, ledger, metrics.

A leaf package: it imports nothing from the runtime, so rollout workers,
trainers, audits and scaling policies can all depend on it.
"""

from astraflow.stores.checkpoints import Checkpoint, CheckpointError, CheckpointStore
from astraflow.stores.ledger import Ledger, LedgerEntry, Progress, check_ledger, replay
from astraflow.stores.objects import ObjectStore
from astraflow.stores.retry import StoreError, StoreUnavailable
from astraflow.stores.schema import SCHEMA_VERSION, TRAJECTORY_SCHEMA, SchemaMismatch
from astraflow.stores.trajectories import Slice, TrajectoryStore, table_name
from astraflow.stores.weights import Manifest, TamperedWeights, WeightError, WeightStore

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointStore",
    "SCHEMA_VERSION",
    "TRAJECTORY_SCHEMA",
    "Ledger",
    "LedgerEntry",
    "Manifest",
    "ObjectStore",
    "Progress",
    "SchemaMismatch",
    "Slice",
    "StoreError",
    "StoreUnavailable",
    "TamperedWeights",
    "TrajectoryStore",
    "WeightError",
    "WeightStore",
    "check_ledger",
    "replay",
    "table_name",
]
