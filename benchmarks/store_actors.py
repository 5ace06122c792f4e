"""The store traffic of a rollout worker and of a trainer, without models (benchmarks/chaos.py
--writers): light processes that import only the store, so 17 of them fit on a laptop."""

from __future__ import annotations

import random
import time
from pathlib import Path

from astraflow.context import RunContext


def store_writer(run: str, policy: str, tag: str, rows: int, acks: str,
                 batches: int = 10**9, pause_s: float = 0.2,
                 max_backlog_rows: int | None = None) -> None:
    """A rollout worker's store traffic without the model: append `batches` batches
    (or until killed), pausing up to `pause_s` between them. `max_backlog_rows`: wait,
    as a rollout worker does (`rollout.max_backlog_batches`), while the table holds
    that many rows the consumer has not read (its progress file says what it read)."""
    from datetime import UTC, datetime

    ctx = RunContext.open(Path(run))
    traj, ledger = ctx.trajectories(), ctx.ledger()
    with open(acks, "a") as log:
        for i in range(batches):
            while max_backlog_rows is not None:
                progress = ledger.progress(policy)
                done = progress.rows_consumed if progress else 0
                if traj.count(policy) - done < max_backlog_rows:
                    break
                time.sleep(0.01)
            now = datetime.now(UTC)
            traj.append(policy, [
                {"traj_id": f"{tag}-{i}-{j}", "group_id": f"{tag}-{i}-{j // 8}", "policy": policy,
                 "behavior_version": 0, "prompt_ids": list(range(9)), "completion_ids": [5, 6, 2],
                 "behavior_logprobs": [-0.1] * 3, "loss_mask": [1] * 3, "reward": float(j % 2),
                 "env": "math", "task_id": f"t{j}", "worker": tag, "region": "local",
                 "created_at": now, "extras": "{}"} for j in range(rows)])
            log.write(f"{tag}-{i}\n")
            log.flush()
            if pause_s:
                time.sleep(random.uniform(0.0, pause_s))


def store_consumer(run: str, policy: str, batch: int, stop_file: str) -> None:
    """A trainer's store traffic without the model: consume from the ledger's cursor,
    record a ledger step per batch (its reads commit staged batches: it is their only
    committer), until `stop_file` exists and nothing is left."""
    from astraflow.stores import LedgerEntry

    ctx = RunContext.open(Path(run))
    traj, ledger = ctx.trajectories(), ctx.ledger()
    last = ledger.last_entry(policy)
    step, cursor = (0, 0) if last is None else (last.step + 1, last.cursor_end)
    while True:
        sl = traj.read_after(policy, cursor, min_rows=batch, max_rows=batch, columns=["traj_id"])
        if sl is None:
            if Path(stop_file).exists():
                sl = traj.read_after(policy, cursor, min_rows=1, columns=["traj_id"])
                if sl is None and traj.pending(policy) == 0:
                    return
            if sl is None:
                time.sleep(0.05)
                continue
        ledger.record(LedgerEntry(policy=policy, step=step, cursor_start=sl.start,
                                  cursor_end=sl.end, rows_read=sl.num_rows, rows_used=sl.num_rows,
                                  rows_stale=0, rows_filtered=0, optimizer_step=True,
                                  weight_version=0))
        step, cursor = step + 1, sl.end
