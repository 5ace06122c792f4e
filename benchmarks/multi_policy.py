"""Several policies trained together: decoupled against the trainer-centred baseline.

    python benchmarks/multi_policy.py [--steps 150] [--latencies 0,200] [--target 0.3]
                                      [--policies 1,2,4] [--scale-steps 60] [--json out.json]
    python benchmarks/multi_policy.py --project out.json   # part 2 again, from saved times

1. Measured here. The solver–verifier flow (examples/math-solver-verifier.yaml)
   runs decoupled (async: a rollout worker and one trainer process per policy,
   meeting only in the store) and trainer-centred (sync: one loop that generates
   with both policies, trains the solver, trains the verifier, publishes) from the
   same warm-started version 0 of both policies, for the same number of steps, at
   each modelled environment wait per turn (a sleep; the batch's episodes wait
   concurrently). Prints seconds per iteration (one step of every policy) and their
   ratio, time to a target held-out solver accuracy and its ratio, and the final
   solver accuracy and verifier judgement accuracy. Ratios > 1: decoupled is faster.
2. Projected. The per-component times the sync runs measured (generation per
   policy, each trainer's step, publish, reload, checkpoint, append; no other
   process competing for the cores) feed benchmarks/cluster_projection.py, which
   replays both designs' real dependencies on the paper's cluster (4 rollout
   devices + 2 per trainer, against 8 colocated) and prints the ratio with its
   assumptions beside the paper's 2.74x.
3. What adding policies costs. 1, 2 and 4 policies (solver alone; solver +
   verifier; solver + 3 verifiers), decoupled, same steps: throughput per policy.

After parts 1 and 3, what became of the rows of every run, per policy (counts, valid
on a loaded machine; benchmarks/common.py `row_fates`): generated, trained, filtered,
and never trained (shed, fed as input only, stale, left unread at the stop) with their
share of the generated rows. `--waste-only` runs just the decoupled runs of parts 1
and 3 and prints those counts (no timing claims).

On 2 shared cores pure compute cannot overlap profitably (DESIGN.md), so part 1
alone cannot show the paper's ratio; part 2 says what these step times imply on
separate hardware.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import cluster_projection as cluster_sim
import yaml
from common import (
    fates_header,
    fates_table,
    row_fates,
    run_from_version0,
    steady_rates,
    time_to,
    version0,
)
from rich.console import Console

from astraflow.config.loader import load_flow
from astraflow.context import RunContext, quiet_libraries


def one_run(flow_path: str, root: Path, v0: dict[str, Path], name: str, overrides: dict[str, Any],
            console: Console) -> dict[str, Any]:
    ctx, summary = run_from_version0(flow_path, root, v0, {
        "stop.max_minutes": 60, "stop.target_accuracy": None, "stop.eval_every_s": 5,
        "stop.live_eval_size": 200, **overrides, "name": name})
    summary["measured"] = measured(ctx)
    summary["steady"] = steady_rates(ctx)
    summary["fates"] = row_fates(ctx)
    # An iteration is one step of every policy: the slowest policy's steady pace sets it.
    summary["s_per_iteration"] = max(1 / v["steps_per_s"] for v in summary["steady"].values())
    pol = summary["policies"]
    console.print(f"  {name:28s} {summary['rl_seconds']:6.1f}s, {summary['s_per_iteration']:.3f} "
                  f"s/iteration; " + ", ".join(
                      f"{p} {v['metric']} {v['accuracy_v0']:.1%}→{v['accuracy_final']:.1%}"
                      for p, v in pol.items()))
    return summary


def _mean(rows: list[dict], component: str, policy: str, name: str, positive: bool = False) -> float:
    vals = [r["value"] for r in rows if r["component"] == component and r["policy"] == policy
            and r["name"] == name and (r["value"] > 0 or not positive)]
    return statistics.mean(vals) if vals else 0.0


def measured(ctx: RunContext) -> dict[str, Any]:
    """Per-component times from the run's metrics table, in cluster_sim's terms."""
    rows = ctx.ledger().read_metrics().to_pylist()
    pols = []
    for p in ctx.flow.policy_names():
        steps = [r for r in rows if r["component"] == "trainer" and r["policy"] == p
                 and r["name"] == "step_time_s"]
        publishes = [r["value"] for r in rows if r["component"] == "trainer" and r["policy"] == p
                     and r["name"] == "publish_s"]
        step_s = statistics.mean(r["value"] for r in steps)
        publish_s = statistics.mean(publishes) if publishes else 0.0
        pols.append({
            "name": p,
            "gen_s": _mean(rows, "rollout", p, "gen_s"),
            # step_time_s includes the publish of the steps that published
            "train_s": max(step_s - sum(publishes) / max(len(steps), 1), 0.0),
            "publish_s": publish_s,
            "reload_s": _mean(rows, "rollout", p, "reload_s", positive=True),
            "checkpoint_s": _mean(rows, "trainer", p, "checkpoint_s"),
            "publish_every": ctx.flow.policy_spec(p).algorithm.publish_every,
        })
    appends = [r["value"] for r in rows if r["component"] == "rollout" and r["name"] == "append_s"]
    return {"policies": pols, "env_wait_s": ctx.flow.env.turn_latency_ms / 1000.0,
            "append_s": statistics.mean(appends) if appends else 0.0, "needs": needs_of(ctx)}


def needs_of(ctx: RunContext) -> dict[str, list[str]]:
    """Policy → the policies its roles read, from the flow's own workflow
    (`Workflow.needs`): what the projection's admission may play apart (`judge`: nothing;
    `solver_verifier`: the solver alone)."""
    from astraflow.models.codec import load_codec
    from astraflow.workflows.workload import make_workflow

    cast = ctx.flow.role_map()
    v0 = Path(ctx.weights_root) / ctx.flow.policy.name / "v00000000"
    wf = make_workflow(ctx.flow, load_codec(v0))
    roles = list(cast)
    out: dict[str, set[str]] = {p: set() for p in ctx.flow.policy_names()}
    for r in roles:
        out[cast[r]] |= {cast[n] for n in wf.needs(r, roles)} - {cast[r]}
    return {p: sorted(v) for p, v in out.items()}


def parse_sets(items: list[str]) -> dict[str, Any]:
    """`key=value` overrides (values as YAML)."""
    return {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in items)}


def version0_from(flow_path: str, run_dir: Path) -> dict[str, Path]:
    """Each policy's version 0 in an earlier warm start's run folder (its manifest must
    be there: a half-written one is refused)."""
    flow = load_flow(flow_path)
    ctx = RunContext(flow, run_dir)
    out = {p: Path(ctx.weights_root) / p / "v00000000" for p in flow.policy_names()}
    missing = [str(d) for d in out.values() if not (d / "MANIFEST.json").exists()]
    if missing:
        raise SystemExit(f"--v0-from {run_dir}: no version 0 at {', '.join(missing)}")
    return out


def scale_overrides(flow_path: str, n: int) -> dict[str, Any]:
    """The example flow with 1 (solver alone), 2 (as written) or 4 (3 verifiers) policies."""
    data = yaml.safe_load(Path(flow_path).read_text())
    solver, verifier = data["policies"][0], data["policies"][1]
    if n == 1:
        return {"policies": [solver], "workflow": {"name": "single"}}
    if n == 2:
        return {}
    extra = [{**verifier, "name": f"verifier_{i}"} for i in range(2, n)]
    return {"policies": [solver, verifier, *extra],
            "workflow": {"name": "solver_verifier", "params": {"verifiers": n - 1}}}


def cluster_for(flow) -> cluster_sim.Cluster:
    """The paper's cluster shape, with the flow's own backpressure and trainer settings."""
    return cluster_sim.Cluster(max_backlog_batches=flow.rollout.max_backlog_batches,
                               max_lead_batches=flow.rollout.max_lead_batches,
                               trainer_poll_s=flow.trainer.poll_interval_s,
                               checkpoint_every=flow.trainer.checkpoint_every)


def projection(console: Console, flow, compare: list[dict[str, Any]]) -> list[dict[str, Any]]:
    console.print("\n[bold]2. projected onto the paper's cluster (inputs: the sync runs' "
                  "measured component times)[/bold]")
    out = []
    for r in compare:
        m = cluster_sim.Measured.from_dict(r["sync"]["measured"])
        proj = cluster_sim.project(m, cluster_for(flow))
        console.print(f"-- env wait {r['latency_ms']:.0f} ms per turn --")
        console.print(cluster_sim.format_projection(proj))
        out.append({"latency_ms": r["latency_ms"], "ratio": proj.ratio,
                    "measured": r["sync"]["measured"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flow", default="examples/math-solver-verifier.yaml")
    ap.add_argument("--steps", type=int, default=150, help="trainer steps per policy per run")
    ap.add_argument("--latencies", default="0,200", help="modelled ms of env wait per turn")
    ap.add_argument("--target", type=float, default=0.3, help="held-out solver accuracy target")
    ap.add_argument("--policies", default="1,2,4", help="policy counts for the scaling part")
    ap.add_argument("--scale-steps", type=int, default=60, help="steps per scaling run")
    ap.add_argument("--root", default="runs/bench")
    ap.add_argument("--json", help="write all results (and the measured times) here")
    ap.add_argument("--v0-from", metavar="RUN_DIR", type=Path,
                    help="take every policy's version 0 from this earlier warm start (e.g. "
                         "runs/bench/v0-math-solver-verifier) instead of warm-starting: the "
                         "same weights for runs of two code versions")
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="flow override for every run and for making version 0 (a "
                         "warm start plays the workflow the runs play), e.g. "
                         "stop.live_eval_size=50")
    ap.add_argument("--v0-set", dest="v0_sets", action="append", default=[],
                    help="flow override for making version 0 only, over --set, e.g. "
                         "policies.0.warm_start.max_steps=150 for a shorter warm start")
    ap.add_argument("--waste-only", action="store_true",
                    help="only the decoupled runs of parts 1 and 3, and their row counts")
    ap.add_argument("--project", metavar="JSON",
                    help="only re-print part 2 from the measured times a --json file saved")
    args = ap.parse_args()
    args.sets, args.v0_sets = parse_sets(args.sets), parse_sets(args.v0_sets)
    quiet_libraries()
    console = Console(width=200)
    if args.project:
        saved = json.loads(Path(args.project).read_text())
        projection(console, load_flow(args.flow), saved["compare"])
        return
    root = Path(args.root)
    t_all = time.time()
    v0 = (version0_from(args.flow, args.v0_from) if args.v0_from
          else version0(args.flow, root, console, {**args.sets, **args.v0_sets}))
    results: dict[str, Any] = {"compare": [], "scale": []}

    console.print("[bold]1. decoupled (async) vs trainer-centred (sync), measured here[/bold]")
    modes = ("async",) if args.waste_only else ("async", "sync")
    for lat in [float(x) for x in args.latencies.split(",") if x]:
        runs = {}
        for mode in modes:
            runs[mode] = one_run(args.flow, root, v0, f"mp-{mode}-{lat:.0f}ms",
                                 {"mode": mode, "env.turn_latency_ms": lat,
                                  "stop.max_steps": args.steps, **args.sets}, console)
        results["compare"].append({"latency_ms": lat, **runs})
    fates_header(console)
    for r in results["compare"]:
        for mode in modes:
            fates_table(console, f"{mode} {r['latency_ms']:.0f}ms", r[mode]["fates"])
    if not args.waste_only:
        compare_table(console, args, results)
        results["projection"] = projection(console, load_flow(args.flow), results["compare"])
    scale(console, args, root, v0, results)
    console.print(f"\nbenchmark wall time {time.time() - t_all:.0f}s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


def compare_table(console: Console, args: argparse.Namespace, results: dict[str, Any]) -> None:
    console.print(f"\nsame flow and v0, {args.steps} steps of each policy per run; iteration = one "
                  f"step of every policy; ratio = sync / async (>1: decoupled faster); env wait "
                  f"is MODELLED (a sleep per turn); 2 shared CPU cores")
    console.print(f"{'env wait':>8} {'async s/it':>10} {'sync s/it':>9} {'ratio':>6} "
                  f"{'async t→' + format(args.target, '.0%'):>11} {'sync t→':>8} {'ratio':>6} "
                  f"{'solver async':>12} {'solver sync':>11} {'verif. async':>12} {'verif. sync':>11}")
    for r in results["compare"]:
        a, s = r["async"], r["sync"]
        ta, ts = time_to(a, args.target), time_to(s, args.target)
        tr = f"{ts / ta:6.2f}" if ta and ts else "   n/a"
        acc = {m: {p: v["accuracy_final"] for p, v in r[m]["policies"].items()}
               for m in ("async", "sync")}
        console.print(
            f"{r['latency_ms']:>6.0f}ms {a['s_per_iteration']:>10.3f} {s['s_per_iteration']:>9.3f} "
            f"{s['s_per_iteration'] / a['s_per_iteration']:>6.2f} "
            f"{(f'{ta:.0f}s' if ta else 'never'):>11} {(f'{ts:.0f}s' if ts else 'never'):>8} {tr} "
            f"{acc['async']['solver']:>12.1%} {acc['sync']['solver']:>11.1%} "
            f"{acc['async'].get('verifier', float('nan')):>12.1%} "
            f"{acc['sync'].get('verifier', float('nan')):>11.1%}")
    v0acc = results["compare"][0]["async"]["policies"]
    console.print("version 0: " + ", ".join(f"{p} {v['metric']} {v['accuracy_v0']:.1%}"
                                            for p, v in v0acc.items()))


def scale(console: Console, args: argparse.Namespace, root: Path, v0: dict[str, Path],
          results: dict[str, Any]) -> None:
    console.print("\n[bold]3. what adding policies costs (decoupled, "
                  f"{args.scale_steps} steps each)[/bold]")
    for n in [int(x) for x in args.policies.split(",") if x]:
        over = scale_overrides(args.flow, n)
        names = [p["name"] for p in over.get("policies", [])] or list(v0)
        seeds = {p: v0.get(p, v0.get("verifier")) for p in names}
        s = one_run(args.flow, root, seeds, f"mp-scale-{n}",
                    {**over, "mode": "async", "stop.max_steps": args.scale_steps, **args.sets},
                    console)
        results["scale"].append({"policies": n, "summary": s})
    console.print("each policy's own steady pace (first to last step); rows = trajectory rows "
                  "its trainer consumed")
    console.print(f"{'policies':>8} {'policy':>11} {'rows/s':>8} {'steps/s':>8} "
                  f"{'s/iteration':>11} {'total rows/s':>12}")
    for r in results["scale"]:
        s = r["summary"]
        total = sum(v["rows_per_s"] for v in s["steady"].values())
        for p, v in s["steady"].items():
            console.print(f"{r['policies']:>8} {p:>11} {v['rows_per_s']:>8.0f} "
                          f"{v['steps_per_s']:>8.2f} {s['s_per_iteration']:>11.3f} {total:>12.0f}")
    fates_header(console)
    for r in results["scale"]:
        fates_table(console, f"async {r['policies']} policies", r["summary"]["fates"])


if __name__ == "__main__":
    main()
