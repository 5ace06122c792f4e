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


def worker_flow(**rollout: Any) -> dict[str, Any]:
    """The smallest flow a rollout worker runs: one tiny solver on 2-digit sums, batches of
    3 prompts x 2 samples (`rollout` overrides or adds rollout fields)."""
    return {
        "name": "w", "policies": [{"name": "solver", "model": {
            "hidden_size": 64, "layers": 2, "heads": 2, "intermediate_size": 128}}],
        "env": {"digits": 2, "eval_size": 20},
        "rollout": {"prompts_per_batch": 3, "samples_per_prompt": 2, **rollout},
    }
