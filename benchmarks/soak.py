"""Soak: a simulated day of appends; read-next-batch cost and table size must stay flat.

    python benchmarks/soak.py [--commits 100000] [--writers 4] [--rows 4] [--max-minutes 40]

`--writers` processes append `--commits` batches of `--rows` rows in total (each
append commits its batch, or stages it when it loses the manifest race:
`stores.staging`), as fast as they can: a day of a busy run compressed into minutes. Meanwhile this process plays
the trainer: it reads the next batch after its cursor (`read_after`, which also
commits what is staged), records a ledger step for it, and runs maintenance
(`TrajectoryStore.maintain`: compaction + old-version cleanup) every
`--maintain-every` seconds with `--retain` seconds of retention (standing in for
the 10 minutes of a real run). For each 1/24 of the run ("hour") it prints the
read-next-batch latency (p50/p99), the CPU seconds this process spent in it (p50: the
work, which a busy shared machine does not inflate the way it inflates latency), and
the table's fragments, versions and newest manifest's size (KB). Maintenance also
retires the rows behind the trainer's cursor to the policy's archive table
(`TrajectoryStore.retire`, as the launcher does with `store.retire_consumed`);
`--no-retire` keeps every row in the live table, as before that existed.
At the end `astraflow audit` checks the run: every row consumed exactly once.
The machine this ran on was shared; compare the hours with each other.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import get_args

import numpy as np

from astraflow.config.loader import load_flow
from astraflow.local.launcher import prepare_run
from astraflow.stores import LedgerEntry, Progress
from astraflow.stores.trajectories import WriteMode


def manifest_kb(ds) -> str:
    """Size of the table's newest manifest (a local store), which every commit writes and
    every read of a new version parses: Lance keeps each row's creating commit in it."""
    try:
        newest = max((Path(ds.uri) / "_versions").glob("*.manifest"),
                     key=lambda p: p.stat().st_mtime)
        return f"{newest.stat().st_size / 1024:.0f}"
    except (OSError, ValueError):  # removed by a cleanup meanwhile, or a remote store
        return "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flow", default="examples/math.yaml")
    ap.add_argument("--root", default="runs/bench")
    ap.add_argument("--commits", type=int, default=100_000, help="appends, all writers")
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--rows", type=int, default=4, help="rows per append")
    ap.add_argument("--read-rows", type=int, default=64, help="rows per trainer step")
    ap.add_argument("--maintain-every", type=float, default=20.0)
    ap.add_argument("--retain", type=float, default=10.0, help="seconds of versions kept")
    ap.add_argument("--max-minutes", type=float, default=40.0, help="stop the writers then")
    ap.add_argument("--backlog", type=int, default=512,
                    help="rows not yet read at which writers wait, as rollout workers do at "
                         "rollout.max_backlog_batches (0: no bound, an overload test)")
    ap.add_argument("--write-mode", default="auto", choices=get_args(WriteMode),
                    help="store.write_mode of the writers: auto (a local flow's default) commits a "
                         "writer's own batch when it wins the race, so the appends are mostly "
                         "commits: the day of table versions this soak is about; staged "
                         "commits many batches per read")
    ap.add_argument("--no-retire", action="store_true",
                    help="keep consumed rows in the live table (no `retire` in maintenance)")
    args = ap.parse_args()

    flow = load_flow(args.flow, {"name": "bench-soak", "store.write_mode": args.write_mode})
    ctx = prepare_run(flow, Path(args.root), overwrite=True)
    run, pol = ctx.run_dir, ctx.flow.policy.name
    traj, ledger = ctx.trajectories(), ctx.ledger()
    traj.table(pol)
    here = str(Path(__file__).resolve().parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    per = args.commits // args.writers
    procs = [subprocess.Popen([sys.executable, "-c", "from store_actors import store_writer; "
                               f"store_writer({str(run)!r}, {pol!r}, 'w{i}', {args.rows}, "
                               f"{str(run / 'acks')!r}, batches={per}, pause_s=0, "
                               f"max_backlog_rows={args.backlog or None})"], env=env)
             for i in range(args.writers)]
    total = per * args.writers * args.rows
    hour_rows = max(total // 24, 1)
    print(f"soak: {per * args.writers:,} appends of {args.rows} rows by {args.writers} writer "
          f"processes; trainer reads {args.read_rows} rows per step; maintenance every "
          f"{args.maintain_every:g}s keeping {args.retain:g}s of versions; writers wait at "
          f"{args.backlog or 'no'} unread rows; consumed rows "
          f"{'kept in the live table' if args.no_retire else 'retired'}")
    print(f"{'hour':>4} {'rows':>9} {'t s':>6} {'read p50 ms':>11} {'read p99 ms':>11} "
          f"{'cpu p50 ms':>10} {'fragments':>9} {'versions':>8} {'manifest KB':>11} "
          f"{'live rows':>9} {'staged':>6} {'maint s':>7}")
    try:
        t0 = last_maint = time.time()
        step = cursor = consumed = 0
        lat: list[float] = []
        cpu: list[float] = []
        maint_s = 0.0
        hour = 0
        stop_at = t0 + 60 * args.max_minutes
        while True:
            writing = any(p.poll() is None for p in procs)
            if writing and time.time() > stop_at:
                for p in procs:
                    p.kill()
                writing = False
            r0, c0 = time.perf_counter(), time.process_time()
            sl = traj.read_after(pol, cursor, min_rows=args.read_rows, max_rows=args.read_rows,
                                 columns=["traj_id", "behavior_version", "reward"])
            if sl is None and not writing:
                sl = traj.read_after(pol, cursor, min_rows=1)
                if sl is None and traj.pending(pol) == 0:
                    break
            if sl is None:
                time.sleep(0.02)
                continue
            lat.append(time.perf_counter() - r0)
            cpu.append(time.process_time() - c0)
            ledger.record(LedgerEntry(policy=pol, step=step, cursor_start=sl.start, cursor_end=sl.end,
                                      rows_read=sl.num_rows, rows_used=sl.num_rows, rows_stale=0,
                                      rows_filtered=0, optimizer_step=True, weight_version=0))
            step, cursor, consumed = step + 1, sl.end, consumed + sl.num_rows
            ledger.write_progress(Progress(pol, step - 1, cursor, consumed, 0, time.time()))
            if time.time() - last_maint > args.maintain_every:
                m0 = time.time()
                try:  # best effort, as the launcher's maintenance is: a lost race skips a round
                    traj.maintain(pol, retain=timedelta(seconds=args.retain),
                                  retire_upto=None if args.no_retire else cursor)
                    ctx.ledger().maintain()
                except OSError as err:
                    print(f"maintenance skipped: {err}", flush=True)
                maint_s, last_maint = time.time() - m0, time.time()
            if consumed >= (hour + 1) * hour_rows:
                hour += 1
                ds = traj.table(pol).to_lance()
                ms = np.array(lat) * 1000
                print(f"{hour:>4} {consumed:>9,} {time.time() - t0:>6.0f} {np.percentile(ms, 50):>11.1f} "
                      f"{np.percentile(ms, 99):>11.1f} {np.percentile(cpu, 50) * 1000:>10.1f} "
                      f"{len(ds.get_fragments()):>9} "
                      f"{len(ds.versions()):>8} {manifest_kb(ds):>11} {ds.count_rows():>9,} "
                      f"{traj.pending(pol):>6} {maint_s:>7.1f}", flush=True)
                lat, cpu = [], []
    finally:  # the trainer's side failed or finished: no writer outlives the benchmark
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    appends = sum(1 for _ in (run / "acks").open()) if (run / "acks").exists() else 0
    a = subprocess.run([sys.executable, "-m", "astraflow", "audit", str(run), "--json"],
                       capture_output=True, text=True, timeout=1200)
    rep = (json.loads(a.stdout).get("policies", {}).get(pol, {})
           if a.stdout.strip().startswith("{") else {})
    print(f"appends acknowledged {appends:,} (wanted {per * args.writers:,}), table versions "
          f"made {traj.latest_version(pol):,}, rows consumed {consumed:,} in {step:,} steps, "
          f"{time.time() - t0:.0f}s")
    print(f"audit: exit {a.returncode}, rows {rep.get('rows_in_table')}, trained "
          f"{rep.get('rows_trained')}, staged {rep.get('rows_staged')}, "
          f"duplicate rows {rep.get('duplicate_rows')}, "
          f"violations {rep.get('violations')}")
    sys.exit(a.returncode)


if __name__ == "__main__":
    main()
