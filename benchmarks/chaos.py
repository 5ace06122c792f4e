"""Chaos: SIGKILL random components of the math flow, then audit; compare with a calm run.

    python benchmarks/chaos.py [--steps 500] [--interval 8,20] [--min-kills 10] [--seed 0]
    python benchmarks/chaos.py --writers 16 [--seconds 120] [--interval 2,5]   # store case
    python benchmarks/chaos.py --set store.delta_chain=8 --kill-before-manifest 5,40,77

Runs the flow twice from the same warm-started version 0 and for the same number
of trainer steps: once undisturbed, once while a chaos loop SIGKILLs a random live
component (trainer or rollout worker) at uniformly random intervals. Each run
is a real `astraflow run` launcher process supervising real component processes.
Afterwards `astraflow audit` checks both runs, and the benchmark prints:
  * kills, the audit's duplicate and silently-lost row counts (must be 0),
  * held-out accuracy of both runs and whether they differ by less than the
    evaluation-sampling noise (two binomial standard errors of the difference on
    the held-out set; two identical calm runs also differ by their training noise),
  * throughput (effective rows trained per second of RL) as a ratio chaos/calm,
  * recovery time per kill: from the kill to the killed component's next useful
    output (the trainer's next step, the worker's next committed batch).
With weight deltas on (`--set store.delta_chain=N`), `--kill-before-manifest` also
SIGKILLs the chaos run's trainer once at each named version, between that delta's
payload and its manifest (astraflow/testing.py), on top of the random kills.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from common import seed_version0, version0
from rich.console import Console

from astraflow.config.loader import load_flow
from astraflow.context import RunContext, quiet_libraries
from astraflow.local.launcher import prepare_run


def store_chaos(args, sets: dict, console: Console) -> None:
    """16 writers and the consumer (the trainer's store traffic: the only committer of
    staged batches) SIGKILLed at random and restarted; then `astraflow audit` on the run,
    and every acknowledged batch looked up in the table."""
    root = Path(args.root)
    # `--set store.write_mode=staged`: every batch goes through the committer.
    ctx = prepare_run(load_flow(args.flow, {**sets, "name": "bench-chaos-writers"}), root,
                      overwrite=True)
    run, pol = ctx.run_dir, ctx.flow.policy.name
    stop, acks = run / "STOP", run / "acks"
    here = str(Path(__file__).resolve().parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}

    def spawn(name: str, restarts: int) -> subprocess.Popen:
        call = (f"store_consumer({str(run)!r}, {pol!r}, {args.batch * 2}, {str(stop)!r})"
                if name == "consumer" else
                f"store_writer({str(run)!r}, {pol!r}, '{name}r{restarts}', {args.batch}, {str(acks)!r})")
        return subprocess.Popen([sys.executable, "-c", f"from store_actors import *; {call}"], env=env,
                                stderr=(run / f"{name}.log").open("a"), start_new_session=True)

    names = ["consumer"] + [f"w{i}" for i in range(args.writers)]
    restarts = dict.fromkeys(names, 0)
    procs = {n: spawn(n, 0) for n in names}
    lo, hi = (float(x) for x in args.interval.split(","))
    rng = random.Random(args.seed)
    kills: list[str] = []
    t_end = time.time() + args.seconds
    next_kill = time.time() + 10 + rng.uniform(lo, hi)
    while time.time() < t_end:
        time.sleep(0.1)
        for n, p in procs.items():
            if p.poll() is not None:
                raise SystemExit(f"{n} exited by itself ({p.returncode}); see {run / (n + '.log')}")
        if time.time() >= next_kill:
            name = "consumer" if rng.random() < 0.25 else rng.choice(names[1:])
            os.killpg(procs[name].pid, signal.SIGKILL)
            procs[name].wait()
            kills.append(name)
            restarts[name] += 1
            procs[name] = spawn(name, restarts[name])  # the launcher restarts at once
            next_kill = time.time() + rng.uniform(lo, hi)
    for n in names[1:]:
        os.killpg(procs[n].pid, signal.SIGKILL)  # writers stop mid-batch too
        procs[n].wait()
    stop.touch()
    procs["consumer"].wait(timeout=600)
    code, rep = audit(run)
    a = rep.get(pol, {})
    traj = ctx.trajectories()
    ids = set(traj.read_range(pol, 0, 2**62, columns=["traj_id"]).column("traj_id").to_pylist())
    acked = acks.read_text().split() if acks.exists() else []
    lost = sum(f"{b}-0" not in ids for b in acked)
    console.print(f"store chaos: {args.writers} writers + consumer for {args.seconds:.0f}s, "
                  f"SIGKILL every U({lo:g}, {hi:g}) s")
    console.print(f"kills: {len(kills)} ({kills.count('consumer')} consumer/committer, "
                  f"{len(kills) - kills.count('consumer')} writers)")
    console.print(f"audit: exit {code}, rows {a.get('rows_in_table')}, trained "
                  f"{a.get('rows_trained')}, not yet consumed {a.get('rows_not_yet_consumed')}, "
                  f"staged {a.get('rows_staged')}, duplicate rows {a.get('duplicate_rows')}, "
                  f"violations {a.get('violations')} "
                  f"{a.get('problems', '')}; acknowledged batches {len(acked)}, missing {lost}")
    sys.exit(0 if code == 0 and lost == 0 and len(kills) >= args.min_kills else 1)


def start_run(flow_path: str, root: Path, v0: dict[str, Path], name: str, steps: int,
              sets: dict, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
    overrides = {"name": name, "stop.max_steps": steps, "stop.max_minutes": 60,
                 "stop.target_accuracy": None, **sets}
    ctx = prepare_run(load_flow(flow_path, overrides), root, overwrite=True)
    seed_version0(ctx, v0)
    argv = [sys.executable, "-m", "astraflow", "run", flow_path, "--runs", str(root)]
    for k, v in overrides.items():
        argv += ["--set", f"{k}={json.dumps(v)}"]
    log = (ctx.run_dir / "launcher.log").open("w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **(env or {})})
    return proc, ctx.run_dir


def live_components(run: Path) -> dict[str, int]:
    try:
        state = json.loads((run / "components.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return {name: c["pid"] for name, c in state.items() if c["pid"] is not None}


def chaos(proc: subprocess.Popen, run: Path, lo: float, hi: float, rng: random.Random,
          console: Console) -> list[dict]:
    """Kill a random live component every U(lo, hi) seconds until the run ends."""
    kills: list[dict] = []
    next_kill = time.time() + rng.uniform(lo, hi) + 15  # let the first steps land first
    while proc.poll() is None:
        time.sleep(0.2)
        if time.time() < next_kill:
            continue
        live = live_components(run)
        if not live:
            continue
        name = rng.choice(sorted(live))
        try:
            os.kill(live[name], signal.SIGKILL)
        except ProcessLookupError:
            continue
        kills.append({"time": time.time(), "component": name, "pid": live[name]})
        console.print(f"  kill {len(kills):2d}: SIGKILL {name} (pid {live[name]})")
        next_kill = time.time() + rng.uniform(lo, hi)
    return kills


def recovery_times(ctx: RunContext, kills: list[dict]) -> list[float | None]:
    """Seconds from each kill to the killed component's next output in the store."""
    pol = ctx.flow.policy.name
    steps = sorted(e.time for e in ctx.ledger().history(pol) if e.kind == "step")
    rows = ctx.trajectories().read_range(pol, 0, 2**62, columns=["worker", "created_at"])
    by_worker: dict[str, list[float]] = {}
    for w, t in zip(rows.column("worker").to_pylist(), rows.column("created_at").to_pylist(),
                    strict=True):
        by_worker.setdefault(w, []).append(t.timestamp())
    out: list[float | None] = []
    for k in kills:
        if k["component"].startswith("trainer"):
            times = steps
        else:
            # components are named rollout-<worker id>; rows carry the worker id
            times = sorted(by_worker.get(k["component"].removeprefix("rollout-"), []))
        nxt = next((t for t in times if t > k["time"]), None)
        out.append(None if nxt is None else nxt - k["time"])
    return out


