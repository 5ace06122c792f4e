"""Decoupled (async) against the trainer-centred baseline (sync), same flow, same run.

    python benchmarks/async_vs_sync.py [--steps 150] [--latencies 0,50,200] [--target 0.6]
    python benchmarks/async_vs_sync.py --workload code,search,agent [--steps 40]

`--workload math` (the default): for each modelled episode latency (a remote tool,
sandbox or environment that each episode turn waits on; MODELLED here as a sleep,
the batch's episodes waiting concurrently), runs the same flow in both modes from
the same warm-started version 0, for the same number of trainer steps.
`--workload code|search|agent` (comma-separated for several): the same comparison
on the tool-using example flows (examples/code.yaml, search.yaml, sql.yaml, the
last AgentBench's database shape), whose episodes wait on their REAL tools (the
code sandbox, LanceDB full-text search, SQLite) and nothing modelled. Per pair of
runs it prints:
  * wall-clock ratio (sync seconds / async seconds) for those steps,
  * time to a target held-out accuracy in each mode and their ratio,
  * final held-out accuracies,
  * where the time goes (trainer step and wait, worker generation / env wait /
    tool time / backpressure), read from the metrics table; for the tool workloads
    also turns and tool calls per episode and the share of an episode's wall-clock
    time spent in its tool calls, read from the trajectory table.
Ratios > 1 mean the decoupled system is faster. On 2 shared cores pure compute
cannot overlap profitably; decoupling wins where episodes wait on the world.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from common import metric_means, run_from_version0, steady_rates, time_to, version0
from rich.console import Console

from astraflow.context import RunContext, quiet_libraries

#: Tool-using workloads and their example flows; their episodes wait on real tools.
WORKLOADS = {"code": "examples/code.yaml", "search": "examples/search.yaml",
             "agent": "examples/sql.yaml"}


def one_run(flow_path: str, root: Path, v0: dict[str, Path], mode: str, label: str,
            overrides: dict, steps: int, sets: dict, console: Console) -> dict:
    """One run of `flow_path` in `mode` from the cached version 0, for `steps` steps."""
    over = {"name": f"bench-{mode}-{label}", "mode": mode, "stop.max_steps": steps,
            "stop.max_minutes": 60, "stop.target_accuracy": None, "stop.eval_every_s": 5,
            **overrides, **sets}
    ctx, summary = run_from_version0(flow_path, root, v0, over)
    summary["breakdown"] = breakdown(ctx)
    summary["episodes"] = episode_stats(ctx)
    # Steady state: seconds per step between the first and last step (no process start-up).
    summary["steady_s_per_step"] = 1 / steady_rates(ctx)[ctx.flow.policy.name]["steps_per_s"]
    console.print(f"  {mode:5s} {label}: {summary['ledger']['steps']} steps in "
                  f"{summary['rl_seconds']:.1f}s, final accuracy {summary['accuracy_final']:.1%}")
    return summary


def breakdown(ctx: RunContext) -> dict[str, float]:
    return metric_means(ctx, [
        ("trainer", "step_time_s"), ("trainer", "trainer_wait_s"), ("trainer", "publish_s"),
        ("rollout", "gen_s"), ("rollout", "env_wait_s"), ("rollout", "tool_s"),
        ("rollout", "batch_s"), ("rollout", "append_s"), ("rollout", "backpressure_s")])


def episode_stats(ctx: RunContext) -> dict[str, float]:
    """Means over the run's rows of the multi-turn extras (`tool_agent` records them):
    turns and tool calls per episode, and the share of an episode's wall-clock time
    spent in its own tool calls (sum of tool_s / sum of episode_s). Empty for
    single-turn workflows."""
    policy = ctx.flow.policy.name
    store = ctx.trajectories()
    rows = store.read_range(policy, 0, store.latest_version(policy), columns=["extras"])
    ex = [json.loads(e) for e in rows.column("extras").to_pylist()]
    ex = [e for e in ex if "turns" in e]
    if not ex:
        return {}
    episode_s = sum(e["episode_s"] for e in ex)
    return {"episodes": len(ex), "turns": statistics.mean(e["turns"] for e in ex),
            "tool_calls": statistics.mean(e["tool_calls"] for e in ex),
            "tool_share": sum(e["tool_s"] for e in ex) / episode_s if episode_s else 0.0}


def pairs(args: argparse.Namespace, sets: dict, v0_sets: dict, root: Path,
          console: Console) -> list[dict]:
    """One async run and one sync run per latency (math) or per tool workload."""
    results = []
    for workload in args.workload.split(","):
        if workload == "math":
            v0 = version0(args.flow, root, console, v0_sets)
            for lat in [float(x) for x in args.latencies.split(",")]:
                console.print(f"latency {lat:.0f} ms per episode turn (modelled):")
                over = {"env.turn_latency_ms": lat, "stop.live_eval_size": 200}
                label = f"{int(lat)}ms"
                results.append({"label": f"math {label} (modelled)", **{
                    m: one_run(args.flow, root, v0, m, label, over, args.steps, sets, console)
                    for m in ("async", "sync")}})
        elif workload in WORKLOADS:
            flow = WORKLOADS[workload]
            v0 = version0(flow, root, console, v0_sets)
            console.print(f"{workload} ({flow}), real tool time:")
            results.append({"label": f"{workload} (real tools)", **{
                m: one_run(flow, root, v0, m, workload, {}, args.steps, sets, console)
                for m in ("async", "sync")}})
        else:
            raise SystemExit(f"unknown workload {workload!r}: math, {', '.join(WORKLOADS)}")
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="math",
                    help="math (modelled latency sweep over --flow) or code, search, agent "
                         "(the tool-using example flows, real tool time); comma-separated")
    ap.add_argument("--flow", default="examples/math.yaml", help="the flow of --workload math")
    ap.add_argument("--steps", type=int, default=150, help="trainer steps per run")
    ap.add_argument("--latencies", default="0,50,200",
                    help="--workload math: modelled ms of wait per episode turn")
    ap.add_argument("--target", type=float, default=0.6, help="held-out accuracy for time-to-target")
    ap.add_argument("--root", default="runs/bench")
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="flow override for both modes, e.g. trainer.threads=2")
    ap.add_argument("--v0-set", dest="v0_sets", action="append", default=[],
                    help="flow override for making version 0 only, e.g. "
                         "policies.0.warm_start.max_steps=0 for a quick smoke run")
    ap.add_argument("--json", help="write all results here")
    args = ap.parse_args()
    import yaml

    def parse(items: list[str]) -> dict:
        return {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in items)}

    sets, v0_sets = parse(args.sets), parse(args.v0_sets)
    quiet_libraries()
    console = Console(width=200)
    t_all = time.time()
    results = pairs(args, sets, v0_sets, Path(args.root), console)
    console.print()
    console.print(f"same flow per row, {args.steps} trainer steps per run, same v0 per flow; "
                  f"ratio = sync / async, >1 means decoupled is faster; math latencies are "
                  f"MODELLED (sleep per turn), tool workloads wait on their real tools")
    head = (f"{'workload':>24} {'v0 acc':>7} {'async s':>8} {'sync s':>8} {'wall ratio':>10} "
            f"{'steady ratio':>12} {'async t→' + format(args.target, '.0%'):>11} "
            f"{'sync t→':>8} {'ratio':>6} {'acc async':>9} {'acc sync':>9}")
    console.print(head)
    for r in results:
        a, s = r["async"], r["sync"]
        ta, ts = time_to(a, args.target), time_to(s, args.target)
        tr = f"{ts / ta:6.2f}" if ta and ts else "   n/a"
        console.print(
            f"{r['label']:>24} {a['accuracy_v0']:>7.1%} {a['rl_seconds']:>8.1f} "
            f"{s['rl_seconds']:>8.1f} {s['rl_seconds'] / a['rl_seconds']:>10.2f} "
            f"{s['steady_s_per_step'] / a['steady_s_per_step']:>12.2f} "
            f"{(f'{ta:.0f}s' if ta else 'never'):>11} {(f'{ts:.0f}s' if ts else 'never'):>8} {tr} "
            f"{a['accuracy_final']:>9.1%} {s['accuracy_final']:>9.1%}"
        )
    console.print("\nwhere the time goes (mean seconds per trainer step / per worker batch; "
                  "episodes: means per episode, tool share = tool seconds / episode seconds):")
    for r in results:
        for mode in ("async", "sync"):
            b, ep = r[mode]["breakdown"], r[mode]["episodes"]
            console.print(f"  {r['label']:>24} {mode:5s} " + "  ".join(
                f"{k}={v:.3f}" for k, v in b.items()))
            if ep:
                console.print(f"  {'':>24} {mode:5s} episodes={ep['episodes']} "
                              f"turns={ep['turns']:.2f} tool_calls={ep['tool_calls']:.2f} "
                              f"tool_share={ep['tool_share']:.1%}")
    console.print(f"\nbenchmark wall time {time.time() - t_all:.0f}s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
