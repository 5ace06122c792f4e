"""A run folder seeded with a published tiny policy, for tests that drive one component."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from astraflow.flow import parse_flow
from astraflow.run import RESOLVED, RunContext


def seeded_run(run: Path, flow: dict[str, Any], policy_dir: Path, *,
               versions: int = 1) -> RunContext:
    """Write `flow` as the run's resolved flow and publish `policy_dir` as versions
    0..versions-1 of its primary policy."""
    spec = parse_flow(flow)
    run.mkdir(parents=True, exist_ok=True)
    (run / RESOLVED).write_text(spec.dump())
    ctx = RunContext(spec, run)
    ws, name = ctx.weights(), spec.policy.name
    for _ in range(versions):
        staging = ws.staging_dir(name)
        for f in policy_dir.iterdir():
            shutil.copy(f, staging)
        ws.publish(name, staging, step=0)
    return ctx
