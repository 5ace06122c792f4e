"""The embedded default: `astraflow run FLOW` runs every component as local processes.

    launcher ─┬─ warm start → publish weights v0; evaluate v0 on the held-out set
              ├─ spawn: W × `astraflow rollout RUN`  +  `astraflow train RUN`
              │         (or one `astraflow train RUN --sync` for the baseline)
              ├─ every second: supervise (restart crashes), show progress from the
              │   metrics table; every eval_every_s: greedy eval of the newest
              │   version on a held-out slice; compact tables as maintenance
              └─ at the target: stop components, evaluate the final version,
                  write summary.json and progress.png

The launcher never talks to a component: it reads the same store they write.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from astraflow.evaluate import accuracy
from astraflow.flow import FlowError, FlowSpec
from astraflow.models.factory import save_policy, tiny_llama
from astraflow.models.tokenizer import CharCodec, build_char_tokenizer
from astraflow.models.warm_start import warm_start
from astraflow.report import ledger_totals, plot, write_summary
from astraflow.rollout.engine import HFEngine
from astraflow.rollout.worker import make_env
from astraflow.run import RESOLVED, RunContext
from astraflow.stores import WeightError
from astraflow.supervise import Component, Supervisor

log = logging.getLogger("astraflow.local")


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


def publish_version0(ctx: RunContext, console: Console) -> dict[str, Any]:
    """Warm-start the tiny model and publish it as version 0 (skipped if present)."""
    pol = ctx.flow.policy
    ws = ctx.weights()
    if ws.latest(pol.name) is not None:
        console.print(f"[dim]weights of {pol.name} exist (v{ws.latest(pol.name)}); skipping warm start")
        return {}
    m = pol.model
    model = tiny_llama(hidden_size=m.hidden_size, layers=m.layers, heads=m.heads,
                       intermediate_size=m.intermediate_size, seed=ctx.flow.seed)
    codec = CharCodec.default()
    env = make_env(ctx)
    console.print(f"warm start of {pol.name}: supervised pass until validation accuracy "
                  f">= {pol.warm_start.target_accuracy:.0%} (at most {pol.warm_start.max_steps} steps)")

    def progress(step: int, acc: float) -> None:
        if step % 100 == 0 or acc >= pol.warm_start.target_accuracy:
            console.print(f"  warm start step {step}: validation accuracy {acc:.1%}")

    res = warm_start(model, codec, env, pol.warm_start, seed=ctx.flow.seed, progress=progress)
    staging = ws.staging_dir(pol.name)
    save_policy(model, build_char_tokenizer(), staging)
    ws.publish(pol.name, staging, step=0, version=0)
    console.print(f"published {pol.name} v0 after {res.steps} steps, {res.seconds:.0f}s "
                  f"(validation accuracy {res.accuracy:.1%})")
    return {"steps": res.steps, "seconds": res.seconds, "validation_accuracy": res.accuracy}


class Evaluator:
    """Greedy held-out accuracy of any published version, in the launcher process."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.env = make_env(ctx)
        self.tasks = self.env.eval_tasks(ctx.flow.env.eval_size)
        self.ws = ctx.weights()
        self.engine: HFEngine | None = None

    def __call__(self, version: int, n: int | None = None) -> float:
        path = self.ws.load(self.ctx.flow.policy.name, version)
        if self.engine is None:
            self.engine = HFEngine.from_dir(path)
        else:
            self.engine.load_weights(path)
        return accuracy(self.engine, self.env, self.tasks[: n or len(self.tasks)])


def components(ctx: RunContext) -> list[Component]:
    flow, logs = ctx.flow, ctx.run_dir / "logs"
    run = str(ctx.run_dir)
    if flow.mode == "sync":
        # The baseline gets the same cores the decoupled components share (never more
        # threads than cores: oversubscribing one process only slows it down).
        threads = min(flow.rollout.threads * flow.rollout.workers + flow.trainer.threads,
                      os.cpu_count() or 1)
        return [Component("sync", ["train", run, "--sync"], threads, logs / "sync.log")]
    comps = [Component("trainer", ["train", run], flow.trainer.threads, logs / "trainer.log")]
    for i in range(flow.rollout.workers):
        comps.append(Component(f"rollout-{i}", ["rollout", run, "--worker-id", f"w{i}"],
                               flow.rollout.threads, logs / f"rollout-{i}.log"))
    return comps


