"""A run folder seeded with a published tiny policy, for tests that drive one component."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from astraflow.config.loader import parse_flow
from astraflow.context import RESOLVED, RunContext


def seeded_run(run: Path, flow: dict[str, Any], policy_dir: Path, *,
               versions: int = 1, every_policy: bool = False) -> RunContext:
    """Write `flow` as the run's resolved flow and publish `policy_dir` as versions
    0..versions-1 of its primary policy (of every policy with `every_policy`: a
    multi-policy worker needs a version of each before it starts a batch)."""
    spec = parse_flow(flow)
    run.mkdir(parents=True, exist_ok=True)
    (run / RESOLVED).write_text(spec.dump())
    ctx = RunContext(spec, run)
    ws = ctx.weights()
    names = spec.policy_names() if every_policy else [spec.policy.name]
    for name in names:
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


def check_staged_until_read(ctx: RunContext, worker_id: str) -> None:
    """Under `store.write_mode: staged` a worker's two batches (6 rows each) are staged
    (data files and a marker, no commit) and count as backlog; the trainer's read
    (`read_after`) commits both in one table version and reads each row once."""
    from astraflow.rollout.worker import RolloutWorker

    traj = ctx.trajectories()
    assert traj.write_mode == "staged"
    w = RolloutWorker(ctx, worker_id)
    assert w.refresh_weights()
    v = traj.latest_version("solver")
    assert w.produce_batch() == 6 and w.produce_batch() == 6
    assert traj.latest_version("solver") == v  # no writer commits
    assert traj.pending("solver") == 12 and traj.count("solver") == 12
    sl = traj.read_after("solver", v, min_rows=1)
    assert traj.latest_version("solver") == v + 1  # both batches in one commit
    assert traj.pending("solver") == 0 and sl.num_rows == 12 and sl.end == v + 1
    assert len(set(sl.rows.column("traj_id").to_pylist())) == 12
    assert traj.read_after("solver", sl.end, min_rows=1) is None
