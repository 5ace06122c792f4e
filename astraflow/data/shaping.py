"""Stages that shape what a row teaches: reward shaping, group filters, advantages
without std, and the loss's length normalisation. Each is a pure function of the
rows (and the context), like every stage (astraflow/data/stages.py).
"""

from __future__ import annotations

import json
from typing import Literal

import numpy as np
import pyarrow as pa

from astraflow.data.stages import (
    LOSS_WEIGHT,
    StageContext,
    StageResult,
    _group_ids,
    drop_rows,
    group_advantages,
)


def _set_column(rows: pa.Table, name: str, values: pa.Array) -> pa.Table:
    if name in rows.column_names:
        return rows.set_column(rows.column_names.index(name), name, values)
    return rows.append_column(name, values)


def _policy_tokens(rows: pa.Table) -> np.ndarray:
    """Per row, the completion tokens the policy wrote (loss mask 1): tool output and
    other masked tokens are not the policy's length."""
    return np.array([int(sum(m)) for m in rows.column("loss_mask").to_pylist()], dtype=np.int64)


def dr_grpo_advantages(rows: pa.Table, ctx: StageContext) -> StageResult:
    """Dr. GRPO advantages (Liu et al. 2025, "Understanding R1-Zero-Like Training"):
    reward minus the group's mean, *not* divided by the group's std.

    Dividing by the std weights a group by how little its rewards differ: a task
    almost always solved (7 of 8) gets the same ±1-scale push as a 50/50 one, so easy
    and hard questions are over-weighted against the rest. Without it advantages keep
    the reward's scale and sum to zero per group.

    The paper's other change is the loss aggregation: GRPO's per-sequence 1/|o|
    favours short wrong answers and long right ones. Here the default loss is the
    token mean over the update's tokens (no per-sequence 1/|o|), which the paper's
    correction keeps; `length_norm` makes that choice explicit in the flow.
    """
    return group_advantages(rows, ctx, normalize_std=False)


def length_norm(rows: pa.Table, ctx: StageContext, *,
                mode: Literal["token_mean", "sequence_mean"] = "token_mean") -> StageResult:
    """The loss's length normalisation, as a per-row `loss_weight` column.

    The policy loss is a weighted token mean: Σ w·m·ℓ / Σ w·m over each update's
    tokens (m: loss mask, ℓ: a token's clipped objective, w: its row's weight).

      * `token_mean` (w = 1, what the loss does when no stage sets a weight): every
        token counts alike, so a long answer moves the policy more than a short one
        (DAPO, Dr. GRPO).
      * `sequence_mean` (w = 1/n, n = the row's unmasked tokens): the loss is the mean
        over rows of each row's own token mean (the original GRPO), so every answer
        counts alike, whatever its length. Rows with no unmasked token get w = 0.

    Why a column and not a loss setting: the normaliser is Σ w·m of whichever rows an
    update holds, so the result is exact for any minibatch or micro-batch cut (and
    across data-parallel ranks that sum it); a weight computed from batch-wide counts
    would not be. A weight already present (another stage's) is multiplied, so
    weighting stages compose. A constant normaliser (Dr. GRPO's Σ ℓ / (rows · L_max))
    is not a weighted mean and cannot be written this way; the token mean is the
    nearest it gets, and keeps the same unbiasedness across lengths within a batch.

    Put it after the advantage stage: the weight belongs to the rows that reach the loss.
    """
    if mode not in ("token_mean", "sequence_mean"):
        raise ValueError(f"length_norm.mode must be 'token_mean' or 'sequence_mean', got {mode!r}")
    n = _policy_tokens(rows).astype(np.float64)
    if mode == "token_mean":
        w = np.ones(rows.num_rows)
    else:
        w = np.divide(1.0, n, out=np.zeros_like(n), where=n > 0)
    if LOSS_WEIGHT in rows.column_names:
        w = w * np.asarray(rows.column(LOSS_WEIGHT).to_pylist(), dtype=np.float64)
    return StageResult(_set_column(rows, LOSS_WEIGHT, pa.array(w.astype(np.float32))))


def _finish_reasons(rows: pa.Table) -> list[str]:
    if "extras" not in rows.column_names:
        raise ValueError("overlength_penalty without max_tokens reads finish_reason from the rows' "
                         "`extras` column, which these rows lack")
    out = []
    for i, raw in enumerate(rows.column("extras").to_pylist()):
        reason = json.loads(raw or "{}").get("finish_reason")
        if reason is None:
            raise ValueError(
                f"overlength_penalty: row {i} has no finish_reason in its extras (a writer other "
                f"than the rollout worker?); give max_tokens to penalise by length instead")
        out.append(str(reason))
    return out


