"""Replay: mix earlier successful rows of the same prompt into this step's groups.

A group whose samples all failed has no learning signal (every advantage is 0). If
the policy solved the same prompt before, that success put back into today's group
gives it a baseline to beat (as RLEP, "Reinforcement Learning with Experience
rePlay", 2025, does). No buffer: the earlier rows are in the policy's table, and the
trainer passes a read-only view of the rows before this step's cursor range
(`StageContext.history`), so the stage stays a pure function and a redone step
replays the same rows. Nothing extra is checkpointed.

A replayed row carries `replayed = true` and is not counted again in the ledger; the
trainer logs those that reached the loss as `rows_replayed`. Its behaviour version
and logprobs are its own, so the loss's importance ratio corrects for the policy's drift.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from astraflow.data.stages import REPLAYED, StageContext, StageResult, _group_ids

_CREATED = "_row_created_at_version"  # the commit a row was created in (read_after adds it)
#: What a replayed row can carry: the trajectory table's columns (read from history).
_STORE_COLUMNS = frozenset({
    "traj_id", "group_id", "policy", "behavior_version", "prompt_ids", "completion_ids",
    "behavior_logprobs", "loss_mask", "reward", "env", "task_id", "worker", "region",
    "created_at", "extras", _CREATED})


def _sql_list(values: list[str]) -> str:
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


def replay(rows: pa.Table, ctx: StageContext, *, ratio: float = 0.25, min_reward: float = 1.0,
           max_per_group: int = 1, max_versions: int | None = 16) -> StageResult:
    """Add up to ⌊ratio × rows⌋ earlier rows with reward ≥ `min_reward` to the groups
    of this step whose prompt they answer (equal `prompt_ids`; looked up by
    `task_id`), at most `max_per_group` per group. A replayed row joins the group:
    it takes the group's `group_id`, so group advantages and filters see it.

    Which groups: those not already all successful, lowest mean reward first (an
    all-failed group gains the most); within a prompt, the newest earlier successes
    first (highest behaviour version, then latest commit), each used at most once
    per step. Deterministic for a given (rows, history, version).

    `max_versions`: only rows whose behaviour version is at most this many version
    numbers behind the trainer's (None: any age). By number, not by lineage: the
    trainer's lineage map covers only the versions of the rows it read this step.
    After a rollback version numbers run ahead of lineage depth, so the bound is
    conservative for live lineages; it does not exclude a dead branch's rows, which
    the importance ratio then corrects like any stale row.

    Chain it after `staleness` (whose bound it does not apply) and before stages that
    add columns (advantages, `length_norm`): a replayed row has only the table's
    columns. Needs the trainer's history (StageContext.history).
    """
    if not 0 <= ratio <= 10:
        raise ValueError(f"replay.ratio must be in [0, 10], got {ratio}")
    if max_per_group < 1:
        raise ValueError(f"replay.max_per_group must be >= 1, got {max_per_group}")
    if ctx.history is None:
        raise ValueError("the replay stage reads earlier rows from the trainer's trajectory "
                         "table (StageContext.history); this context has none")
    if REPLAYED in rows.column_names:
        raise ValueError("replay runs once per stage chain (these rows are already mixed)")
    foreign = [c for c in rows.column_names if c not in _STORE_COLUMNS]
    if foreign:
        raise ValueError(f"replay: the rows carry {foreign}, which a replayed row cannot have; "
                         f"chain replay before the stages that add those columns")
    for col in ("group_id", "reward", "prompt_ids", "task_id"):
        if col not in rows.column_names:
            raise ValueError(f"replay needs the rows' {col!r} column")
    budget = math.floor(ratio * rows.num_rows)
    mixed = rows.append_column(REPLAYED, pa.array(np.zeros(rows.num_rows, dtype=bool)))
    none = StageResult(mixed, metrics={"replay_candidates": 0.0})
    if budget == 0 or rows.num_rows == 0:
        return none

    g = _group_ids(rows)
    reward = rows.column("reward").to_numpy().astype(np.float64)
    prompts = rows.column("prompt_ids").to_pylist()
    group_ids = rows.column("group_id").to_pylist()
    tasks = rows.column("task_id").to_pylist()
    members: dict[int, list[int]] = defaultdict(list)
    for i, k in enumerate(g):
        members[int(k)].append(i)
    wanted = []  # (mean reward, group_id, group index): groups a success would help
    for k, idx in members.items():
        if len({tuple(prompts[i]) for i in idx}) != 1:
            continue  # a group over several prompts (e.g. verifiers' views): no one answer fits
        if all(reward[i] >= min_reward for i in idx):
            continue
        wanted.append((float(reward[idx].mean()), str(group_ids[idx[0]]), k))
    wanted.sort()
    if not wanted:
        return none

    where = [f"reward >= {float(min_reward)!r}",
             f"task_id IN ({_sql_list(sorted({tasks[i] for _, _, k in wanted for i in members[k]}))})"]
    if max_versions is not None:
        where.append(f"behavior_version >= {int(ctx.version) - int(max_versions)}")
    hist = ctx.history(columns=[c for c in rows.column_names if c != _CREATED],
                       where=" AND ".join(where))
    if hist.num_rows == 0:
        return none
    created = (hist.column(_CREATED).to_numpy() if _CREATED in hist.column_names
               else np.zeros(hist.num_rows, dtype=np.int64))
    order = np.lexsort((np.arange(hist.num_rows), -created,
                        -hist.column("behavior_version").to_numpy()))
    pool: dict[tuple[int, ...], list[int]] = defaultdict(list)  # prompt → history rows, best first
    hist_prompts = hist.column("prompt_ids").to_pylist()
    for j in order:
        pool[tuple(hist_prompts[j])].append(int(j))

    taken: list[int] = []
    targets: list[str] = []
    used: dict[tuple[int, ...], int] = defaultdict(int)
    for _ in range(max_per_group):
        for _, gid, k in wanted:
            if len(taken) == budget:
                break
            key = tuple(prompts[members[k][0]])
            if used[key] < len(pool[key]):
                taken.append(pool[key][used[key]])
                targets.append(gid)
                used[key] += 1
    metrics = {"replay_candidates": float(hist.num_rows)}
    if not taken:
        return StageResult(mixed, metrics=metrics)
    extra = hist.take(pa.array(taken)).select(rows.column_names)
    extra = extra.set_column(extra.column_names.index("group_id"), "group_id",
                             pa.array(targets, rows.schema.field("group_id").type))
    extra = extra.cast(rows.schema).append_column(REPLAYED, pa.array(np.ones(len(taken), bool)))
    out = pa.concat_tables([mixed, extra])
    metrics["replay_version_lag_mean"] = float(
        ctx.version - pc.mean(extra.column("behavior_version")).as_py())
    return StageResult(out, added=len(taken), metrics=metrics)
