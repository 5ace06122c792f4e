"""Data stages: pure functions that turn consumed trajectories into a batch.

A stage takes the rows a trainer consumed (an Arrow table) and a StageContext and
returns the rows it keeps plus counts of the rows it dropped, by reason. Stages are
chained by name in the flow (`stages: [{name: staleness, params: {max_versions: 8}}]`),
built-in (see astraflow.registry: `staleness`, `zero_variance_filter` and
`group_advantages` here, `replay` in data/replay.py, the shaping stages in
data/shaping.py) or `module:attr` for your own function with the same signature.
Dropped rows are never silent: the trainer writes every count into the ledger
(`stale` → rows_stale, anything else → rows_filtered) and its metrics.

Replayed rows (`replayed = true`) are extra uses of rows an earlier step consumed:
never counted again in the ledger, and dropped under the reason `replayed`
(`drop_rows` does this). `run_stages` checks both rules for every stage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from astraflow import registry

#: Marks rows a stage added that this step did not consume (replay); bool column.
REPLAYED = "replayed"
#: Per-row loss weight a stage may write (float32); the loss is the weight-averaged token mean.
LOSS_WEIGHT = "loss_weight"


class History(Protocol):
    """Read-only view of the policy's earlier rows: those committed at or before the
    cursor this step starts from (consumed by earlier steps), as an Arrow table with
    `columns` and the rows matching `where` (a LanceDB SQL filter)."""

    def __call__(self, *, columns: list[str], where: str | None = None) -> pa.Table: ...


@dataclass(frozen=True)
class StageContext:
    policy: str
    version: int  # the trainer's current (newest published) weight version
    step: int
    lineage_staleness: Mapping[int, int | None] | None = None
    """Behaviour version → its staleness by lineage (astraflow/train/lineage.py: trained
    versions between it and `version` through the lineage tree; None: the version
    cannot be placed, e.g. a pruned dead branch). The trainer always fills it, for
    every behaviour version of the rows it passes. None here means a linear history
    (no rollback ever), where staleness is `version − behavior_version`."""
    history: History | None = None
    """The policy's rows before this step's cursor range (the trainer passes its
    trajectory table, read-only). Stages stay pure functions of (rows, context): the
    table is append-only, so the same step sees the same history when it is redone
    after a rollback. None outside a trainer; a stage that needs it must say so."""

    def row_staleness(self, behavior_versions: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Staleness of each row (float; NaN where the lineage is unknown)."""
        versions = np.asarray(behavior_versions.to_pylist(), dtype=np.int64)
        if self.lineage_staleness is None:
            return (self.version - versions).astype(np.float64)
        table = self.lineage_staleness
        missing = sorted({int(v) for v in versions} - set(table))
        if missing:
            raise KeyError(f"StageContext.lineage_staleness has no entry for behaviour "
                           f"version(s) {missing}")
        lag = {v: np.nan if s is None else float(s) for v, s in table.items()}
        return np.array([lag[int(v)] for v in versions], dtype=np.float64)


@dataclass
class StageResult:
    rows: pa.Table
    dropped: dict[str, int] = field(default_factory=dict)
    """Rows removed, by reason; replayed rows removed go under `replayed`."""
    added: int = 0
    """Rows added that this step did not consume (marked `replayed`)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Numbers the trainer logs with the step (a later stage's value of a name wins)."""

    def ledger_counts(self) -> tuple[int, int, int]:
        """(used, stale, filtered) among the rows this step consumed, for the ledger:
        replayed rows are neither read nor used by this step."""
        used = self.rows.num_rows - replayed_count(self.rows)
        stale = self.dropped.get("stale", 0)
        filtered = sum(v for k, v in self.dropped.items() if k not in ("stale", REPLAYED))
        return used, stale, filtered


def replayed_mask(rows: pa.Table) -> np.ndarray:
    """True for rows a stage added from earlier steps (column `replayed`)."""
    if REPLAYED not in rows.column_names:
        return np.zeros(rows.num_rows, dtype=bool)
    return np.asarray(rows.column(REPLAYED).to_pylist(), dtype=bool)


def replayed_count(rows: pa.Table) -> int:
    return int(replayed_mask(rows).sum())


