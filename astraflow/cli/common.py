"""What every command module shares: the run argument, `--set` parsing, failing with exit
code 2, and opening a run. Heavy imports (torch, lancedb) stay inside the functions."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

#: How every component command names its run.
RunTarget = Annotated[str, typer.Argument(help="a run folder, or the s3:// store URI of a run "
                                               "published by `astraflow launch`")]


def parse_sets(sets: list[str]) -> dict[str, object]:
    """`--set key=value` overrides, each value read as YAML."""
    import yaml

    out: dict[str, object] = {}
    for s in sets:
        if "=" not in s:
            raise typer.BadParameter(f"--set takes key=value, got {s!r}")
        k, v = s.split("=", 1)
        out[k.strip()] = yaml.safe_load(v)
    return out


def fail(msg: str) -> None:
    """Print `msg` in red on stderr and exit with code 2."""
    typer.secho(msg, fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def check_engine(kind: str) -> None:
    """Fail early, with the install line, when the rollout engine's library is missing."""
    from astraflow.rollout.engine import check_engine as check

    try:
        check(kind)
    except ImportError as err:
        fail(str(err))


def open_run(run_dir: str, component: str, quiet: bool = False):
    """The RunContext of a run folder or store URI, with logging set up for `component`."""
    import os

    from astraflow.config.loader import FlowError
    from astraflow.context import RESOLVED, RunContext, quiet_libraries, setup_logging
    from astraflow.stores.uri import is_remote

    if not is_remote(run_dir) and not (Path(run_dir) / RESOLVED).exists():
        fail(f"{run_dir} is not a run folder (no {RESOLVED}); start one with `astraflow run FLOW`")
    if not quiet:
        setup_logging(component)
    quiet_libraries()
    import torch

    torch.set_num_threads(int(os.environ.get("ASTRAFLOW_THREADS", torch.get_num_threads())))
    try:
        return RunContext.open(run_dir)
    except FlowError as err:
        fail(str(err))
