"""The embedded default: `astraflow run FLOW` runs every component as local processes.

    launcher ─┬─ warm start → publish weights v0; evaluate v0 on the held-out set
              │   (meanwhile the zygote imports torch for the components to fork)
              ├─ spawn: W × `astraflow rollout RUN`  +  `astraflow train RUN` per
              │         policy (per shared base: one for all its policies)
              │         (or one `astraflow train RUN --mode sync` for the baseline)
              ├─ every second: supervise (restart crashes), show progress from the
              │   metrics table; every eval_every_s: greedy eval of the newest
              │   version on a held-out slice; compact tables as maintenance
              └─ at the target (met on the slice, then on the whole set): stop
                  components, evaluate the final version (the one that met it),
                  write summary.json and progress.png

The launcher never talks to a component: it reads the same store they write.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from astraflow.config.flow import FlowSpec
from astraflow.config.loader import FlowError
from astraflow.context import RESOLVED, RunContext
from astraflow.local.evaluate import Evaluator
from astraflow.local.report import ledger_totals, plot, write_summary
from astraflow.local.supervise import Component, Supervisor
from astraflow.observe.sinks import launcher_follower
from astraflow.stores import Ledger, WeightError
from astraflow.train.version0 import publish_version0

log = logging.getLogger("astraflow.local.launcher")


def prepare_run(flow: FlowSpec, runs_root: Path, *, overwrite: bool = False) -> RunContext:
    """Create (or reopen) `runs/<name>/` and write the resolved flow there.

    An existing run of the same flow is resumed; a different flow under the
    same name is refused unless `overwrite` (nothing is deleted by surprise).
    """
    run_dir = Path(runs_root) / flow.name
    resolved = run_dir / RESOLVED
    if run_dir.exists() and overwrite:
        shutil.rmtree(run_dir)
    if resolved.exists() and resolved.read_text() != flow.dump():
        raise FlowError(
            f"{run_dir} holds a run of a different flow; pass --overwrite to start afresh "
            f"or choose another name (--set name=...)"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved.write_text(flow.dump())
    return RunContext(flow, run_dir)


def components(ctx: RunContext) -> list[Component]:
    flow, logs = ctx.flow, ctx.run_dir / "logs"
    run = str(ctx.run_dir)
    if flow.mode == "sync":
        if flow.trainer.ranks > 1:
            raise ValueError(f"trainer.ranks={flow.trainer.ranks} needs the async mode: sync mode "
                             f"drives every trainer inside one process")
        # The baseline gets the same cores the decoupled components share (never more
        # threads than cores: oversubscribing one process only slows it down).
        threads = min(flow.rollout.threads * flow.rollout.workers + flow.trainer.threads,
                      os.cpu_count() or 1)
        return [Component("sync", ["train", run, "--mode", "sync"], threads, logs / "sync.log")]
    # trainer.ranks > 1: torchrun starts the ranks and ends them all when one dies; the
    # supervisor restarts it as a whole (resume: checkpoint, rollback, republish).
    launcher = (["-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", str(flow.trainer.ranks)] if flow.trainer.ranks > 1 else [])
    # Policies sharing a base (model.shared_base) train in one process, on one copy of it.
    shared = {p: g for g, members in flow.shared_bases().items() for p in members}
    trainers = dict.fromkeys(shared.get(p, p) for p in flow.policy_names())
    comps = [Component(f"trainer-{t}", ["train", run, "--shared-base" if t in shared.values()
                                        else "--policy", t],
                       flow.trainer.threads, logs / f"trainer-{t}.log", launcher=launcher)
             for t in trainers]
    for i in range(flow.rollout.workers):
        comps.append(Component(f"rollout-w{i}", ["rollout", run, "--worker-id", f"w{i}"],
                               flow.rollout.threads, logs / f"rollout-w{i}.log"))
    return comps


def run_local(ctx: RunContext, console: Console | None = None) -> dict[str, Any]:
    console = console or Console(soft_wrap=True)
    flow, pol = ctx.flow, ctx.flow.policy.name
    policies = flow.policy_names()
    t_start = time.time()
    sup = Supervisor(components(ctx), state_path=ctx.run_dir / "components.json",
                     zygote_log=ctx.run_dir / "logs" / "zygote.log")
    sup.warm_up()  # the components' imports run while version 0 is made and scored
    try:
        # Warm start and version 0's score have the machine to itself: every core the
        # components will share (a HumanEval held-out set is 164 three-turn episodes).
        cores = min(flow.rollout.threads * flow.rollout.workers + flow.trainer.threads,
                    os.cpu_count() or 1)
        torch.set_num_threads(cores)
        warm = publish_version0(ctx, console)
        shared: dict = {}  # policies sharing a base are evaluated on one copy of it
        evaluators = {p: Evaluator(ctx, p, shared=shared) for p in policies}
        acc0 = {p: ev(0) for p, ev in evaluators.items()}
        torch.set_num_threads(1)  # from here on the launcher only evaluates, beside them
    except BaseException:
        if sup.zygote is not None:  # nothing else started; components.json stays as it was
            sup.zygote.stop()
        raise
    for p, ev in evaluators.items():
        console.print(f"held-out {ev.metric} of {p} v0: {acc0[p]:.1%} on {len(ev.items)} items")
    ledger = ctx.ledger()
    sinks = launcher_follower(ctx)  # TensorBoard (and W&B when configured), from the store
    stop_requested = {"flag": False}

    def on_signal(signum, _frame):
        stop_requested["flag"] = True

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    t0 = time.time()
    sup.start_all()
    console.print(f"started {len(sup.components)} component(s) in {flow.mode} mode: "
                  + ", ".join(c.name for c in sup.components))
    first = evaluators[pol]
    console.print(LEGEND.format(metric=first.metric, n=min(flow.stop.live_eval_size,
                                                           len(first.items)),
                                total=len(first.items), window=RATE_WINDOW), style="dim")
    deadline = t0 + flow.stop.max_minutes * 60
    live: list[dict[str, Any]] = []
    last_eval = last_show = last_maint = t0
    last_seen = 0.0
    latest: dict[str, dict[str, float]] = {p: {} for p in policies}
    trained = {p: deque[tuple[float, float]](maxlen=RATE_WINDOW + 1) for p in policies}
    reason = "max_steps"
    at_target: tuple[int, float] | None = None  # (version, full held-out) that met the target
    trainers = [c for c in sup.components if c.name == "sync" or c.name.startswith("trainer-")]
    try:
        while True:
            time.sleep(0.5)
            sup.check()
            now = time.time()
            if all(c.finished for c in trainers):
                reason = "max_steps"
                break
            if stop_requested["flag"]:
                reason = "interrupted"
                break
            if now > deadline:
                reason = "max_minutes"
                break
            if now - last_show >= 5.0:
                rows = ledger.read_metrics(since=last_seen).to_pylist()
                for r in sorted(rows, key=lambda r: r["time"]):
                    last_seen = max(last_seen, r["time"])
                    if r["component"] != "trainer" or r["policy"] not in latest:
                        continue
                    latest[r["policy"]][r["name"]] = r["value"]
                    latest[r["policy"]]["step"] = r["step"]
                    if r["name"] == "rows_used":
                        trained[r["policy"]].append((r["time"], r["value"]))
                last_show = now
                _show(console, now - t0, latest, live, max_steps=flow.stop.max_steps,
                      time_left_s=deadline - now,
                      rates={p: trained_rate(list(w)) for p, w in trained.items()})
                sinks.poll()
            if now - last_eval >= flow.stop.eval_every_s:
                point = live_eval(ctx, ledger, evaluators, flow.stop.live_eval_size)
                if point is not None:
                    point["t"] = time.time() - t0
                    live.append(point)
                    target = flow.stop.target_accuracy
                    if target is not None and point["accuracy"].get(pol, 0.0) >= target:
                        reached = confirm_target(evaluators[pol], point["version"][pol],
                                                 point["accuracy"][pol], target, console)
                        if reached is not None:
                            reason, at_target = "target_accuracy", reached
                            break
                last_eval = time.time()
            if now - last_maint >= 30.0:
                _maintain(ctx)
                last_maint = time.time()
    finally:
        sup.stop_all()
        sinks.close()  # the last rows the components logged, then flush
        for s, h in old.items():
            signal.signal(s, h)
    t_end = time.time()
    torch.set_num_threads(cores)  # the components are stopped: the final score has them all
    per_policy: dict[str, dict[str, Any]] = {}
    for p, ev in evaluators.items():
        if p == pol and at_target is not None:  # the version that met it, not a later one
            final_v, acc = at_target
        else:
            final_v = ctx.weights().latest(p)
            acc = ev(final_v)
        totals = ledger_totals(ctx, p)
        per_policy[p] = {
            "metric": ev.metric, "heldout_items": len(ev.items), "accuracy_v0": acc0[p],
            "final_version": final_v, "accuracy_final": acc,
            "improvement_points": 100 * (acc - acc0[p]), "ledger": totals,
            "steps_per_second": totals["steps"] / max(t_end - t0, 1e-9),
            "rows_per_second": totals["rows_read"] / max(t_end - t0, 1e-9),
        }
    head = per_policy[pol]
    summary = {
        "flow": flow.name, "mode": flow.mode, "policy": pol, "stop_reason": reason,
        "warm_start": warm, "heldout_tasks": head["heldout_items"],
        "accuracy_v0": head["accuracy_v0"], "final_version": head["final_version"],
        "accuracy_final": head["accuracy_final"], "improvement_points": head["improvement_points"],
        "started_at": t0, "rl_seconds": t_end - t0, "total_seconds": time.time() - t_start,
        "ledger": head["ledger"], "steps_per_second": head["steps_per_second"],
        "rows_per_second": head["rows_per_second"], "policies": per_policy,
        "live_eval": live,
        "restarts": {c.name: c.restarts for c in sup.components},
    }
    write_summary(ctx, summary)
    plot(ctx, t0, acc0=acc0, final={p: (t_end - t0, v["accuracy_final"])
                                    for p, v in per_policy.items()})
    for p, v in per_policy.items():
        console.print(
            f"[bold]{p}[/bold]: {v['ledger']['steps']} steps; held-out {v['metric']} v0 "
            f"{v['accuracy_v0']:.1%} → v{v['final_version']} {v['accuracy_final']:.1%} "
            f"({v['improvement_points']:+.1f} points)")
    console.print(f"[bold]done[/bold] ({reason}) in {t_end - t0:.0f}s of RL. Wrote "
                  f"{ctx.run_dir / 'summary.json'} and {ctx.run_dir / 'progress.png'}")
    return summary


def confirm_target(ev: Evaluator, version: int, slice_acc: float, target: float,
                   console: Console) -> tuple[int, float] | None:
    """(version, accuracy) when `version` meets the target on the whole held-out set,
    else None (the run goes on). A live evaluation scores a slice (`live_eval_size`),
    and a slice can pass a version the whole set fails: a run stopped on that said it
    reached its target and then reported a lower final figure, sometimes below version 0."""
    n = ev.ctx.flow.stop.live_eval_size
    if len(ev.items) <= n:
        return version, slice_acc  # the slice was the whole set
    acc = ev(version)
    console.print(f"{ev.policy} v{version} on all {len(ev.items)} held-out tasks: {acc:.1%} "
                  f"(target {target:.1%}, met on the slice of {n}: "
                  + ("stopping)" if acc >= target else "going on)"))
    return (version, acc) if acc >= target else None


def live_eval(ctx: RunContext, ledger: Ledger, evaluators: dict[str, Evaluator],
              n: int) -> dict[str, Any] | None:
    """Held-out metric of each policy on a slice: every policy at its newest version, or,
    with `trainer.version_barrier`, all at the newest version every policy has published."""
    ws = ctx.weights()
    newest = {p: ws.latest(p) for p in evaluators}
    if any(v is None for v in newest.values()):
        return None
    if ctx.flow.trainer.version_barrier:
        common = min(newest.values())  # type: ignore[type-var]
        newest = dict.fromkeys(newest, common)
    point: dict[str, Any] = {"version": newest, "accuracy": {}}
    for p, ev in evaluators.items():
        try:
            acc = ev(newest[p], n)  # type: ignore[arg-type]
        except (WeightError, FileNotFoundError) as err:  # pruned meanwhile
            log.info("live eval of %s v%s skipped: %s", p, newest[p], err)
            return None
        point["accuracy"][p] = acc
    ledger.log_many("eval", [(p, newest[p], {"heldout_accuracy": acc})  # type: ignore[misc]
                             for p, acc in point["accuracy"].items()])
    return point


LEGEND = ("columns: step done/max · v = newest weight version · reward = mean sampled reward "
          "of the step's rows · held-out = greedy {metric} of the version named, on {n} of the "
          "{total} held-out tasks (the final figure uses all {total}), and how long ago · "
          "staleness = mean versions between a row's sampler and the trainer · rows/s = rows "
          "trained per wall second over the last {window} steps · wait = the trainer's idle "
          "wait for rows · ETA = until max_steps or max_minutes, whichever comes first")

#: Trainer steps the progress line's rows/s is taken over.
RATE_WINDOW = 20


def trained_rate(points: list[tuple[float, float]]) -> float | None:
    """Rows trained per wall second from `(time, rows_used)` of consecutive trainer
    steps: the rows of every step after the first over the time between the first and
    the last (None under two steps). One step's time is no rate: a step that only
    filters rows already waiting takes milliseconds."""
    if len(points) < 2:
        return None
    span = points[-1][0] - points[0][0]
    return sum(r for _, r in points[1:]) / span if span > 0 else None


def progress_line(t: float, name: str, m: dict[str, float], live: dict[str, Any] | None,
                  policy: str, *, max_steps: int, time_left_s: float,
                  rate: float | None = None) -> str:
    """One progress line of a policy: `m` its newest trainer metrics (with `step`), `live`
    the newest live evaluation point (or None), `rate` its `trained_rate`. The ETA takes
    the step rate so far against `max_steps`, and the wall-clock limit, whichever ends
    the run first."""
    done = int(m["step"]) + 1
    acc = "—"
    if live is not None and policy in live["accuracy"]:
        age = max(t - live.get("t", t), 0.0)
        acc = f"{live['accuracy'][policy]:.1%} of v{int(live['version'][policy])} ({age:.0f}s ago)"
    by_steps = (max_steps - done) * t / done if done else float("inf")
    eta = max(min(by_steps, time_left_s), 0.0)
    rows_s = "—" if rate is None else f"{rate:.1f}"
    return (f"  {t:5.0f}s {name}step {done}/{max_steps}  v{int(m.get('weight_version', 0))}  "
            f"reward {m.get('reward_mean', 0):.3f}  held-out {acc}  "
            f"staleness {m.get('staleness_mean', 0):.2f}  {rows_s} rows/s  "
            f"wait {m.get('trainer_wait_s', 0):.2f}s  ETA {eta / 60:.1f} min")


def _show(console: Console, t: float, latest: dict[str, dict[str, float]],
          live: list[dict[str, Any]], *, max_steps: int, time_left_s: float,
          rates: dict[str, float | None]) -> None:
    if not any("step" in m for m in latest.values()):
        console.print(f"  {t:5.0f}s waiting for the first trainer step…")
        return
    for p, m in latest.items():
        if "step" not in m:
            console.print(f"  {t:5.0f}s {p}: waiting for its first step…")
            continue
        name = f"{p}: " if len(latest) > 1 else ""
        console.print(progress_line(t, name, m, live[-1] if live else None, p,
                                    max_steps=max_steps, time_left_s=time_left_s,
                                    rate=rates.get(p)))


def _maintain(ctx: RunContext) -> None:
    """Compact the run's tables so reads stay fast as small commits pile up."""
    try:
        traj = ctx.trajectories()
        ckpts = ctx.checkpoints() if ctx.flow.store.retire_consumed else None
        for p in ctx.flow.policy_names():
            # Rows behind every checkpoint a restarted trainer could resume from.
            traj.maintain(p, retire_upto=ckpts.oldest_cursor(p) if ckpts else None)
        ctx.ledger().maintain()
    except Exception as err:  # maintenance is best effort; data is never at stake here
        log.warning("maintenance skipped: %s", err)
