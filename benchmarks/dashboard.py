"""What a dashboard left open on a run costs the trainer, as a throughput ratio.

    python benchmarks/dashboard.py [--windows 6] [--window-s 30] [--poll-s 2.5] [--refresh-s 5]

One real run of a small math flow (launcher, trainer and worker processes on this
machine) with `astraflow dashboard` serving it from its own process. Once the
trainer steps, time is cut into windows that alternate: no page open / a page open
(a client fetching /api/state every `--poll-s`, as the page does; the server reads
the store at most once per `--refresh-s`). The trainer's rows/s in each window
come from the ledger. Alternating windows in one run, instead of two runs, keeps
the machine's other load (2 shared cores here) out of the comparison as far as
possible. Prints the mean rows/s with and without, their ratio and the cost, and —
a measure that the machine's other load does not blur — the CPU the dashboard
process used per second while a page was open (its upper bound on what it can take
from a trainer sharing the cores).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from rich.console import Console

from astraflow.flow import parse_flow
from astraflow.local import prepare_run, run_local
from astraflow.run import RunContext

FLOW = {
    "name": "bench-dashboard",
    "policies": [{"name": "solver",
                  "model": {"hidden_size": 64, "layers": 2, "heads": 2, "intermediate_size": 128},
                  "warm_start": {"max_steps": 0}, "algorithm": {"publish_every": 2}}],
    "env": {"digits": 2, "eval_size": 40},
    "rollout": {"workers": 1, "prompts_per_batch": 8, "samples_per_prompt": 4,
                "max_backlog_batches": 2},
    "stages": [{"name": "staleness", "params": {"max_versions": 4}}, {"name": "group_advantages"}],
    "stop": {"max_steps": 100000, "max_minutes": 60, "eval_every_s": 60, "live_eval_size": 20},
}


def start_dashboard(run: Path, refresh_s: float, log: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "astraflow.cli", "dashboard", str(run), "--port", "0",
         "--refresh", str(refresh_s), "--audit-every", "0"],
        stdout=subprocess.PIPE, stderr=open(log, "w"), text=True, start_new_session=True)
    line = proc.stdout.readline()  # "dashboard of … on http://127.0.0.1:PORT/ …"
    url = next((w for w in line.split() if w.startswith("http://")), None)
    if url is None:
        proc.kill()
        raise RuntimeError(f"the dashboard did not start: {line!r} (see {log})")
    return proc, url


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drive(ctx: RunContext, args, windows: list[tuple[float, float, bool]],
          status: dict) -> None:
    """Wait for the trainer's first step, then alternate windows; SIGINT the run at the end."""
    try:
        led = ctx.ledger()
        while led.progress("solver") is None:
            time.sleep(1)
        proc, url = start_dashboard(ctx.run_dir, args.refresh_s, ctx.run_dir / "dashboard.log")
        status["dashboard"] = proc
        urllib.request.urlopen(url + "api/state", timeout=120).read()  # warm: imports, codec
        time.sleep(args.window_s / 2)
        for i in range(args.windows):
            on = i % 2 == 1
            t0, c0 = time.time(), cpu_seconds(proc.pid)
            polls = 0
            while time.time() - t0 < args.window_s:
                if on:
                    json.loads(urllib.request.urlopen(url + "api/state", timeout=60).read())
                    polls += 1
                time.sleep(args.poll_s if on else 0.2)
            windows.append((t0, time.time(), on))
            status.setdefault("cpu", {True: [], False: []})[on].append(
                (cpu_seconds(proc.pid) - c0) / (time.time() - t0))
            status.setdefault("polls", 0)
            status["polls"] += polls
    except BaseException as err:  # noqa: BLE001 - reported after the run
        status["error"] = repr(err)
    finally:
        os.kill(os.getpid(), signal.SIGINT)  # run_local stops cleanly on SIGINT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--windows", type=int, default=6, help="alternating windows (even)")
    ap.add_argument("--window-s", type=float, default=30.0)
    ap.add_argument("--poll-s", type=float, default=2.5,
                    help="page fetches every this often (the page's default: refresh/2)")
    ap.add_argument("--refresh-s", type=float, default=5.0,
                    help="dashboard's store reads (the dashboard's default)")
    ap.add_argument("--root", type=Path, default=Path("runs/bench"))
    args = ap.parse_args()
    ctx = prepare_run(parse_flow(FLOW), args.root, overwrite=True)
    windows: list[tuple[float, float, bool]] = []
    status: dict = {}
    threading.Thread(target=drive, args=(ctx, args, windows, status), daemon=True).start()
    try:
        run_local(ctx, Console(quiet=True))
    finally:
        if "dashboard" in status:
            status["dashboard"].terminate()
            status["dashboard"].wait(timeout=30)
    if "error" in status:
        raise SystemExit(f"benchmark failed: {status['error']}")
    entries = sorted(ctx.ledger().entries("solver"), key=lambda e: e.time)
    rates: dict[bool, list[float]] = {True: [], False: []}
    for t0, t1, on in windows:
        rows = sum(e.rows_read for e in entries if t0 <= e.time < t1)
        rates[on].append(rows / (t1 - t0))
    off, on = statistics.mean(rates[False]), statistics.mean(rates[True])
    cpu = status["cpu"]
    print(json.dumps({"windows_s": args.window_s, "rows_per_s_without": rates[False],
                      "rows_per_s_with": rates[True], "polls": status.get("polls"),
                      "dashboard_cpu_per_s_open": cpu[True],
                      "dashboard_cpu_per_s_closed": cpu[False]}, indent=1))
    spread = statistics.pstdev(rates[False]) / off if len(rates[False]) > 1 else float("nan")
    print(f"trainer rows/s without a dashboard {off:.1f}, with one open {on:.1f}: "
          f"ratio {on / off:.3f} (cost {100 * (1 - on / off):+.1f}%; aim < 2%); windows "
          f"without it vary by {100 * spread:.0f}% among themselves")
    print(f"dashboard process CPU while a page polls: {statistics.mean(cpu[True]):.3f} "
          f"core-seconds per second (closed: {statistics.mean(cpu[False]):.3f})")


if __name__ == "__main__":
    main()
