"""AstraFlow's shared store: trajectory tables, versioned weights, ledger, metrics.

A leaf package: it imports nothing from the runtime, so rollout workers,
trainers, audits and scaling policies can all depend on it.
"""

from astraflow.stores._lance import SchemaMismatch, StoreError
from astraflow.stores.ledger import Ledger, LedgerEntry, Progress, check_ledger
from astraflow.stores.schema import SCHEMA_VERSION, TRAJECTORY_SCHEMA
from astraflow.stores.trajectories import Slice, TrajectoryStore, table_name
from astraflow.stores.weights import Manifest, TamperedWeights, WeightError, WeightStore

__all__ = [
    "SCHEMA_VERSION",
    "TRAJECTORY_SCHEMA",
    "Ledger",
    "LedgerEntry",
    "Manifest",
    "Progress",
    "SchemaMismatch",
    "Slice",
    "StoreError",
    "TamperedWeights",
    "TrajectoryStore",
    "WeightError",
    "WeightStore",
    "check_ledger",
    "table_name",
]
