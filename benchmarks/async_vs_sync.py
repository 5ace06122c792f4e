"""Decoupled (async) against the trainer-centred baseline (sync), same flow, same run.

    python benchmarks/async_vs_sync.py [--steps 150] [--latencies 0,50,200] [--target 0.6]

For each modelled episode latency (a remote tool, sandbox or environment that
each episode turn waits on; MODELLED here as a sleep, the batch's episodes
waiting concurrently), runs the same flow in both modes from the same warm-started
version 0, for the same number of trainer steps, and prints:
  * wall-clock ratio (sync seconds / async seconds) for those steps,
  * time to a target held-out accuracy in each mode and their ratio,
  * final held-out accuracies,
  * where the time goes (trainer step and wait, worker generation / env wait /
    backpressure), read from the metrics table.
Ratios > 1 mean the decoupled system is faster. On 2 shared cores pure compute
cannot overlap profitably; decoupling wins where episodes wait on the world.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from common import run_from_version0, steady_rates, time_to, version0
from rich.console import Console

from astraflow.run import RunContext, quiet_libraries


def one_run(flow_path: str, root: Path, v0: dict[str, Path], mode: str, latency: float,
            steps: int, sets: dict, console: Console) -> dict:
    overrides = {"name": f"bench-{mode}-{int(latency)}ms", "mode": mode,
                 "env.turn_latency_ms": latency, "stop.max_steps": steps, "stop.max_minutes": 60,
                 "stop.target_accuracy": None, "stop.eval_every_s": 5, "stop.live_eval_size": 200,
                 **sets}
    ctx, summary = run_from_version0(flow_path, root, v0, overrides)
    summary["breakdown"] = breakdown(ctx)
    # Steady state: seconds per step between the first and last step (no process start-up).
    summary["steady_s_per_step"] = 1 / steady_rates(ctx)[ctx.flow.policy.name]["steps_per_s"]
    console.print(f"  {mode:5s} {latency:4.0f} ms: {summary['ledger']['steps']} steps in "
                  f"{summary['rl_seconds']:.1f}s, final accuracy {summary['accuracy_final']:.1%}")
    return summary


def breakdown(ctx: RunContext) -> dict[str, float]:
    t = ctx.ledger().read_metrics().to_pylist()
    out: dict[str, float] = {}
    for comp, name in [("trainer", "step_time_s"), ("trainer", "trainer_wait_s"),
                       ("trainer", "publish_s"), ("rollout", "gen_s"), ("rollout", "env_wait_s"),
                       ("rollout", "append_s"), ("rollout", "backpressure_s")]:
        vals = [r["value"] for r in t if r["component"] == comp and r["name"] == name]
        if vals:
            out[f"{comp}.{name}"] = statistics.mean(vals)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flow", default="examples/math.yaml")
    ap.add_argument("--steps", type=int, default=150, help="trainer steps per run")
    ap.add_argument("--latencies", default="0,50,200", help="modelled ms of wait per episode turn")
    ap.add_argument("--target", type=float, default=0.6, help="held-out accuracy for time-to-target")
    ap.add_argument("--root", default="runs/bench")
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="flow override for both modes, e.g. trainer.threads=2")
    ap.add_argument("--json", help="write all results here")
    args = ap.parse_args()
    import yaml

    sets = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.sets)}
    quiet_libraries()
    console = Console(width=200)
    root = Path(args.root)
    t_all = time.time()
    v0 = version0(args.flow, root, console)
    results = []
    for lat in [float(x) for x in args.latencies.split(",")]:
        console.print(f"latency {lat:.0f} ms per episode turn (modelled):")
        a = one_run(args.flow, root, v0, "async", lat, args.steps, sets, console)
        s = one_run(args.flow, root, v0, "sync", lat, args.steps, sets, console)
        results.append({"latency_ms": lat, "async": a, "sync": s})
    console.print()
    console.print(f"same flow, {args.steps} trainer steps per run, same v0 "
                  f"(held-out {results[0]['async']['accuracy_v0']:.1%}); ratio = sync / async, "
                  f">1 means decoupled is faster; episode latency is MODELLED (sleep per turn)")
    head = (f"{'latency':>8} {'async s':>8} {'sync s':>8} {'wall ratio':>10} {'steady ratio':>12} "
            f"{'async t→' + format(args.target, '.0%'):>11} {'sync t→':>8} {'ratio':>6} "
            f"{'acc async':>9} {'acc sync':>9}")
    console.print(head)
    for r in results:
        a, s = r["async"], r["sync"]
        ta, ts = time_to(a, args.target), time_to(s, args.target)
        tr = f"{ts / ta:6.2f}" if ta and ts else "   n/a"
        console.print(
            f"{r['latency_ms']:>6.0f}ms {a['rl_seconds']:>8.1f} {s['rl_seconds']:>8.1f} "
            f"{s['rl_seconds'] / a['rl_seconds']:>10.2f} "
            f"{s['steady_s_per_step'] / a['steady_s_per_step']:>12.2f} "
            f"{(f'{ta:.0f}s' if ta else 'never'):>11} {(f'{ts:.0f}s' if ts else 'never'):>8} {tr} "
            f"{a['accuracy_final']:>9.1%} {s['accuracy_final']:>9.1%}"
        )
    console.print("\nwhere the time goes (mean seconds per trainer step / per worker batch):")
    for r in results:
        for mode in ("async", "sync"):
            b = r[mode]["breakdown"]
            console.print(f"  {r['latency_ms']:>4.0f}ms {mode:5s} " + "  ".join(
                f"{k}={v:.3f}" for k, v in b.items()))
    console.print(f"\nbenchmark wall time {time.time() - t_all:.0f}s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
