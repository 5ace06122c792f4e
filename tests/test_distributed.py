"""The trainer on several ranks: real torch.distributed (gloo, CPU), FSDP2, DCP, torchrun.

Each test launches `python -m torch.distributed.run --standalone --nproc-per-node 2`
in a subprocess, as the local launcher and a cloud node do, and compares what the
ranks did with what one process does.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from astraflow.context import RunContext
from astraflow.observe.audit import audit_policy
from astraflow.stores import replay
from astraflow.train import checkpoint
from astraflow.train.trainer import Trainer
from tests.dist_step import step
from tests.test_resume import fill, make_ctx, params, train

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]


def env1() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "ASTRAFLOW_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false"}


def torchrun(ranks: int, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    r = subprocess.run([*TORCHRUN, str(ranks), *args], cwd=ROOT, env=env1(),
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-8000:]
    return r


def compare_step(tmp_path: Path, model_dir: Path, **kw) -> None:
    """2 ranks (FSDP2 over gloo) vs this process: same loss, gradient norm and metrics
    (relative 1e-4), and weights within 2% of one update (AdamW's first updates are
    about lr·sign(gradient), so a weight whose gradient is float noise moves by a
    fraction of lr either way; a wrong gradient scale or a missed row moves whole
    updates)."""
    atol = 0.02 * kw["lr"]
    args = [f"--{k.replace('_', '-')}={v}" for k, v in kw.items()]
    torchrun(2, "-m", "tests.dist_step", str(model_dir), str(tmp_path / "two"), *args)
    torch.set_num_threads(1)
    weights, metrics = step(str(model_dir), **kw)
    assert weights is not None
    two = load_file(str(tmp_path / "two" / "weights.safetensors"))
    two_metrics = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert set(two) == set(weights)
    keys = ["loss", "grad_norm", "tokens", "entropy", "logp_mismatch", "updates", "clip_frac"]
    if kw.get("max_update_kl"):
        keys += ["update_kl", "update_scale", "update_kl_bound"]
        assert metrics["update_scale"] < 1.0  # the bound did pull the updates back
    if kw.get("kl_coef"):
        keys.append("kl_ref")
        assert metrics["kl_ref"] > 1e-3  # the reference differs, so the anchor pulls
    if kw.get("entropy_floor"):
        keys.append("entropy_bonus_frac")
        assert metrics["entropy_bonus_frac"] == 1.0  # the batch is under the floor
    for k in keys:
        assert two_metrics[k] == pytest.approx(metrics[k], rel=1e-4, abs=1e-6), k
    before = load_file(str(next(model_dir.glob("*.safetensors"))))
    moved = max(float((weights[k] - before[k]).abs().max()) for k in before)
    assert moved > 10 * atol  # the step did move the weights
    worst = max(float((two[k] - weights[k]).abs().max()) for k in weights)
    assert worst < atol, f"2-rank step differs from 1-process step by {worst}"


def test_two_rank_step_equals_one_process_tiny(tmp_path, tiny_policy_dir):
    """Decoupled objective, 2 minibatches of 3 and 4 rows, 1-row micro-batches: the ranks'
    shares are uneven, one rank runs zero-weighted passes, the proximal pass is sharded."""
    compare_step(tmp_path, tiny_policy_dir, objective="decoupled", minibatches=2,
                 micro_batch_rows=1, rows=7, lr=1e-3)


def test_two_rank_trust_region_equals_one_process(tmp_path, tiny_policy_dir):
    """The update KL bound on 2 ranks: KL measured over both ranks' rows, every shard
    pulled back by the same factor, as in one process; scaled by each minibatch's signal
    rows (3 and 4 of `max_update_kl_rows` 4) alike on every rank."""
    compare_step(tmp_path, tiny_policy_dir, objective="decoupled", minibatches=2,
                 micro_batch_rows=1, rows=7, lr=1e-2, max_update_kl=0.1, max_update_kl_rows=4)


def test_two_rank_kl_anchor_equals_one_process(tmp_path, tiny_policy_dir):
    """The KL anchor on 2 ranks: each rank runs its own rows through the whole reference
    and the penalty's gradient reduces to the one-process one."""
    compare_step(tmp_path, tiny_policy_dir, objective="decoupled", minibatches=2,
                 micro_batch_rows=1, rows=7, lr=1e-3, kl_coef=0.5)


