"""Read-next-batch on an aged table against a new one: does its cost grow with history?

    python benchmarks/read_next.py runs/bench/bench-soak/store [--policy solver] [--reads 20]

Copies the policy's trajectory table from the given store (after `benchmarks/soak.py`: a
table with tens of thousands of commits, compacted) into a temporary folder, and makes a
new table beside it. On each, one process appends 16 commits of 4 rows, then times the
consumer's `read_after` of those 64 rows (wall and this process's CPU ms), `--reads`
times, and prints the medians. No writer processes and no maintenance: what differs
between the two tables is only their history, so a busy shared machine disturbs this
far less than the soak's per-hour latencies.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from astraflow.stores import TrajectoryStore
from astraflow.stores.trajectories import table_name


def rows(policy: str, tag: str) -> list[dict]:
    now = datetime.now(UTC)
    return [{"traj_id": f"{tag}-{j}", "group_id": tag, "policy": policy, "behavior_version": 0,
             "prompt_ids": list(range(9)), "completion_ids": [5, 6, 2],
             "behavior_logprobs": [-0.1] * 3, "loss_mask": [1] * 3, "reward": float(j % 2),
             "env": "math", "task_id": f"t{j}", "worker": "bench", "region": "local",
             "created_at": now, "extras": "{}"} for j in range(4)]


def measure(uri: Path, policy: str, reads: int) -> str:
    store = TrajectoryStore(uri)
    cursor = store.latest_version(policy)
    store.read_after(policy, 0, min_rows=2**62)  # a consumer's first read: nothing new
    wall, cpu = [], []
    for r in range(reads):
        for i in range(16):
            store.append(policy, rows(policy, f"bench-{r}-{i}"))
        t, c = time.perf_counter(), time.process_time()
        sl = store.read_after(policy, cursor, min_rows=64, max_rows=64,
                              columns=["traj_id", "behavior_version", "reward"])
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        assert sl is not None and sl.num_rows == 64, "the 64 rows just appended"
        cursor = sl.end
    ds = store.table(policy).to_lance()
    return (f"{ds.count_rows():>9,} rows {ds.version:>7,} versions {len(ds.get_fragments()):>5} "
            f"fragments: read 64 rows p50 {np.median(wall) * 1000:6.1f} ms wall, "
            f"{np.median(cpu) * 1000:6.1f} ms CPU")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("store", help="a local store folder holding the aged table")
    ap.add_argument("--policy", default="solver")
    ap.add_argument("--reads", type=int, default=20)
    args = ap.parse_args()
    src = Path(args.store) / f"{table_name(args.policy)}.lance"
    with tempfile.TemporaryDirectory() as tmp:
        aged, new = Path(tmp) / "aged", Path(tmp) / "new"
        shutil.copytree(src, aged / src.name)
        print(f"new table: {measure(new, args.policy, args.reads)}")
        print(f"aged copy: {measure(aged, args.policy, args.reads)}")


if __name__ == "__main__":
    main()
