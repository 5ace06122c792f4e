"""Append throughput of the trajectory store against plain Parquet files.

    python benchmarks/store.py [--appends 400] [--rows 64]

For 1 and 4 concurrent writer processes, each appending `--appends` batches of
`--rows` trajectory rows, prints rows/s into LanceDB (one commit per batch,
retried on conflicts) and into one Parquet file per batch (no coordination at
all: the floor any store pays), their ratio, and verifies that with 4 writers
no row was lost or duplicated. Absolute rates depend on the machine; the ratio
is the claim.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq


def batch(policy: str, rows: int, tag: str, i: int):
    from astraflow.stores.schema import to_table

    now = datetime.now(UTC)
    return to_table([
        {"traj_id": f"{tag}-{i}-{j}-{uuid.uuid4().hex[:6]}", "group_id": f"{tag}-{i}-{j // 8}",
         "policy": policy, "behavior_version": i, "prompt_ids": list(range(9)),
         "completion_ids": [5, 6, 7, 2], "behavior_logprobs": [-0.1, -0.2, -0.3, -0.4],
         "loss_mask": [1, 1, 1, 1], "reward": float(j % 2), "env": "math", "task_id": f"t{j}",
         "worker": tag, "region": "local", "created_at": now, "extras": "{}"}
        for j in range(rows)
    ])


def lance_writer(uri: str, tag: str, appends: int, rows: int, start, out) -> None:
    from astraflow.stores import TrajectoryStore

    store = TrajectoryStore(uri)
    batches = [batch("p", rows, tag, i) for i in range(appends)]
    start.wait()
    t0 = time.perf_counter()
    for b in batches:
        store.append("p", b)
    out.put(time.perf_counter() - t0)


def parquet_writer(root: str, tag: str, appends: int, rows: int, start, out) -> None:
    batches = [batch("p", rows, tag, i) for i in range(appends)]
    Path(root).mkdir(parents=True, exist_ok=True)
    start.wait()
    t0 = time.perf_counter()
    for i, b in enumerate(batches):
        pq.write_table(b, f"{root}/{tag}-{i:06d}.parquet")
    out.put(time.perf_counter() - t0)


def measure(target, path: str, writers: int, appends: int, rows: int) -> float:
    """Rows per second over the slowest writer's wall time (all start together)."""
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(path, f"w{i}", appends, rows, start, out))
             for i in range(writers)]
    for p in procs:
        p.start()
    time.sleep(3.0)  # let every process import and build its batches
    start.set()
    times = [out.get(timeout=900) for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode != 0:
            sys.exit(f"a writer failed with exit code {p.exitcode}")
    return writers * appends * rows / max(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--appends", type=int, default=400, help="batches per writer")
    ap.add_argument("--rows", type=int, default=64, help="rows per batch")
    args = ap.parse_args()
    from astraflow.stores import TrajectoryStore

    print(f"store benchmark: {args.appends} appends × {args.rows} rows per writer")
    print(f"{'writers':>8} {'lance rows/s':>14} {'parquet rows/s':>15} {'ratio':>7}")
    ok = True
    for writers in (1, 4):
        with tempfile.TemporaryDirectory() as tmp:
            uri = f"{tmp}/lance"
            TrajectoryStore(uri).table("p")  # created once, before the writers race
            lance = measure(lance_writer, uri, writers, args.appends, args.rows)
            parquet = measure(parquet_writer, f"{tmp}/parquet", writers, args.appends, args.rows)
            print(f"{writers:>8} {lance:>14,.0f} {parquet:>15,.0f} {lance / parquet:>7.2f}")
            if writers == 4:
                store = TrajectoryStore(uri)
                ids = store.read_range("p", 0, 10**12, columns=["traj_id"]).column("traj_id").to_pylist()
                expected = writers * args.appends * args.rows
                lost, dup = expected - len(set(ids)), len(ids) - len(set(ids))
                print(f"4 writers × {args.appends} appends: {len(ids):,} rows read back, "
                      f"{expected:,} written, lost {lost}, duplicated {dup}")
                ok = lost == 0 and dup == 0
    print("ratio = LanceDB append throughput / Parquet-file throughput (same batches, same run)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
