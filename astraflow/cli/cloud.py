"""`astraflow launch`, `stop` and `scale`: a flow on the cloud (SkyPilot jobs, Modal calls),
its teardown, and the autoscaler of a run's rollout workers (local, Modal or SkyPilot)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from astraflow.cli.common import fail, open_run, parse_sets

app = typer.Typer()


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
    from astraflow.cloud.jobs import LaunchError
    from astraflow.cloud.launch import launch as start
    from astraflow.cloud.plan import plan
    from astraflow.config.loader import FlowError, load_flow
    from astraflow.policies.prices import load_prices

    try:
        spec = load_flow(flow, parse_sets(set_))
        the_plan = plan(spec)
    except (FlowError, LaunchError) as err:
        fail(str(err))
    try:
        catalog, why = load_prices(prices, cpu=True), ""
    except (FileNotFoundError, ValueError) as err:
        catalog, why = None, str(err)
    typer.echo(the_plan.describe(catalog, no_prices=why))
    if not dry_run and not yes:
        typer.confirm("Launch these (cloud resources cost money)?", abort=True)
    try:
        start(the_plan, dry_run=dry_run, overwrite=overwrite, echo=typer.echo)
    except ModuleNotFoundError as err:
        if err.name not in ("sky", "modal"):
            raise
        if dry_run:  # a dry run that checked nothing must not pass for one that did
            fail(f"dry run incomplete: {'SkyPilot' if err.name == 'sky' else err.name} is not "
                 f"installed, so the SkyPilot tasks above were not built or validated. "
                 f"Install it (pip install -e '.[launch]') and run the dry run again")
        fail(f"launching needs SkyPilot and Modal: pip install -e '.[launch]' ({err})")
    except ValueError as err:  # FlowError, LaunchError, and SkyPilot's own task errors
        fail(str(err))


@app.command()
def stop(
    store: Annotated[str, typer.Argument(help="the s3:// store URI of a run started by "
                                              "`astraflow launch`")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="say what would be cancelled; "
                                                            "cancel nothing")] = False,
) -> None:
    """Tear down a cloud run: cancel its SkyPilot managed jobs and its Modal calls (the
    store, its checkpoints and the deployed Modal app stay; launch again to resume)."""
    from astraflow.cloud.records import stop as stop_run

    try:
        stop_run(store, dry_run=dry_run, echo=typer.echo)
    except ModuleNotFoundError as err:
        if err.name not in ("sky", "modal"):
            raise
        fail(f"this run has {'SkyPilot jobs' if err.name == 'sky' else 'Modal calls'} to "
             f"cancel but {err.name} is not installed: pip install -e '.[launch]' ({err})")
    except (OSError, ValueError) as err:
        fail(f"could not stop {store}: {err}")


@app.command()
def scale(
    target: Annotated[str, typer.Argument(help="a run folder, an s3:// store URI, or a flow YAML "
                                               "(its `runs/<name>/` folder, or its store.uri)")],
    policy: Annotated[str, typer.Option(help="fixed | deadband | cost | module:attr")] = "deadband",
    backend: Annotated[str, typer.Option(help="local | modal | sky")] = "local",
    policy_config: Annotated[str | None, typer.Option(
        "--policy-config", metavar="FILE.yaml|'{k: v}'",
        help="the policy's options: a YAML file or an inline mapping, checked against its "
             "typed config (e.g. '{high: 0.2}' for deadband, '{wait_budget: 0.02}' for cost)"
    )] = None,
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

    target = scale_target(target, runs)
    ctx = open_run(target, "scale", quiet=True)
    setup_logging("scale")
    quiet_libraries()
    logging.getLogger("astraflow.scale").setLevel(logging.INFO)
    from astraflow.registry import make_policy
    from astraflow.scale import Autoscaler, backend_and_pools, plot_scale

    try:
        from astraflow.policies.options import read_options

        options = read_options(policy_config)
        try:
            pol = make_policy(policy, **options)
        except TypeError as err:  # a user's policy given an option it does not take
            raise ValueError(f"--policy-config for {policy}: {err}") from None
        be, pools = backend_and_pools(ctx, target, backend, prices=prices,
                                      max_workers=max_workers, worker_minutes=worker_minutes)
    except (ValueError, FileNotFoundError) as err:
        fail(str(err))
    if refuse_after is not None and refuse_after < 0:
        fail(f"--refuse-after must be >= 0 seconds, got {refuse_after:g}")
    scaler = Autoscaler(ctx, pol, be, pools, interval_s=interval, window_s=window,
                        refuse_after_s=refuse_after)
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID` prints where it is
    from astraflow.local.supervise import stop_flag

    stop = stop_flag()
    scaler.run(should_stop=stop, minutes=minutes, echo=typer.echo)
    from astraflow.stores.uri import is_remote

    if not is_remote(target):
        plot_scale(ctx, Path(target) / "scale.png")
        typer.echo(f"wrote {Path(target) / 'scale.png'}")


def scale_target(target: str, runs: Path) -> str:
    """A flow YAML names its run: its store.uri when remote, else runs/<name>/."""
    if target.endswith((".yaml", ".yml")) and Path(target).is_file():
        from astraflow.config.loader import FlowError, load_flow
        from astraflow.stores.uri import is_remote

        try:
            spec = load_flow(Path(target))
        except FlowError as err:
            fail(str(err))
        uri = str(spec.store.uri) if spec.store.uri else ""
        return uri if uri and is_remote(uri) else str(runs / spec.name)
    return target