def test_two_rank_entropy_floor_equals_one_process(tmp_path, tiny_policy_dir):
    """The entropy bonus on 2 ranks: every rank decides the hinge from the whole
    minibatch's behaviour logprobs, and a rank's zero-weighted pass adds nothing."""
    compare_step(tmp_path, tiny_policy_dir, objective="decoupled", minibatches=2,
                 micro_batch_rows=1, rows=7, lr=1e-3, entropy_floor=5.0)


@pytest.mark.slow
def test_two_rank_step_equals_one_process_smollm2(tmp_path, smollm2_dir):
    """The real 135M model: one small step, FSDP2 over 2 ranks vs one process."""
    compare_step(tmp_path, smollm2_dir, objective="ppo", rows=4, lr=1e-5)


def test_two_rank_checkpoint_resumes_on_one_rank(tmp_path, tiny_policy_dir):
    """`astraflow train` under torchrun (2 ranks) for 4 steps: sharded DCP checkpoint,
    versions published from gathered weights. Then one process resumes from that
    checkpoint and continues as an uninterrupted single-process run does."""
    a = make_ctx(tmp_path / "a", tiny_policy_dir)
    fill(a, 6)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    torchrun(2, "-m", "astraflow", "train", str(a.run_dir), "--max-steps", "4")
    ck = a.checkpoints().latest("solver")
    assert ck is not None and ck.step == 4 and ck.meta["layout"] == checkpoint.LAYOUT
    assert len([f for f in ck.files if f.endswith(".safetensors")]) == 2  # one per rank

    straight = Trainer(RunContext.open(tmp_path / "b"))
    train(straight, 4)
    # The version the ranks published after their 4th update holds the same weights.
    from astraflow.models.hf import load_policy

    v = a.weights().latest("solver")
    published = load_policy(a.weights().load("solver", v))
    assert a.weights().manifest("solver", v).step == 3  # published during step 3 (0-based)
    worst = max(float((x - y).abs().max()) for x, y in
                zip(params(published), params(straight.model), strict=True))
    assert worst < 1e-5

    resumed = Trainer(RunContext.open(a.run_dir))  # one rank, the same code path
    assert (resumed.step, resumed.cursor) == (straight.step, straight.cursor)
    assert resumed.opt.state_dict()["state"][0]["step"] == 4  # the moments came back
    train(straight, 2)
    train(resumed, 2)
    worst = max(float((x - y).abs().max()) for x, y in
                zip(params(straight.model), params(resumed.model), strict=True))
    assert worst < 1e-5, f"resumed on 1 rank diverged by {worst}"
    rep = audit_policy(resumed.ctx, "solver")
    assert rep.ok, rep.violations
    assert rep.counts["steps"] == 6 and rep.counts["rollbacks"] == 0


@pytest.mark.slow
def test_one_process_checkpoint_resumes_on_two_ranks(tmp_path, tiny_policy_dir):
    """The other way: a single-process checkpoint (one safetensors file) restored into
    FSDP2 shards on 2 ranks, which train on as one process would have."""
    from astraflow.models.hf import load_policy

    a = make_ctx(tmp_path / "a", tiny_policy_dir)
    fill(a, 6)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    first = Trainer(a)
    train(first, 4)
    first.save_checkpoint()
    del first
    assert "state.safetensors" in a.checkpoints().latest("solver").files
    torchrun(2, "-m", "astraflow", "train", str(a.run_dir), "--max-steps", "6")
    straight = Trainer(RunContext.open(tmp_path / "b"))
    train(straight, 6)
    v = a.weights().latest("solver")
    assert a.weights().manifest("solver", v).step == 5  # after the 6th update
    published = load_policy(a.weights().load("solver", v))
    worst = max(float((x - y).abs().max()) for x, y in
                zip(params(published), params(straight.model), strict=True))
    assert worst < 1e-5, f"2 ranks resumed from a 1-process checkpoint diverged by {worst}"
    rep = audit_policy(a, "solver")
    assert rep.ok, rep.violations
    assert rep.counts["steps"] == 6 and rep.counts["rollbacks"] == 0


