"""Checkpoints, resume and rollback of the trainer, and the audit, on real stores and torch."""

from __future__ import annotations

import shutil

import pytest
import torch

from astraflow.context import RunContext
from astraflow.observe.audit import audit_policy
from astraflow.stores import CheckpointError, replay
from astraflow.train.trainer import Trainer
from tests.runs import seeded_run
from tests.test_stores import make_rows

BATCH = 8


def make_ctx(run, tiny_policy_dir, **trainer) -> RunContext:
    flow = {
        "name": "r", "policies": [{"name": "solver", "model": {"hidden_size": 64, "layers": 2,
                                                               "heads": 2, "intermediate_size": 128},
                                   "algorithm": {"lr": 0.01, "publish_every": 2}}],
        "env": {"digits": 2, "eval_size": 20},
        "rollout": {"prompts_per_batch": 2, "samples_per_prompt": 4},
        "trainer": {"checkpoint_every": 3, **trainer},
        "store": {"keep_last": 2, "keep_every": 0},
    }
    return seeded_run(run, flow, tiny_policy_dir)


def fill(ctx: RunContext, batches: int) -> None:
    traj = ctx.trajectories()
    for _ in range(batches):
        traj.append("solver", make_rows("solver", BATCH))


def train(tr: Trainer, steps: int) -> None:
    for _ in range(steps):
        sl = tr.poll()
        assert sl is not None
        tr.train_on(sl)


def params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_resume_continues_bit_for_bit(tmp_path, tiny_policy_dir):
    """Stop after 4 steps, restore, train 4 more == 8 uninterrupted steps, exactly."""
    a = make_ctx(tmp_path / "a", tiny_policy_dir)
    fill(a, 8)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    b = RunContext.open(tmp_path / "b")

    straight = Trainer(a)
    train(straight, 8)

    first = Trainer(b)
    train(first, 4)
    first.save_checkpoint()  # what SIGTERM does
    p4 = params(first.model)
    del first
    second = Trainer(b)
    assert (second.step, second.cursor) == (4, b.ledger().entries("solver")[3].cursor_end)
    assert all(torch.equal(x, y) for x, y in zip(p4, params(second.model), strict=True))
    assert second.opt.state_dict()["state"][0]["step"] > 0  # optimizer moments came back
    train(second, 4)
    assert all(torch.equal(x, y) for x, y in
               zip(params(straight.model), params(second.model), strict=True)), \
        "resumed training diverged from the uninterrupted run"
    rep = audit_policy(b, "solver")
    assert rep.ok, rep.violations
    assert rep.counts["steps"] == 8 and rep.counts["rows_up_to_final_cursor"] == 8 * BATCH


def test_steps_after_the_checkpoint_are_rolled_back_and_retrained(tmp_path, tiny_policy_dir):
    ctx = make_ctx(tmp_path / "run", tiny_policy_dir)
    fill(ctx, 8)
    lost = Trainer(ctx)
    train(lost, 5)  # checkpoint after step 2 (every 3); steps 3, 4 are then "killed"
    assert ctx.checkpoints().steps("solver") == [3]
    published = ctx.weights().latest("solver")
    ranges = [(e.cursor_start, e.cursor_end) for e in ctx.ledger().entries("solver")]
    del lost  # SIGKILL: nothing after the last checkpoint survives in memory

    resumed = Trainer(ctx)
    assert resumed.step == 3 and resumed.cursor == ranges[2][1]
    assert resumed.version == published + 1  # restored model republished over lost versions
    ckpt_version = ctx.checkpoints().load("solver", 3).meta["weight_version"]
    assert ctx.weights().manifest("solver", resumed.version).parent == ckpt_version < published
    train(resumed, 3)
    rep = replay(ctx.ledger().history("solver"))
    assert rep.rollbacks == 1 and [e.step for e in rep.voided] == [3, 4]
    assert [(e.cursor_start, e.cursor_end) for e in rep.effective][:5] == ranges
    audit = audit_policy(ctx, "solver")
    assert audit.ok, audit.violations
    assert audit.counts["voided_steps"] == 2
    assert audit.counts["rows_retrained_after_rollback"] == 2 * BATCH
    assert audit.counts["rows_up_to_final_cursor"] == 6 * BATCH


