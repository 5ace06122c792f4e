"""soak.py with the pieces of the consumer's `read_after` timed: where read-next-batch time goes
as the table ages (how issue 14's growing read latency was traced).

    python benchmarks/soak_profile.py [--profile-out reads.jsonl] [soak.py's flags]

Runs `soak.main()` with timers wrapped around the store's and Lance's calls inside
`TrajectoryStore.read_after` (inclusive wall seconds per piece: listing markers, opening the
newest version, loading markers, the commit, deleting markers, per-fragment metadata, the
scan) and writes one JSON line per read that returned rows; at the end it prints the medians
of each piece for each sixth of the reads. Wrapping costs a few microseconds per call, and
it patches Lance's Python classes, so it is a diagnostic, not the benchmark.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

PIECES = ["total", "pending", "commit_pending", "latest_dataset", "load", "get_fragments",
          "frag.metadata", "row_runs", "ds.commit", "delete_many", "scan_after",
          "scanner.to_table"]


def main() -> None:
    import soak
    from lance import LanceDataset
    from lance.dataset import LanceScanner
    from lance.fragment import LanceFragment

    from astraflow.stores import _lance, staging, trajectories
    from astraflow.stores.objects import ObjectStore

    out_path = "soak_profile.jsonl"
    if "--profile-out" in sys.argv:
        i = sys.argv.index("--profile-out")
        out_path = sys.argv[i + 1]
        del sys.argv[i:i + 2]
    acc: dict[str, float] = {}
    cnt: dict[str, int] = {}
    on = [False]

    def timed(name, fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            if not on[0]:
                return fn(*a, **k)
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                acc[name] = acc.get(name, 0.0) + time.perf_counter() - t
                cnt[name] = cnt.get(name, 0) + 1
        return wrapper

    staging.Staging.pending = timed("pending", staging.Staging.pending)
    staging.Staging.load = timed("load", staging.Staging.load)
    staging.Staging.commit_pending = timed("commit_pending", staging.Staging.commit_pending)
    ObjectStore.delete_many = timed("delete_many", ObjectStore.delete_many)
    _lance.latest_dataset = timed("latest_dataset", _lance.latest_dataset)
    _lance.scan_after = timed("scan_after", _lance.scan_after)
    _lance.row_runs = timed("row_runs", _lance.row_runs)
    LanceDataset.commit = staticmethod(timed("ds.commit", LanceDataset.commit))
    LanceDataset.get_fragments = timed("get_fragments", LanceDataset.get_fragments)
    LanceScanner.to_table = timed("scanner.to_table", LanceScanner.to_table)
    LanceFragment.metadata = property(timed("frag.metadata", LanceFragment.metadata.fget))
    read_after = trajectories.TrajectoryStore.read_after
    recs: list[dict] = []

    with open(out_path, "w") as out:
        def profiled(self, policy, cursor, **kw):
            acc.clear()
            cnt.clear()
            on[0] = True
            t = time.perf_counter()
            try:
                sl = read_after(self, policy, cursor, **kw)
            finally:
                on[0] = False
            if sl is not None:
                rec = {"time": time.time(), "cursor": cursor, "end": sl.end, "rows": sl.num_rows,
                       "total": time.perf_counter() - t, **acc,
                       **{f"n_{k}": v for k, v in cnt.items()}}
                recs.append(rec)
                out.write(json.dumps(rec) + "\n")
                out.flush()
            return sl

        trajectories.TrajectoryStore.read_after = profiled
        try:
            soak.main()
        finally:
            summary(recs)


def summary(recs: list[dict]) -> None:
    if len(recs) < 6:
        return
    print("\nmedian ms per read, by sixth of the reads (calls of row_runs: fragments parsed)")
    print(f"{'sixth':>5} {'reads':>5} " + " ".join(f"{k[:12]:>12}" for k in PIECES)
          + f" {'row_runs n':>10}")
    n = len(recs)
    for i in range(6):
        part = recs[i * n // 6:(i + 1) * n // 6]
        med = [np.median([r.get(k, 0.0) for r in part]) * 1000 for k in PIECES]
        calls = np.median([r.get("n_row_runs", 0) for r in part])
        print(f"{i + 1:>5} {len(part):>5} " + " ".join(f"{m:>12.1f}" for m in med)
              + f" {calls:>10.0f}")


if __name__ == "__main__":
    main()
