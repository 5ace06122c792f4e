"""Shared by the benchmarks: one warm-started version 0 that every run starts from."""

from __future__ import annotations

import shutil
from pathlib import Path

from rich.console import Console

from astraflow.flow import load_flow
from astraflow.local import prepare_run, publish_version0
from astraflow.run import RunContext


def version0(flow_path: str, root: Path, console: Console) -> Path:
    """Warm-start once; every benchmark run starts from these exact weights."""
    spec = load_flow(flow_path, {"name": "bench-v0"})
    done = root / "bench-v0" / "weights" / spec.policy.name / "v00000000"
    if (done / "MANIFEST.json").exists():  # delete runs/bench to warm-start again
        console.print(f"reusing version 0 from {done}")
        return done
    ctx = prepare_run(spec, root, overwrite=True)
    import torch

    torch.set_num_threads(2)
    publish_version0(ctx, console)
    return Path(ctx.weights_root) / spec.policy.name / "v00000000"


def seed_version0(ctx: RunContext, v0: Path) -> None:
    """Publish a copy of the cached version 0 into a fresh run's weight store."""
    ws = ctx.weights()
    staging = ws.staging_dir(ctx.flow.policy.name)
    for f in v0.iterdir():
        if f.name != "MANIFEST.json":
            shutil.copy2(f, staging / f.name)
    ws.publish(ctx.flow.policy.name, staging, step=0, version=0)
