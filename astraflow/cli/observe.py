"""`astraflow status`, `inspect`, `export`, `dashboard` and `audit`: read a run from its
store (local or remote) while it runs or after; none of them writes to it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from astraflow.cli.common import RunTarget, fail, open_run

app = typer.Typer()


@app.command()
def status(
    run_dir: RunTarget,
    as_json: Annotated[bool, typer.Option("--json", help="ledger totals per policy as JSON "
                                                        "(the shape is in the README)")] = False,
    watch: Annotated[float | None, typer.Option(help="refresh every this many seconds "
                                                     "until Ctrl-C")] = None,
) -> None:
    """A run's progress per policy (step, version, reward and held-out metric with their
    trend, rows/s, staleness, trainer wait), its components and rollout pools; read from
    its store, so it works from any machine for a cloud run."""
    ctx = open_run(run_dir, "status", quiet=True)
    from rich.console import Console

    from astraflow.observe.status import render, status_json
    from astraflow.observe.view import RunView

    view = RunView(ctx)
    if as_json:
        typer.echo(json.dumps(status_json(view.refresh()), indent=2))
        return
    console = Console()
    if watch is None:
        console.print(render(view.refresh()))
        return
    import time

    from rich.live import Live

    with Live(render(view.refresh()), console=console, auto_refresh=False) as live:
        try:
            while True:
                time.sleep(max(watch, 0.5))
                live.update(render(view.refresh()), refresh=True)
        except KeyboardInterrupt:
            pass


@app.command()
def inspect(
    run_dir: RunTarget,
    policy: Annotated[str | None, typer.Option(help="policy (default: the flow's first)")] = None,
    version: Annotated[int | None, typer.Option(help="only rows sampled by this weight "
                                                     "version")] = None,
    where: Annotated[str | None, typer.Option(help="SQL filter on the trajectory table, e.g. "
                                                   "\"reward < 1 AND worker = 'w0'\"")] = None,
    limit: Annotated[int, typer.Option(help="newest this many episodes")] = 5,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per episode")] = False,
) -> None:
    """Read a run's newest episodes, decoded: prompt, each turn (generated, or read: tool
    results, other roles), reward, advantage, finish reason, behaviour version."""
    ctx = open_run(run_dir, "inspect", quiet=True)
    from rich.console import Console

    from astraflow.observe.inspect import InspectError, decode, query, render

    pol = policy or ctx.flow.policy_names()[0]
    try:
        eps = decode(ctx, pol, query(ctx, pol, version=version, where=where, limit=limit))
    except InspectError as err:
        fail(str(err))
    if as_json:
        for ep in eps:
            typer.echo(json.dumps(ep.to_json()))
        return
    console = Console()
    for ep in eps:
        console.print(render(ep))
    console.print(f"{len(eps)} episode(s) of {pol}" + (f" where {where}" if where else "")
                  + (f" at v{version}" if version is not None else ""), style="dim")
    staged = ctx.trajectories().pending(pol)
    if staged:  # `store.write_mode: staged` (S3's default): not in the table until read
        console.print(f"{staged} more row(s) staged: they show once the trainer has read "
                      "(and so committed) them", style="dim")


@app.command()
def export(
    run_dir: RunTarget,
    to: Annotated[str, typer.Option("--to", help="tensorboard | wandb")],
    logdir: Annotated[Path | None, typer.Option(help="TensorBoard folder (default: "
                                                     "<run folder>/tensorboard-export)")] = None,
    run_id: Annotated[str | None, typer.Option(help="W&B run id (default: a new run)")] = None,
    follow: Annotated[bool, typer.Option(help="keep following the run's new metrics "
                                              "until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option(help="seconds between reads with --follow")] = 5.0,
) -> None:
    """Replay a run's metrics table (finished, live, or remote) into TensorBoard event
    files or a W&B run."""
    ctx = open_run(run_dir, "export", quiet=True)
    import time

    from astraflow.observe import sinks

    try:
        sink, where = sinks.export_sink(ctx, to, logdir=logdir, run_id=run_id)
    except sinks.UnknownSink as err:
        fail(str(err))
    except ImportError as err:
        fail(f"{err.name} is not installed: pip install -e '.[{to}]'")
    follower = sinks.Follower(ctx, [sink])
    follower.poll()
    try:
        while follow:
            time.sleep(interval)
            follower.poll()
    except KeyboardInterrupt:
        pass
    follower.close()
    if follower.sinks[0] is None:
        fail(f"export to {to} failed (see the warnings above)")
    typer.echo(f"exported {follower.points} points to {where}")


@app.command()
def dashboard(
    run_dir: RunTarget,
    port: Annotated[int, typer.Option(help="port on 127.0.0.1 (0: any free one)")] = 8765,
    refresh: Annotated[float, typer.Option(help="seconds between store reads")] = 5.0,
    audit_every: Annotated[float, typer.Option(help="seconds between audits (0: never)")] = 120.0,
) -> None:
    """A live web page of a run on 127.0.0.1 (works offline): curves per policy, workers
    per pool, staleness, the newest episodes and the audit's verdict."""
    ctx = open_run(run_dir, "dashboard", quiet=True)
    try:
        from astraflow.observe.dashboard import serve
    except ImportError as err:
        fail(f"{err.name} is not installed: pip install -e '.[dashboard]'")
    serve(ctx, port=port, refresh_s=refresh, audit_every_s=audit_every, echo=typer.echo)


@app.command()
def audit(
    run_dir: RunTarget,
    as_json: Annotated[bool, typer.Option("--json", help="print {flow, ok, policies: {policy: "
                                                         "{counts…, problems}}} as JSON")
                       ] = False,
) -> None:
    """Verify exactly-once from the store: ledger, trajectory tables, weights, checkpoints.

    Exits 1 on any violation (duplicated or silently lost rows, overlapping
    steps, non-monotonic or unverifiable weight versions, damaged checkpoints)."""
    ctx = open_run(run_dir, "audit", quiet=True)
    from astraflow.observe.audit import audit as run_audit

    reports = run_audit(ctx)
    if as_json:
        typer.echo(json.dumps({"flow": ctx.flow.name, "ok": all(r.ok for r in reports),
                               "policies": {r.policy: {**r.counts, "problems": r.violations}
                                            for r in reports}}, indent=2))
    else:
        for r in reports:
            typer.echo(f"policy {r.policy}: " + ", ".join(f"{k} {v}" for k, v in r.counts.items()))
            for v in r.violations:
                typer.secho(f"  VIOLATION: {v}", fg=typer.colors.RED, err=True)
            typer.echo(f"policy {r.policy}: " + ("OK" if r.ok else
                                                 f"{len(r.violations)} violation(s)"))
    if not all(r.ok for r in reports):
        raise typer.Exit(1)
