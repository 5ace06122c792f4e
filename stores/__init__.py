"""AstraFlow's shared store: trajectory tables, versioned weights, ledger, metrics.

A leaf package: it imports nothing from the runtime, so rollout workers,
trainers, audits and scaling policies can all depend on it.
"""

from ._lance import SchemaMismatch, StoreError
from .ledger import Ledger, LedgerEntry, check_ledger
from .schema import SCHEMA_VERSION, TRAJECTORY_SCHEMA
from .trajectories import Slice, TrajectoryStore, table_name
from .weights import Manifest, TamperedWeights, WeightError, WeightStore

__all__ = [
    "SCHEMA_VERSION",
    "TRAJECTORY_SCHEMA",
    "Ledger",
    "LedgerEntry",
    "Manifest",
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