def overlength_penalty(rows: pa.Table, ctx: StageContext, *, penalty: float = 1.0,
                       max_tokens: int | None = None, buffer_tokens: int = 0) -> StageResult:
    """Lower the reward of answers that ran too long; run it before the advantage stage.

    Without `max_tokens`: a row whose extras say `finish_reason: length` (cut at
    `rollout.max_new_tokens`, or an episode's context limit) gets `reward − penalty`.
    A truncated answer is often scored as simply wrong, which teaches nothing about
    *why*; the penalty says "too long" to the policy directly.

    With `max_tokens` (L) and `buffer_tokens` (B): DAPO's soft over-long punishment on
    the tokens the policy wrote (n, loss mask 1): nothing up to L − B, then linearly
    more to −penalty at L, and −penalty beyond L. A length limit, not the finish
    reason, so it works for rows of any writer and for limits below the engine's.

    Metrics: `rows_overlong` (rows penalised) and `overlength_penalty_mean` (over all rows).
    """
    if penalty < 0:
        raise ValueError(f"overlength_penalty.penalty must be >= 0, got {penalty}")
    if max_tokens is None:
        cut = np.array([r == "length" for r in _finish_reasons(rows)], dtype=bool)
        shaping = np.where(cut, -penalty, 0.0)
    else:
        if max_tokens < 1 or not 0 <= buffer_tokens < max_tokens:
            raise ValueError(f"overlength_penalty: need max_tokens >= 1 and 0 <= buffer_tokens < "
                             f"max_tokens, got {max_tokens}, {buffer_tokens}")
        n = _policy_tokens(rows).astype(np.float64)
        soft = max_tokens - buffer_tokens
        ramp = (soft - n) / buffer_tokens if buffer_tokens else np.zeros_like(n)
        shaping = penalty * np.where(n <= soft, 0.0, np.where(n <= max_tokens, ramp, -1.0))
    reward = rows.column("reward").to_numpy().astype(np.float64) + shaping
    out = _set_column(rows, "reward", pa.array(reward.astype(np.float32)))
    return StageResult(out, metrics={
        "rows_overlong": float((shaping < 0).sum()),
        "overlength_penalty_mean": float(shaping.mean()) if shaping.size else 0.0})


def solved_filter(rows: pa.Table, ctx: StageContext, *, success: float = 1.0,
                  max_rate: float = 1.0, min_rate: float | None = None) -> StageResult:
    """Drop the groups of tasks the policy has solved (or cannot solve at all).

    A sample succeeds when its reward ≥ `success`; a group's solve rate is the share
    of its rows that succeed. Groups at a rate ≥ `max_rate` are dropped as `solved`
    (default 1.0: every sample right; lower it, e.g. 0.875, to also skip tasks the
    policy nearly always gets), groups at a rate ≤ `min_rate` as `unsolved` (default:
    kept). Counted in the ledger as filtered rows and in the metrics by reason
    (`rows_dropped_solved`, `rows_dropped_unsolved`).

    Unlike `zero_variance_filter` it reads the rate of *success*, not reward
    equality: with partial credit a group of all 0.5 is neither solved nor
    (by default) dropped, and "nearly solved" is expressible. Put it after
    `replay`, so a failed group that replay gave a success is no longer unsolved.
    """
    if not 0 < max_rate <= 1 or (min_rate is not None and not 0 <= min_rate < max_rate):
        raise ValueError(f"solved_filter: need 0 < max_rate <= 1 and 0 <= min_rate < max_rate, "
                         f"got max_rate={max_rate}, min_rate={min_rate}")
    if rows.num_rows == 0:
        return StageResult(rows, {"solved": 0})
    g = _group_ids(rows)
    ok = rows.column("reward").to_numpy().astype(np.float64) >= success
    rate = np.bincount(g, weights=ok) / np.bincount(g)
    drop = {"solved": rate[g] >= max_rate - 1e-12}
    if min_rate is not None:
        drop["unsolved"] = rate[g] <= min_rate + 1e-12
    res = drop_rows(rows, drop)
    res.metrics = {"groups_solved": float((rate >= max_rate - 1e-12).sum())}
    return res