def run_local(ctx: RunContext, console: Console | None = None) -> dict[str, Any]:
    console = console or Console(soft_wrap=True)
    flow, pol = ctx.flow, ctx.flow.policy.name
    t_start = time.time()
    # Warm start has the machine to itself: give it every core the components will share.
    torch.set_num_threads(min(flow.rollout.threads * flow.rollout.workers + flow.trainer.threads,
                              os.cpu_count() or 1))
    warm = publish_version0(ctx, console)
    torch.set_num_threads(1)  # from here on the launcher only evaluates, beside the components
    evaluator = Evaluator(ctx)
    acc0 = evaluator(0)
    console.print(f"held-out accuracy of v0: {acc0:.1%} on {len(evaluator.tasks)} tasks")
    ledger = ctx.ledger()
    sup = Supervisor(components(ctx), state_path=ctx.run_dir / "components.json",
                     zygote_log=ctx.run_dir / "logs" / "zygote.log")
    stop_requested = {"flag": False}

    def on_signal(signum, _frame):
        stop_requested["flag"] = True

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    t0 = time.time()
    sup.start_all()
    console.print(f"started {len(sup.components)} component(s) in {flow.mode} mode: "
                  + ", ".join(c.name for c in sup.components))
    deadline = t0 + flow.stop.max_minutes * 60
    live: list[dict[str, float]] = []
    last_eval = last_show = last_maint = t0
    last_seen = 0.0
    latest: dict[str, float] = {}
    reason = "max_steps"
    trainer_name = "sync" if flow.mode == "sync" else "trainer"
    try:
        while True:
            time.sleep(0.5)
            sup.check()
            now = time.time()
            if any(c.finished for c in sup.components if c.name == trainer_name):
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
                    latest[r["name"]] = r["value"]
                    latest["step"] = r["step"]
                    last_seen = max(last_seen, r["time"])
                last_show = now
                _show(console, now - t0, latest, live)
            if now - last_eval >= flow.stop.eval_every_s:
                v = ctx.weights().latest(pol)
                acc = None
                if v is not None:
                    try:
                        acc = evaluator(v, flow.stop.live_eval_size)
                    except (WeightError, FileNotFoundError) as err:  # pruned meanwhile
                        log.info("live eval of v%s skipped: %s", v, err)
                if acc is not None:
                    ledger.log("eval", pol, v, {"heldout_accuracy": acc})
                    live.append({"t": time.time() - t0, "version": v, "accuracy": acc})
                    if flow.stop.target_accuracy is not None and acc >= flow.stop.target_accuracy:
                        reason = "target_accuracy"
                        break
                last_eval = time.time()
            if now - last_maint >= 30.0:
                _maintain(ctx)
                last_maint = time.time()
    finally:
        sup.stop_all()
        for s, h in old.items():
            signal.signal(s, h)
    t_end = time.time()
    final_v = ctx.weights().latest(pol)
    acc_final = evaluator(final_v)
    totals = ledger_totals(ctx)
    summary = {
        "flow": flow.name, "mode": flow.mode, "policy": pol, "stop_reason": reason,
        "warm_start": warm, "heldout_tasks": len(evaluator.tasks),
        "accuracy_v0": acc0, "final_version": final_v, "accuracy_final": acc_final,
        "improvement_points": 100 * (acc_final - acc0),
        "rl_seconds": t_end - t0, "total_seconds": time.time() - t_start,
        "ledger": totals,
        "steps_per_second": totals["steps"] / max(t_end - t0, 1e-9),
        "rows_per_second": totals["rows_read"] / max(t_end - t0, 1e-9),
        "live_eval": live,
        "restarts": {c.name: c.restarts for c in sup.components},
    }
    write_summary(ctx, summary)
    plot(ctx, t0, acc0=acc0, final=(t_end - t0, acc_final))
    console.print(
        f"[bold]done[/bold] ({reason}): {totals['steps']} steps in {t_end - t0:.0f}s; held-out "
        f"accuracy v0 {acc0:.1%} → v{final_v} {acc_final:.1%} "
        f"({summary['improvement_points']:+.1f} points). Wrote {ctx.run_dir / 'summary.json'} "
        f"and {ctx.run_dir / 'progress.png'}"
    )
    return summary


def _show(console: Console, t: float, m: dict[str, float], live: list[dict[str, float]]) -> None:
    if "step" not in m:
        console.print(f"  {t:5.0f}s waiting for the first trainer step…")
        return
    acc = f"{live[-1]['accuracy']:.1%} (v{int(live[-1]['version'])})" if live else "—"
    console.print(
        f"  {t:5.0f}s step {int(m['step']):5d}  v{int(m.get('weight_version', 0))}  "
        f"reward {m.get('reward_mean', 0):.3f}  held-out {acc}  "
        f"staleness {m.get('staleness_mean', 0):.2f}  "
        f"{m.get('rows_read', 0) / max(m.get('step_time_s', 0) + m.get('trainer_wait_s', 0), 1e-9):.0f} rows/s  "
        f"wait {m.get('trainer_wait_s', 0):.2f}s"
    )


def _maintain(ctx: RunContext) -> None:
    """Compact the run's tables so reads stay fast as small commits pile up."""
    try:
        ctx.trajectories().maintain(ctx.flow.policy.name)
        ctx.ledger().maintain()
    except Exception as err:  # maintenance is best effort; data is never at stake here
        log.warning("maintenance skipped: %s", err)