def test_damaged_checkpoint_is_skipped_for_the_previous_one(tmp_path, tiny_policy_dir):
    ctx = make_ctx(tmp_path / "run", tiny_policy_dir, keep_checkpoints=3)
    fill(ctx, 6)
    tr = Trainer(ctx)
    train(tr, 6)  # checkpoints after 3 and 6 steps
    cs = ctx.checkpoints()
    assert cs.steps("solver") == [3, 6]
    f = cs.objects.local("solver/c00000006/state.safetensors")
    f.write_bytes(f.read_bytes()[:-10])  # truncated by a full disk, say
    with pytest.raises(CheckpointError, match="does not match"):
        cs.load("solver", 6)
    resumed = Trainer(ctx)
    assert resumed.step == 3
    audit = audit_policy(ctx, "solver")
    assert not audit.ok and any("c00000006" in v or "step 6" in v for v in audit.violations)
    train(resumed, 3)  # reaching step 6 again replaces the damaged checkpoint
    assert cs.load("solver", 6).meta["steps_done"] == 6
    assert audit_policy(ctx, "solver").ok


def test_audit_catches_duplicates_and_skips(tmp_path, tiny_policy_dir):
    ctx = make_ctx(tmp_path / "run", tiny_policy_dir)
    fill(ctx, 3)
    tr = Trainer(ctx)
    train(tr, 2)
    assert audit_policy(ctx, "solver").ok
    traj = ctx.trajectories()
    # A batch committed twice (what a blind retry of an ambiguous append would do).
    first = ctx.ledger().entries("solver")[0]
    rows = traj.read_range("solver", first.cursor_start, first.cursor_end)
    rows = rows.drop_columns(["_row_created_at_version"])
    assert rows.num_rows == BATCH
    traj.append("solver", rows)
    train(tr, 1)
    rep = audit_policy(ctx, "solver")
    assert any("more than once" in v for v in rep.violations)
    # A ledger step that claims fewer rows than its range holds: rows silently skipped.
    from astraflow.stores import LedgerEntry

    e = ctx.ledger().entries("solver")[-1]
    ctx.ledger().record(LedgerEntry(policy="solver", step=e.step + 1, cursor_start=e.cursor_end,
                                    cursor_end=e.cursor_end + 1, rows_read=0, rows_used=0,
                                    rows_stale=0, rows_filtered=0, optimizer_step=False,
                                    weight_version=e.weight_version))
    assert any("silently skipped" in v for v in audit_policy(ctx, "solver").violations)
    import subprocess
    import sys

    cli = subprocess.run([sys.executable, "-m", "astraflow", "audit", str(ctx.run_dir)],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 1
    assert "VIOLATION" in cli.stderr and "more than once" in cli.stderr
    assert "duplicate_rows 8" in cli.stdout


def test_sigterm_checkpoints_within_the_grace_period(tmp_path, tiny_policy_dir):
    """A spot notice (SIGTERM) mid-run: the trainer process finishes its step, checkpoints
    exactly where the ledger ends and exits 0; its successor needs no rollback."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    ctx = make_ctx(tmp_path / "run", tiny_policy_dir, checkpoint_every=1000)
    fill(ctx, 60)
    proc = subprocess.Popen([sys.executable, "-m", "astraflow", "train", str(ctx.run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "ASTRAFLOW_THREADS": "1"}, start_new_session=True)
    progress = ctx.run_dir / "store" / "_progress" / "solver.json"
    deadline = time.time() + 120
    while not progress.exists() or json.loads(progress.read_text())["step"] < 5:
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    # No wall-clock bound: on a loaded 2-core machine interpreter exit alone can take
    # seconds. What matters is that it stops where it is (steps < 60 below), checkpoints
    # exactly there and exits 0; the timeout only guards against a hang.
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    steps = len(ctx.ledger().entries("solver"))
    assert 5 < steps < 60 and ctx.checkpoints().steps("solver") == [steps]
    resumed = Trainer(ctx)
    assert resumed.step == steps
    assert replay(ctx.ledger().history("solver")).rollbacks == 0