def _rank_pids(torchrun_pid: int) -> dict[int, int]:
    """RANK → pid of torchrun's worker processes (from /proc)."""
    out: dict[int, int] = {}
    children = Path(f"/proc/{torchrun_pid}/task/{torchrun_pid}/children").read_text().split()
    for c in children:
        try:
            env = Path(f"/proc/{c}/environ").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        for kv in env:
            if kv.startswith(b"RANK="):
                out[int(kv[5:])] = int(c)
    return out


def _progress(run: Path) -> int:
    try:
        return json.loads((run / "store" / "_progress" / "solver.json").read_text())["step"]
    except (FileNotFoundError, json.JSONDecodeError):
        return -1


def _until(cond, timeout: float, what: str, tick=lambda: None) -> None:
    deadline = time.time() + timeout
    while not cond():
        tick()
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.mark.slow
def test_sigkill_one_rank_restarts_the_trainer_and_rolls_back(tmp_path, tiny_policy_dir):
    """A 2-rank trainer supervised as one component. It has rows for 6 steps, so it
    waits after step 5 (checkpoint after step 3): SIGKILL rank 1 there, at a known
    step, not a lucky moment. torchrun ends the other rank, the supervisor restarts
    the whole trainer, which resumes from the checkpoint, voids steps 4-5, retrains
    their rows and, given 4 more batches, finishes 10 steps with a clean audit."""
    from astraflow.local.supervise import Component, Supervisor

    ctx = make_ctx(tmp_path / "run", tiny_policy_dir, checkpoint_every=4)
    fill(ctx, 6)
    run = ctx.run_dir
    comp = Component("trainer-solver", ["train", str(run), "--policy", "solver", "--max-steps",
                                        "10"], 1, run / "logs" / "trainer-solver.log",
                     launcher=["-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node", "2"])
    sup = Supervisor([comp], state_path=run / "components.json")
    sup.start_all()
    try:
        _until(lambda: _progress(run) == 5, 240, "step 5", sup.check)
        assert ctx.checkpoints().steps("solver") == [4]
        first = comp.proc.pid
        ranks = _rank_pids(first)
        assert sorted(ranks) == [0, 1]
        os.kill(ranks[1], signal.SIGKILL)
        _until(lambda: comp.restarts == 1 and comp.alive and comp.proc.pid != first, 120,
               "the trainer restarted", sup.check)
        _until(lambda: replay(ctx.ledger().history("solver")).rollbacks == 1, 240,
               "the rollback", sup.check)
        fill(ctx, 4)
        _until(lambda: comp.finished, 240, "10 steps", sup.check)
    finally:
        sup.stop_all(grace_s=5)
    assert comp.exit_codes[0] != 0 and comp.exit_codes[-1] == 0
    rep = replay(ctx.ledger().history("solver"))
    assert [e.step for e in rep.voided] == [4, 5]
    audit = audit_policy(ctx, "solver")
    assert audit.ok, audit.violations
    assert audit.counts["steps"] == 10 and audit.counts["voided_steps"] == 2
    assert audit.counts["rows_up_to_final_cursor"] == audit.counts["rows_trained"]


@pytest.mark.slow
def test_two_rank_trainer_under_the_local_launcher(tmp_path):
    """`trainer.ranks: 2` through `astraflow run`: rollout workers, a torchrun trainer
    supervised as one component, versions, and a clean audit."""
    from tests.test_integration import FLOW, run_cli

    flow = {**FLOW, "name": "ranks", "trainer": {"ranks": 2},
            "stop": {**FLOW["stop"], "max_steps": 6}}
    r = run_cli(tmp_path, flow)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    run_dir = tmp_path / "runs" / "ranks"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "max_steps"
    log = (run_dir / "logs" / "trainer-solver.log").read_text()
    assert "rank 1 of 2" in log
    audit = subprocess.run([sys.executable, "-m", "astraflow", "audit", str(run_dir), "--json"],
                           capture_output=True, text=True, timeout=120)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    counts = json.loads(audit.stdout)["policies"]["solver"]
    assert counts["steps"] == 6 and counts["violations"] == 0
    ck = RunContext.open(run_dir).checkpoints().latest("solver")
    assert ck is not None and ck.meta["layout"] == checkpoint.LAYOUT
