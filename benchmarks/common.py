"""Shared by the benchmarks: one warm-started version 0 per policy that every run starts from."""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path
from typing import Any

from rich.console import Console

from astraflow.config.loader import load_flow
from astraflow.context import RESOLVED, RunContext
from astraflow.local.launcher import prepare_run, run_local
from astraflow.train.version0 import publish_version0


def version0(flow_path: str, root: Path, console: Console,
             overrides: dict[str, Any] | None = None) -> dict[str, Path]:
    """Warm-start every policy of the flow once; every benchmark run starts from these
    exact weights. Cached under `root/v0-<flow name>/` while the flow is unchanged."""
    base = load_flow(flow_path, overrides)
    spec = load_flow(flow_path, {**(overrides or {}), "name": f"v0-{base.name}"})
    run_dir = root / spec.name
    out = {p: Path(RunContext(spec, run_dir).weights_root) / p / "v00000000"
           for p in spec.policy_names()}
    same = (run_dir / RESOLVED).exists() and (run_dir / RESOLVED).read_text() == spec.dump()
    if same and all((d / "MANIFEST.json").exists() for d in out.values()):
        console.print(f"reusing version 0 from {run_dir} (delete it to warm-start again)")
        return out
    ctx = prepare_run(spec, root, overwrite=True)
    import torch

    torch.set_num_threads(2)
    publish_version0(ctx, console)
    return out


def seed_version0(ctx: RunContext, v0: dict[str, Path]) -> None:
    """Publish a copy of each cached version 0 into a fresh run's weight store."""
    ws = ctx.weights()
    for policy in ctx.flow.policy_names():
        staging = ws.staging_dir(policy)
        for f in v0[policy].iterdir():
            if f.name != "MANIFEST.json":
                shutil.copy2(f, staging / f.name)
        ws.publish(policy, staging, step=0, version=0)


def run_from_version0(flow_path: str, root: Path, v0: dict[str, Path],
                      overrides: dict[str, Any]) -> tuple[RunContext, dict[str, Any]]:
    """A fresh run of the flow (with `overrides`) from the cached version 0, in this
    process; returns its context and summary."""
    ctx = prepare_run(load_flow(flow_path, overrides), root, overwrite=True)
    seed_version0(ctx, v0)
    return ctx, run_local(ctx, Console(quiet=True))


def steady_rates(ctx: RunContext) -> dict[str, dict[str, float]]:
    """Each policy's own pace between its first and last step: process start-up and warm
    start excluded, and not diluted by waiting for the slowest trainer to finish."""
    out = {}
    for p in ctx.flow.policy_names():
        entries = sorted(ctx.ledger().entries(p), key=lambda e: e.time)
        span = max(entries[-1].time - entries[0].time, 1e-9)
        out[p] = {"steps_per_s": (len(entries) - 1) / span,
                  "rows_per_s": sum(e.rows_read for e in entries[1:]) / span}
    return out


def metric_means(ctx: RunContext, names: list[tuple[str, str]],
                 policy: str | None = None,
                 rows: list[dict[str, Any]] | None = None) -> dict[str, float]:
    """Mean of each (component, metric) over a run's metrics table (one read), keyed
    `component.metric`; `policy` narrows it to that policy's rows. Where the time of a
    step or a batch went, for the benchmarks' breakdowns. `rows`: the table already
    read by the caller."""
    if rows is None:
        rows = ctx.ledger().read_metrics().to_pylist()
    out: dict[str, float] = {}
    for comp, name in names:
        vals = [r["value"] for r in rows if r["component"] == comp and r["name"] == name
                and (policy is None or r["policy"] == policy)]
        if vals:
            out[f"{comp}.{name}"] = statistics.mean(vals)
    return out


def time_to(summary: dict[str, Any], target: float) -> float | None:
    """Seconds until the live held-out accuracy of the run's primary policy first
    reached `target` (None: never)."""
    for e in summary["live_eval"]:
        if e["accuracy"].get(summary["policy"], 0.0) >= target:
            return e["t"]
    return None


def row_fates(ctx: RunContext) -> dict[str, dict[str, float]]:
    """Per policy, what became of every row the workers generated (counts, so valid on a
    loaded machine). generated = appended + shed (workers before issue 36 threw a closed
    policy's finished rows away) + fed (generated only as another role's input, its own
    trainer done); trained = used by a step. Never trained, system waste: shed, fed,
    stale (dropped by the staleness stage) and left (appended, never read before the run
    stopped). Filtered rows (zero-variance groups) are an algorithmic choice, reported
    apart. not_started: rows the workers did not generate for a closed policy."""
    metrics = ctx.ledger().read_metrics().to_pylist()
    entries = ctx.ledger().entries()
    out = {}
    for p in ctx.flow.policy_names():
        def total(name: str, p: str = p) -> int:
            return int(sum(r["value"] for r in metrics
                           if r["component"] == "rollout" and r["policy"] == p
                           and r["name"] == name))
        mine = [e for e in entries if e.policy == p]
        appended = ctx.trajectories().count(p)
        f = {"appended": appended, "shed": total("rows_shed"), "fed": total("rows_fed"),
             "not_started": total("rows_not_started"),
             "read": sum(e.rows_read for e in mine), "trained": sum(e.rows_used for e in mine),
             "stale": sum(e.rows_stale for e in mine),
             "filtered": sum(e.rows_filtered for e in mine)}
        f["left"] = appended - f["read"]
        f["generated"] = appended + f["shed"] + f["fed"]
        f["waste"] = f["shed"] + f["fed"] + f["stale"] + f["left"]
        f["waste_frac"] = f["waste"] / f["generated"] if f["generated"] else 0.0
        out[p] = f
    return out


def fates_table(console: Console, label: str, fates: dict[str, dict[str, float]]) -> None:
    """One line per policy of `row_fates`, and the run's total waste fraction."""
    cols = ("generated", "trained", "filtered", "shed", "fed", "stale", "left", "not_started")
    for p, f in fates.items():
        console.print(f"{label:>22} {p:>10} " + " ".join(f"{int(f[c]):>11}" for c in cols)
                      + f" {f['waste_frac']:>7.1%}")
    gen = sum(f["generated"] for f in fates.values())
    waste = sum(f["waste"] for f in fates.values())
    console.print(f"{label:>22} {'all':>10} {int(gen):>11} {'':>83} "
                  f"{waste / gen if gen else 0.0:>7.1%}")


def fates_header(console: Console) -> None:
    console.print("rows per policy (counts): waste = shed + fed + stale + left, over generated; "
                  "filtered (zero-variance groups) is algorithmic, not counted")
    cols = ("generated", "trained", "filtered", "shed", "fed", "stale", "left", "not_started")
    console.print(f"{'run':>22} {'policy':>10} " + " ".join(f"{c:>11}" for c in cols)
                  + f" {'waste':>7}")
