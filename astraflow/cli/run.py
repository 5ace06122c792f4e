"""`astraflow run`, `check` and `flow-reference`: a whole flow on this machine, and the
flow file checked or documented without running anything."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from astraflow.cli.common import check_engine, fail, parse_sets

app = typer.Typer()


@app.command()
def run(
    flow: Annotated[Path, typer.Argument(help="flow YAML, e.g. examples/math.yaml")],
    mode: Annotated[str | None, typer.Option(help="async (decoupled) or sync (baseline)")] = None,
    runs: Annotated[Path, typer.Option(help="folder holding `runs/<name>/`")] = Path("runs"),
    overwrite: Annotated[bool, typer.Option(help="delete an existing run of this name first")] = False,
    set_: Annotated[list[str], typer.Option("--set", help="override a field: stop.max_steps=50")] = [],  # noqa: B006
) -> None:
    """Run a whole flow on this machine: warm start, workers, trainer, evaluation."""
    from astraflow.config.loader import FlowError, load_flow

    overrides = parse_sets(set_)
    if mode is not None:
        overrides["mode"] = mode
    try:
        spec = load_flow(flow, overrides)
    except FlowError as err:
        fail(str(err))
    check_engine(spec.rollout.engine)
    from astraflow.context import quiet_libraries, setup_logging
    from astraflow.local.launcher import prepare_run, run_local

    setup_logging("launcher")
    quiet_libraries()
    try:
        ctx = prepare_run(spec, runs, overwrite=overwrite)
    except FlowError as err:
        fail(str(err))
    run_local(ctx)


@app.command()
def check(
    flow: Annotated[Path, typer.Argument(help="flow YAML, e.g. examples/math.yaml")],
    set_: Annotated[list[str], typer.Option("--set", help="override a field: stop.max_steps=50")] = [],  # noqa: B006
) -> None:
    """Validate a flow without running anything; print the resolved flow (YAML, every
    default filled in). Exit 0 when valid; exit 2 naming each broken field's path."""
    from astraflow.config.loader import FlowError, load_flow

    try:
        spec = load_flow(flow, parse_sets(set_))
    except FlowError as err:
        fail(str(err))
    typer.echo(spec.dump(), nl=False)




@app.command(name="flow-reference")
def flow_reference() -> None:
    """Print the flow file reference (every field, its type, default and meaning) as
    Markdown; `docs/flow.md` is this output."""
    from astraflow.config.reference import flow_reference as reference

    typer.echo(reference(), nl=False)
