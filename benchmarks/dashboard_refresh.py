"""CPU per dashboard refresh, replayed on a copy of a run: no run noise blurs it.

    python benchmarks/dashboard_refresh.py RUN [--steps 35] [--cycles 6] [--metrics-every 7] [--profile]

`--profile` clocks cProfile with process CPU time, so the Lance reader threads' work
counts against the call waiting for it.

Copies RUN (a finished run folder, e.g. runs/bench/bench-dashboard left by
benchmarks/dashboard.py) to a temporary folder, opens the dashboard's State on it,
then replays a live run: per cycle, `--steps` trainer steps' worth of commits to the
run's first policy (per step one trajectory commit of 32 rows and a trainer and a
rollout+worker metrics row set, committed every `--metrics-every` steps: 7 is one commit
a second each, as `store.metrics_every_s: 1` gives at the math flow's 7 steps/s; 1 is
one per step, as before it; 35 steps = 5 s of the benchmark's run, one default
`--refresh`), then one State.get(since)
as the page sends it. Prints the process CPU per refresh (store read, curves, JSON)
and per fragment read, and per "unchanged" poll. CPU time, not wall time: on a
loaded machine it is what the dashboard takes from others. Load still inflates it
(seen: +20-50% with a load average of 8-15 on 2 cores), so compare runs made in the
same conditions.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from astraflow.context import RunContext
from astraflow.observe.dashboard import State
from astraflow.stores import _lance

TRAINER = ["reward_mean", "trainer_wait_s", "rows_read", "rows_used", "rows_dropped_stale",
           "staleness_mean", "loss", "clip_frac", "ratio_mean", "approx_kl", "dual_clip_frac",
           "tokens", "grad_norm", "entropy", "step_time_s", "weight_version"]
ROLLOUT = ["gen_s", "env_wait_s", "append_s", "batch_s", "backpressure_s", "rows",
           "rows_not_started", "rows_fed", "reload_s", "reward_mean", "truncated_frac", "tool_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("--steps", type=int, default=35, help="trainer steps between refreshes")
    ap.add_argument("--cycles", type=int, default=6)
    ap.add_argument("--metrics-every", type=int, default=7,
                    help="steps per metrics commit of each of the two writers (7: one a "
                         "second at 7 steps/s, as store.metrics_every_s=1 gives; 1: before)")
    ap.add_argument("--profile", action="store_true", help="print cProfile's top 30")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / args.run.name
        shutil.copytree(args.run, run, ignore=shutil.ignore_patterns("tensorboard"))
        ctx = RunContext.open(run)
        policy = ctx.flow.policy_names()[0]  # the run's first policy takes the commits
        table = ctx.trajectories().table(policy)
        rows = _lance.latest_dataset(table).to_table(limit=32)
        rows = rows.select([f.name for f in table.schema])
        state = State(ctx, refresh_s=0, audit_every_s=0)
        state.get()  # the whole history once, as a page's first load
        # CPU time as the clock: Lance's reader threads' work counts against the call
        # that waits for it, which is what a refresh costs the machine.
        prof = cProfile.Profile(time.process_time)
        per, idle, step = [], [], 10**6
        trainer_led, worker_led = ctx.ledger(), ctx.ledger()  # two writers, as in a run
        for lg in (trainer_led, worker_led):
            lg.metrics_every_s = float("inf")  # committed every --metrics-every steps below
        lg_commits = 0
        for _ in range(args.cycles):
            for _ in range(args.steps):
                step += 1
                trainer_led.log("trainer", policy, step, dict.fromkeys(TRAINER, 0.5))
                worker_led.log_many("rollout", [(policy, step, dict.fromkeys(ROLLOUT, 0.1))],
                                    [("worker", "w0", step, {"worker_rows": 32})])
                if step % args.metrics_every == 0:
                    trainer_led.flush_metrics()
                    worker_led.flush_metrics()
                    lg_commits += 2
                now = pa.array([int(time.time() * 1e6)] * len(rows), pa.int64()).cast(
                    pa.timestamp("us", tz="UTC"))
                r = rows.set_column(rows.schema.get_field_index("created_at"), "created_at", now)
                r = r.set_column(0, "traj_id", pa.array([f"t{step}-{i}" for i in range(len(r))]))
                _lance.append(table, r, where="replay")
            c = time.process_time()
            if args.profile:
                prof.enable()
            state.get(state.seq)
            if args.profile:
                prof.disable()
            per.append(time.process_time() - c)
            c = time.process_time()
            state.get(state.seq)  # nothing new: what a poll costs between commits
            idle.append(time.process_time() - c)
    frags = args.steps + lg_commits // args.cycles
    med = statistics.median(per)
    print(f"CPU per refresh after {args.steps} steps ({frags} fragments): median "
          f"{1e3 * med:.1f} ms ({1e3 * med / frags:.2f} ms per fragment), cycles "
          f"{', '.join(f'{1e3 * x:.0f}' for x in per)} ms; a refresh that found nothing: "
          f"{1e3 * statistics.median(idle):.1f} ms")
    if args.profile:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
