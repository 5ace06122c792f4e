"""What one trainer step consumes: the polled slice through the data stages, as a Batch.

Rank 0 runs this. Staleness is measured by lineage (astraflow/train/lineage.py), not by
version numbers. The ledger counts (used, stale, filtered) cover only the consumed
rows: replayed rows (data stages) are extra reuse, not consumption.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from astraflow.data.stages import History, StageContext, run_stages
from astraflow.stores import Slice
from astraflow.train.batch import Batch
from astraflow.train.lineage import Lineage


@dataclass
class Consumed:
    batch: Batch | None
    """None when the stages dropped every row."""
    used: int
    stale: int
    filtered: int
    metrics: dict[str, float]


def consume(sl: Slice, stages: list[tuple[str, dict[str, Any]]], *, policy: str, version: int,
            step: int, lineage: Lineage, history: History,
            same_weights: bool) -> Consumed:
    """`sl`'s rows through `stages` for the trainer at weights `version`. Rows sampled
    by exactly the weights the trainer holds (`version`, and `same_weights`: no update
    since it was published) measure the engine-vs-trainer logprob mismatch."""
    behavior = sl.rows.column("behavior_version")
    ctx = StageContext(policy=policy, version=version, step=step,
                       lineage_staleness=lineage.staleness_of(version, behavior.to_pylist()),
                       history=history)
    staged = run_stages(sl.rows, ctx, stages)
    rows = staged.rows
    used, stale, filtered = staged.ledger_counts()
    lag = ctx.row_staleness(behavior)
    known = lag[~np.isnan(lag)]
    metrics = {
        "reward_mean": float(torch.tensor(sl.rows.column("reward").to_pylist()).mean()),
        "rows_read": sl.num_rows,
        "rows_used": used,
        **staged.metrics,
    }
    if known.size:
        metrics["staleness_mean"] = float(known.mean())
    if known.size < lag.size:
        metrics["rows_lineage_unknown"] = float(lag.size - known.size)
    batch = None
    if rows.num_rows > 0:
        on_policy = [same_weights and v == version
                     for v in rows.column("behavior_version").to_pylist()]
        batch = Batch.from_table(rows, on_policy)
    return Consumed(batch, used, stale, filtered, metrics)