def drop_rows(rows: pa.Table, drop: Mapping[str, Sequence[bool] | np.ndarray]) -> StageResult:
    """Remove rows, counting each under the first reason whose mask marks it — or
    under `replayed` when the row is a replayed one (not consumed by this step, so
    not a ledger row). The way for any filter, built-in or yours, to stay exact
    when it runs after `replay`."""
    replayed = replayed_mask(rows)
    gone = np.zeros(rows.num_rows, dtype=bool)
    dropped: dict[str, int] = {}
    for reason, mask in drop.items():
        m = np.asarray(mask, dtype=bool) & ~gone
        dropped[reason] = int((m & ~replayed).sum())
        gone |= m
    if (gone & replayed).any():
        dropped[REPLAYED] = int((gone & replayed).sum())
    return StageResult(rows.filter(pa.array(~gone, pa.bool_())), dropped)


class Stage(Protocol):
    def __call__(self, rows: pa.Table, ctx: StageContext, **params: Any) -> StageResult: ...


def staleness(rows: pa.Table, ctx: StageContext, *, max_versions: int = 8) -> StageResult:
    """Drop rows generated by weights more than `max_versions` trained versions away
    from the trainer's, measured by lineage (`StageContext.row_staleness`), so a
    rollback's republished version does not make rows of the restored weights look
    stale. Rows whose lineage is unknown are dropped too: nothing bounds their lag.

    Within the bound, the importance ratio against the behaviour logprobs
    corrects for the policy lag; beyond it the correction is too noisy.
    """
    if max_versions < 0:
        raise ValueError("staleness.max_versions must be >= 0")
    lag = ctx.row_staleness(rows.column("behavior_version"))
    keep = ~np.isnan(lag) & (lag <= max_versions)
    return drop_rows(rows, {"stale": ~keep})


def _group_ids(rows: pa.Table) -> np.ndarray:
    _, inverse = np.unique(np.asarray(rows.column("group_id").to_pylist(), dtype=object).astype(str),
                           return_inverse=True)
    return inverse


def zero_variance_filter(rows: pa.Table, ctx: StageContext, *, min_size: int = 2,
                         keep_solved_at: float | None = None) -> StageResult:
    """Drop groups whose rewards are all equal (no learning signal: dynamic sampling),
    and groups with fewer than `min_size` members.

    `keep_solved_at`: a group whose rewards all equal at least this value (every sample
    solved the task) is kept. Its advantage is 0, so it adds no policy gradient, but it
    reaches the loss: it carries `algorithm.kl_coef`'s anchor on what the policy already
    does well, and it counts in the loss's token mean, so once most groups are solved an
    update is scaled down by the share of groups that still carry signal (as in TRL's
    GRPOTrainer, which keeps every group). Groups that all failed are still dropped:
    early in training they are most of the batch, and keeping them would only slow the
    start (docs/benchmarks/peers.md measures both)."""
    if rows.num_rows == 0:
        return StageResult(rows, {"zero_variance": 0})
    keep = _in_varied_groups(rows, min_size)
    if keep_solved_at is not None:
        keep |= _solved_groups(rows, keep_solved_at, min_size)
    return drop_rows(rows, {"zero_variance": ~keep})


def _solved_groups(rows: pa.Table, at: float, min_size: int = 2) -> np.ndarray:
    """Per row: its group has at least `min_size` rows and every reward in it is >= `at`."""
    g = _group_ids(rows)
    r = rows.column("reward").to_numpy().astype(np.float64)
    n = np.bincount(g)
    low = np.bincount(g, weights=(r < at).astype(np.float64))
    return (low[g] == 0) & (n[g] >= min_size)


def _in_varied_groups(rows: pa.Table, min_size: int = 2) -> np.ndarray:
    """Per row: its group has at least `min_size` rows whose rewards are not all equal."""
    g = _group_ids(rows)
    r = rows.column("reward").to_numpy().astype(np.float64)
    n = np.bincount(g)
    mean = np.bincount(g, weights=r) / n
    var = np.bincount(g, weights=(r - mean[g]) ** 2) / n
    return (var[g] > 1e-12) & (n[g] >= min_size)


