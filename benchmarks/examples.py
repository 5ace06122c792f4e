"""Every SmolLM2 example flow as it ships: does each end no lower than its version 0?

    python benchmarks/examples.py [--flows examples/smollm2-sql.yaml ...] [--out DIR]
                                  [--resume] [--set k=v]

RL's first promise to a user is not to make the model worse: a flow run as shipped
should end at least where its version 0 started, on the same held-out set. This
runs each flow with `astraflow run` (warm start, components, live evaluation, the
final check on the whole held-out set: exactly what a user gets), one after another
so that no two share the cores, and reads each run's `summary.json`. It prints one
row per policy: version 0's and the final version's held-out score on every
held-out task, the change in points, the trainer steps, the stop reason and
the minutes of RL, and whether the run ended no lower than version 0.

Runs are named `examples-<file stem>[-<tag>]` under `--runs` (`--tag` tells a
sweep with `--set` overrides from the flows as shipped); `--resume` reads a run that
already has its summary instead of running it again (a long sweep interrupted
halfway goes on where it stopped). Every result goes to `<out>/results.json`, each
run's log to `<out>/<run name>.log`. The exit status is 1 when any policy ended below
its version 0. Each flow takes 15-25 minutes here (2 cores), so the whole sweep is
a few hours; name flows to run a part of it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]


def default_flows() -> list[Path]:
    """The flows that load SmolLM2 from a file (the `smollm2-` examples)."""
    return sorted((ROOT / "examples").glob("smollm2-*.yaml"))


def run_flow(flow: Path, runs: Path, out: Path, sets: list[str], tag: str, resume: bool,
             console: Console) -> dict[str, Any]:
    """Run one flow to its end (or read its finished run) and return its summary."""
    name = f"examples-{flow.stem}" + (f"-{tag}" if tag else "")
    summary_path = runs / name / "summary.json"
    if resume and summary_path.exists():
        console.print(f"{flow.name}: reading the finished run {runs / name}")
        return json.loads(summary_path.read_text())
    cmd = [sys.executable, "-m", "astraflow", "run", str(flow), "--runs", str(runs),
           "--overwrite", "--set", f"name={name}"]
    for s in sets:
        cmd += ["--set", s]
    log = out / f"{name}.log"
    console.print(f"{flow.name}: running ({' '.join(cmd[2:])}); log {log}")
    start = time.time()
    with log.open("w") as fh:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT).returncode
    if rc != 0 or not summary_path.exists():
        tail = "\n".join(log.read_text().splitlines()[-15:])
        raise SystemExit(f"{flow.name} failed (exit {rc}) after {time.time() - start:.0f} s; "
                         f"the end of {log}:\n{tail}")
    console.print(f"{flow.name}: done in {(time.time() - start) / 60:.1f} min")
    return json.loads(summary_path.read_text())


def rows_of(flow: Path, summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per policy of the run: v0 and final held-out, and whether it held."""
    rows = []
    for policy, p in summary["policies"].items():
        rows.append({
            "flow": flow.name, "policy": policy, "metric": p["metric"],
            "heldout_items": p["heldout_items"], "accuracy_v0": p["accuracy_v0"],
            "final_version": p["final_version"], "accuracy_final": p["accuracy_final"],
            "points": p["improvement_points"], "steps": p["ledger"]["steps"],
            "stop_reason": summary["stop_reason"], "rl_minutes": summary["rl_seconds"] / 60,
            "held": p["accuracy_final"] >= p["accuracy_v0"],
        })
    return rows


def table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="SmolLM2 example flows as shipped: final held-out against version 0")
    for col in ("flow", "policy", "held-out", "v0", "final", "points", "steps",
                "stop", "RL min", "ends ≥ v0"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["flow"], r["policy"], f"{r['heldout_items']} ({r['metric']})",
                  f"{r['accuracy_v0']:.1%}", f"v{r['final_version']} {r['accuracy_final']:.1%}",
                  f"{r['points']:+.1f}", str(r["steps"]), r["stop_reason"],
                  f"{r['rl_minutes']:.1f}", "yes" if r["held"] else "[red]NO[/red]")
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flows", nargs="*", type=Path, default=None,
                    help="flow files (default: every examples/smollm2-*.yaml)")
    ap.add_argument("--runs", type=Path, default=ROOT / "runs")
    ap.add_argument("--out", type=Path, default=Path("/tmp/examples-sweep"))
    ap.add_argument("--resume", action="store_true",
                    help="read runs that already have a summary instead of running them")
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="override a field of every flow, e.g. stop.target_accuracy=null")
    ap.add_argument("--tag", default="", help="appended to the run names (use with --set)")
    args = ap.parse_args()
    console = Console(width=max(Console().width, 150))
    flows = [f.resolve() for f in (args.flows or default_flows())]
    missing = [str(f) for f in flows if not f.exists()]
    if missing:
        raise SystemExit(f"no such flow file: {', '.join(missing)}")
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.json"
    rows: list[dict[str, Any]] = []
    for flow in flows:
        rows += rows_of(flow, run_flow(flow, args.runs.resolve(), args.out, args.sets,
                                       args.tag, args.resume, console))
        results_path.write_text(json.dumps(rows, indent=2))  # kept as each flow ends
    console.print(table(rows))
    console.print(f"results: {results_path}")
    held = sum(r["held"] for r in rows)
    console.print(f"{held} of {len(rows)} policies ended no lower than version 0")
    if held < len(rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
