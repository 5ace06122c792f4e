"""What one trainer step consumes: the polled slice through the data stages, as a Batch.

Rank 0 runs this. Staleness is measured by lineage (astraflow/train/lineage.py), not by
version numbers. The ledger counts (used, stale, filtered) cover only the consumed
rows: replayed rows (data stages) are extra reuse, not consumption.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from astraflow.data.stages import History, StageContext, run_stages, signal_rows, solved_share
from astraflow.stores import Slice
from astraflow.train.batch import Batch
from astraflow.train.lineage import Lineage

if TYPE_CHECKING:
    from astraflow.config.flow import FlowSpec


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
            same_weights: bool, solved_at: float | None = None) -> Consumed:
    """`sl`'s rows through `stages` for the trainer at weights `version`. Rows sampled
    by exactly the weights the trainer holds (`version`, and `same_weights`: no update
    since it was published) measure the engine-vs-trainer logprob mismatch. With
    `solved_at`, the batch carries the share of the rows' groups solved at that reward,
    counted before the stages drop them (metric `solved_share`)."""
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
    share = 0.0
    if solved_at is not None:
        share = metrics["solved_share"] = solved_share(sl.rows, solved_at)
    batch = None
    if rows.num_rows > 0:
        on_policy = [same_weights and v == version
                     for v in rows.column("behavior_version").to_pylist()]
        batch = Batch.from_table(rows, on_policy)
        batch.solved_share = share
    return Consumed(batch, used, stale, filtered, metrics)


class BatchFill:
    """How many rows the next poll asks for (`algorithm.min_signal_rows`, DAPO's dynamic
    sampling done by the consumer): one rollout batch, or, when the rows read so far hold
    fewer than `need` rows in groups whose rewards differ, one batch more, up to `limit`
    rows (the workers' backlog bound: more would never come).

    Why: late in a run most groups are all-correct, and a step on the one or two groups
    left is fitted to a handful of prompts yet moves the model as far as a step on
    eight. Reading on until the step carries `need` rows of signal spends idle rollout
    capacity, not trainer time. The rows read and not yet stepped on stay after the
    cursor, so a crash loses nothing and no row is consumed twice.
    """

    def __init__(self, batch: int, need: int | None, limit: int):
        self.batch, self.need, self.limit = batch, need, limit
        self.want = batch

    def take(self, sl: Slice | None) -> Slice | None:
        """The slice to step on, or None to wait for `self.want` rows."""
        if sl is None or not self.need:
            return sl
        if signal_rows(sl.rows) < self.need and sl.num_rows + self.batch <= self.limit:
            self.want = sl.num_rows + self.batch
            return None
        self.want = self.batch
        return sl


def step_rows(flow: FlowSpec, policy: str) -> int:
    """Rows one step of `policy` consumes (`algorithm.step_rows`, default one rollout
    batch); a size the workers' backlog bound can never reach would stall the run, so
    refuse it."""
    batch = flow.batch_rows(policy)
    rows = flow.policy_spec(policy).algorithm.step_rows or batch
    room = flow.backlog_rows(policy)
    if rows > room:
        raise ValueError(
            f"policies.{policy}.algorithm.step_rows={rows} exceeds the backlog the "
            f"workers fill ({flow.rollout.max_backlog_batches} batches of {batch} rows): raise "
            f"rollout.max_backlog_batches to at least {-(-rows // batch)}")
    if flow.mode == "sync" and rows > batch:
        raise ValueError(
            f"policies.{policy}.algorithm.step_rows={rows}: sync mode trains on each "
            f"batch of {batch} rows as it is produced; use minibatches, or async mode")
    return rows