def solved_share(rows: pa.Table, at: float, min_size: int = 2) -> float:
    """The share of `rows`' groups (of at least `min_size` rows) whose every reward is
    at least `at`: the tasks the policy already solves on every sample. The trainer
    reads it before the stages drop those groups (`algorithm.update_kl_solved_at`).
    At least one group counts as unsolved, so the share is below 1 whenever there is a
    group: a step whose every group is solved (kept by `keep_solved_at` for a KL
    anchor) still gets one group's share of the bound rather than none."""
    if rows.num_rows == 0:
        return 0.0
    g = _group_ids(rows)
    groups = int((np.bincount(g) >= min_size).sum())
    if groups == 0:
        return 0.0
    solved = len(np.unique(g[_solved_groups(rows, at, min_size)]))
    return min(solved, groups - 1) / groups


def signal_rows(rows: pa.Table) -> int:
    """Rows in groups whose rewards differ: the rows a group-relative advantage can
    learn from (what `zero_variance_filter` keeps). The trainer's batch fill
    (`algorithm.min_signal_rows`) counts these before it steps."""
    return int(_in_varied_groups(rows).sum()) if rows.num_rows else 0


def group_advantages(rows: pa.Table, ctx: StageContext, *, normalize_std: bool = True,
                     eps: float = 1e-6) -> StageResult:
    """GRPO advantages: reward minus its group's mean, divided by the group's std
    (population std, + eps). Groups are rows sharing `group_id` (one task's samples,
    plus any rows `replay` added to it). `normalize_std: false` is Dr. GRPO
    (`dr_grpo_advantages`)."""
    if rows.num_rows == 0:
        return StageResult(rows.append_column("advantage", pa.array([], pa.float32())))
    g = _group_ids(rows)
    r = rows.column("reward").to_numpy().astype(np.float64)
    n = np.bincount(g)
    mean = np.bincount(g, weights=r) / n
    adv = r - mean[g]
    if normalize_std:
        std = np.sqrt(np.bincount(g, weights=adv**2) / n)
        adv = adv / (std[g] + eps)
    if "advantage" in rows.column_names:
        rows = rows.drop_columns(["advantage"])
    return StageResult(rows.append_column("advantage", pa.array(adv.astype(np.float32))))


def run_stages(rows: pa.Table, ctx: StageContext, specs: list[tuple[str, dict[str, Any]]]) -> StageResult:
    """Apply stages in order, summing dropped counts by reason, and check that every
    stage accounts for every row: consumed rows it removed are in its `dropped`
    counts; replayed rows it removed are under `replayed`, those it added in `added`.
    The result's metrics hold the stages' own plus `rows_dropped_<reason>` and
    `rows_replayed` (replayed rows that reach the loss)."""
    dropped: dict[str, int] = {}
    metrics: dict[str, float] = {}
    added = 0
    for name, params in specs:
        consumed, replays = rows.num_rows - replayed_count(rows), replayed_count(rows)
        res = registry.resolve("stage", name)(rows, ctx, **params)
        rows = res.rows
        reported = sum(int(v) for k, v in res.dropped.items() if k != REPLAYED)
        removed = consumed - (rows.num_rows - replayed_count(rows))
        if removed != reported:
            raise RuntimeError(
                f"stage {name!r} removed {removed} rows but reported {reported}; a stage must "
                f"account for every row it drops" + (
                    " (replayed rows it drops go under 'replayed': use stages.drop_rows)"
                    if replays else ""))
        replay_gone = int(res.dropped.get(REPLAYED, 0))
        if replayed_count(rows) - replays != res.added - replay_gone:
            raise RuntimeError(
                f"stage {name!r}: replayed rows went from {replays} to {replayed_count(rows)} "
                f"but it reported {res.added} added and {replay_gone} dropped; rows a stage "
                f"adds must carry `{REPLAYED} = true` and be counted in StageResult.added")
        for k, v in res.dropped.items():
            dropped[k] = dropped.get(k, 0) + int(v)
        added += res.added
        metrics.update(res.metrics)
    for k, v in dropped.items():
        metrics[f"rows_dropped_{k}"] = float(v)
    if added:
        metrics["rows_replayed"] = float(replayed_count(rows))
    return StageResult(rows, dropped, added, metrics)
