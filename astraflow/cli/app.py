"""The `astraflow` command: one typer app made of the command groups in this package.

Thin: each command parses its arguments, then calls one function; heavy imports (torch,
lancedb) happen inside commands, so `astraflow --help` answers at once. Groups:
`run` (a whole flow here, check, reference), `components` (rollout, train, eval),
`observe` (status, inspect, export, dashboard, audit), `cloud` (launch, stop, scale)
and `models` (models import).
"""

from __future__ import annotations

from typing import Annotated

import typer

from astraflow.cli import cloud, components, models, observe, run

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode="markdown",
                  help="AstraFlow: decoupled RL for LLM policies over a shared store.")
app.add_typer(run.app)
app.add_typer(components.app)
app.add_typer(observe.app)
app.add_typer(cloud.app)


@app.command(hidden=True)
def zygote(
    label: Annotated[str, typer.Option(help="the run folder (names this process and its forks)")] = "",
) -> None:
    """The local supervisor's fork server: import the heavy libraries once, then fork one
    ready component per JSON line {argv, env, log} read from stdin (see supervise.Zygote)."""
    from astraflow.local.zygote import serve

    serve(lambda argv: app(args=argv, prog_name="astraflow"))


app.add_typer(models.app, name="models")