def audit(run: Path) -> tuple[int, dict]:
    r = subprocess.run([sys.executable, "-m", "astraflow", "audit", str(run), "--json"],
                       capture_output=True, text=True, timeout=600)
    try:
        return r.returncode, json.loads(r.stdout).get("policies", {})
    except json.JSONDecodeError:
        return r.returncode, {"error": r.stdout + r.stderr}


def finish(proc: subprocess.Popen, run: Path, name: str, console: Console) -> dict:
    code = proc.wait()
    if code != 0:
        raise SystemExit(f"{name} launcher exited with {code}; see {run / 'launcher.log'}")
    summary = json.loads((run / "summary.json").read_text())
    summary["audit_exit"], summary["audit"] = audit(run)
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flow", default="examples/math.yaml")
    ap.add_argument("--steps", type=int, default=500, help="trainer steps per run")
    ap.add_argument("--interval", default="8,20", help="seconds between kills: lo,hi (uniform)")
    ap.add_argument("--min-kills", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--root", default="runs/bench")
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="flow override for both runs, e.g. trainer.checkpoint_every=10")
    ap.add_argument("--json", help="write all results here")
    ap.add_argument("--writers", type=int, default=0,
                    help="store case instead: this many writer processes and one consumer")
    ap.add_argument("--seconds", type=float, default=120, help="store case: chaos duration")
    ap.add_argument("--batch", type=int, default=32, help="store case: rows per append")
    ap.add_argument("--kill-before-manifest", default="", metavar="V,...",
                    help="with store.delta_chain: also SIGKILL the trainer between these "
                         "versions' payload and manifest")
    args = ap.parse_args()
    import yaml

    sets = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.sets)}
    if args.writers:
        return store_chaos(args, sets, Console(width=200))

    lo, hi = (float(x) for x in args.interval.split(","))
    quiet_libraries()
    console = Console(width=200)
    root = Path(args.root)
    t_all = time.time()
    v0 = version0(args.flow, root, console)

    console.print(f"calm run: {args.steps} trainer steps, no kills")
    proc, calm_dir = start_run(args.flow, root, v0, "bench-calm", args.steps, sets)
    calm = finish(proc, calm_dir, "calm", console)

    console.print(f"chaos run: {args.steps} trainer steps, SIGKILL every U({lo:g}, {hi:g}) s")
    gate = root / "bench-chaos-gate"
    shutil.rmtree(gate, ignore_errors=True)  # each named version is killed once per run
    env = {"ASTRAFLOW_TEST_KILL_BEFORE_MANIFEST": args.kill_before_manifest,
           "ASTRAFLOW_TEST_GATE": str(gate)} if args.kill_before_manifest else {}
    proc, chaos_dir = start_run(args.flow, root, v0, "bench-chaos", args.steps, sets, env)
    kills = chaos(proc, chaos_dir, lo, hi, random.Random(args.seed), console)
    hot = finish(proc, chaos_dir, "chaos", console)
    rec = recovery_times(RunContext.open(chaos_dir), kills)

    def rate(s: dict) -> float:
        return s["ledger"]["rows_read"] / s["rl_seconds"]

    n = calm["heldout_tasks"]
    p = (calm["accuracy_final"] + hot["accuracy_final"]) / 2
    noise = 2 * math.sqrt(2 * p * (1 - p) / n)
    diff = hot["accuracy_final"] - calm["accuracy_final"]
    a = hot["audit"].get(calm["policy"], {})
    console.print()
    trainer_kills = sum(k["component"].startswith("trainer") for k in kills)  # trainer-<policy>
    console.print(f"kills: {len(kills)} ({trainer_kills} trainer, "
                  f"{len(kills) - trainer_kills} rollout workers)"
                  + ("" if len(kills) >= args.min_kills else
                     f"  [red]fewer than --min-kills {args.min_kills}: lengthen the run[/red]"))
    console.print(f"audit (chaos): exit {hot['audit_exit']}, duplicate rows {a.get('duplicate_rows')}, "
                  f"violations {a.get('violations')} {a.get('problems', '')}, rollbacks "
                  f"{a.get('rollbacks')}, voided steps {a.get('voided_steps')} (rows trained again "
                  f"{a.get('rows_retrained_after_rollback')}), rows up to the final cursor "
                  f"{a.get('rows_up_to_final_cursor')} = trained {a.get('rows_trained')} + stale "
                  f"{a.get('rows_dropped_stale')} + filtered {a.get('rows_dropped_filtered')}")
    if args.kill_before_manifest:
        console.print(f"trainer kills between a delta's payload and its manifest: "
                      f"{len(list(gate.glob('killed-*')))} (at versions {args.kill_before_manifest})")
    console.print(f"audit (calm):  exit {calm['audit_exit']}")
    console.print(f"held-out accuracy: calm {calm['accuracy_final']:.1%}, chaos "
                  f"{hot['accuracy_final']:.1%} (v0 {calm['accuracy_v0']:.1%}); difference "
                  f"{100 * diff:+.1f} points; evaluation-sampling noise ±{100 * noise:.1f} (2 SE of the "
                  f"difference, {n} tasks; run-to-run training variance comes on top): "
                  + ("within noise" if abs(diff) <= noise else "[red]outside noise[/red]"))
    console.print(f"throughput: calm {rate(calm):.0f} rows/s in {calm['rl_seconds']:.0f}s, chaos "
                  f"{rate(hot):.0f} rows/s in {hot['rl_seconds']:.0f}s; ratio chaos/calm "
                  f"[bold]{rate(hot) / rate(calm):.2f}[/bold] (aim >= 0.8)")
    console.print("recovery per kill (kill → that component's next step / committed batch):")
    for k, r in zip(kills, rec, strict=True):
        console.print(f"  {k['time'] - kills[0]['time']:6.1f}s  {k['component']:10s} "
                      + (f"{r:5.1f}s" if r is not None else "  n/a (run ended first)"))
    done = [r for r in rec if r is not None]
    if done:
        by = {}
        for k, r in zip(kills, rec, strict=True):
            if r is not None:
                by.setdefault("trainer" if k["component"].startswith("trainer") else "worker", []).append(r)
        console.print("  mean " + ", ".join(f"{k} {sum(v) / len(v):.1f}s (n={len(v)})"
                                            for k, v in sorted(by.items())))
    console.print(f"\nbenchmark wall time {time.time() - t_all:.0f}s")
    if args.json:
        Path(args.json).write_text(json.dumps({"calm": calm, "chaos": hot, "kills": kills,
                                               "recovery_s": rec}, indent=1))
    ok = hot["audit_exit"] == 0 and calm["audit_exit"] == 0 and len(kills) >= args.min_kills
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
