"""Policies as LoRA adapters on one shared frozen base (`model.shared_base`), for real:
the flow's checks, the hf engine that holds the base once and serves each policy's
adapter at its own version (equal to that policy's merged weights), the worker on it,
and one trainer process training several adapters, each with its own optimizer,
cursor, ledger, checkpoints and versions."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from astraflow.config.loader import FlowError, parse_flow
from astraflow.context import RESOLVED, RunContext
from astraflow.models import lora
from astraflow.models.hf import carried_files, load_policy, save_policy
from astraflow.rollout.adapters import SharedAdapters
from astraflow.rollout.engine import HFEngine
from tests.test_multi_policy import MP_FLOW

TINY = {"hidden_size": 64, "layers": 2, "heads": 2, "intermediate_size": 128}
PROMPTS = [[1, 5, 6, 7], [1, 9, 8], [1, 4, 4, 4, 6]]


def shared_flow(**over) -> dict:
    """Solver and verifier as rank-2 adapters on one tiny base `b`."""
    model = {**TINY, "lora": {"r": 2}, "shared_base": "b"}
    flow = {
        "name": "shared", "policies": [
            {"name": "solver", "model": model, "warm_start": {"max_steps": 0},
             "algorithm": {"lr": 0.01, "publish_every": 1}},
            {"name": "verifier", "model": model,
             "warm_start": {"init_from": "solver", "max_steps": 0},
             "algorithm": {"lr": 0.01, "publish_every": 1}}],
        "workflow": {"name": "solver_verifier", "params": {"verifiers": 1, "judge_samples": 1}},
        "env": {"digits": 2, "eval_size": 20},
        "rollout": {"prompts_per_batch": 2, "samples_per_prompt": 2},
        "trainer": {"checkpoint_every": 2},
    }
    flow.update(over)
    return flow


def open_shared(run: Path, policy_dir: Path, flow: dict | None = None) -> RunContext:
    """The run with `policy_dir` published as version 0 of every policy."""
    spec = parse_flow(flow or shared_flow())
    run.mkdir(parents=True, exist_ok=True)
    (run / RESOLVED).write_text(spec.dump())
    ctx = RunContext(spec, run)
    ws = ctx.weights()
    for name in spec.policy_names():
        staging = ws.staging_dir(name)
        for f in policy_dir.iterdir():
            shutil.copy(f, staging)
        ws.publish(name, staging, step=0, version=0)
    return ctx


def publish_adapter(ctx: RunContext, policy: str, seed: int) -> Path:
    """A version of `policy`: rank-2 adapters on its version 0 with random (non-zero)
    factors drawn from `seed`, published as the trainer would."""
    ws = ctx.weights()
    v0 = ws.load(policy, 0)
    model = load_policy(v0, lora=ctx.flow.policy_spec(policy).model.lora)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    staging = ws.staging_dir(policy)
    save_policy(model, staging, source=carried_files(v0))
    version = ws.publish(policy, staging, step=1)
    return ws.load(policy, version)


def assert_same_generation(a: HFEngine | object, b: HFEngine, prompts=PROMPTS) -> None:
    ga = a.generate(prompts, max_new_tokens=6, greedy=True)
    gb = b.generate(prompts, max_new_tokens=6, greedy=True)
    assert ga.completions == gb.completions
    diff = max(abs(x - y) for la, lb in zip(ga.logprobs, gb.logprobs, strict=True)
               for x, y in zip(la, lb, strict=True))
    assert diff < 1e-4, diff


def adapter_tensors(shared: SharedAdapters, policy: str) -> dict[str, torch.Tensor]:
    return {n: p for n, p in shared.model.named_parameters() if f".{policy}." in n}


def test_flow_checks_shared_bases():
    spec = parse_flow(shared_flow())
    assert spec.shared_bases() == {"b": ["solver", "verifier"]}
    bad = shared_flow()
    bad["policies"][0]["warm_start"] = {"max_steps": 10}  # the solver's v0 is warm-started
    bad["policies"][1]["warm_start"] = {"max_steps": 0}  # the verifier's is not
    with pytest.raises(FlowError, match="version 0 must be solver's"):
        parse_flow(bad)
    bad = shared_flow()
    bad["policies"][1]["model"] = {**TINY, "layers": 3, "lora": {"r": 2}, "shared_base": "b"}
    bad["policies"][1]["warm_start"] = {"max_steps": 0}
    with pytest.raises(FlowError, match="models differ"):
        parse_flow(bad)
    bad = shared_flow()
    bad["policies"][0]["model"] = {**TINY, "shared_base": "b"}
    with pytest.raises(FlowError, match="add `lora:`"):
        parse_flow(bad)
    with pytest.raises(FlowError, match="vLLM multi-LoRA serving is not built"):
        parse_flow(shared_flow(rollout={"engine": "vllm"}))
    bad = shared_flow()
    for p in bad["policies"]:
        p["model"] = {**p["model"], "shared_base": "solver"}
    with pytest.raises(FlowError, match="also a policy's name"):
        parse_flow(bad)
    bad = shared_flow()
    bad["policies"][1]["algorithm"] = {"kl_coef": 0.1}
    with pytest.raises(FlowError, match="kl_coef"):
        parse_flow(bad)
    # Different ranks on one base are fine: each adapter has its own config.
    ok = shared_flow()
    ok["policies"][1]["model"] = {**TINY, "lora": {"r": 4}, "shared_base": "b"}
    assert parse_flow(ok).shared_bases()["b"] == ["solver", "verifier"]


def test_one_base_serves_each_policy_as_its_merged_weights(tmp_path, tiny_policy_dir):
    ctx = open_shared(tmp_path / "run", tiny_policy_dir)
    ws = ctx.weights()
    s1, v1 = publish_adapter(ctx, "solver", 1), publish_adapter(ctx, "verifier", 2)
    shared = SharedAdapters(ws.load("solver", 0))
    plain = sum(p.numel() for p in load_policy(ws.load("solver", 0)).parameters())
    solver = shared.engine_for("solver", ws.load("solver", 0))  # version 0: the base itself
    verifier = shared.engine_for("verifier", v1)
    base = HFEngine.from_dir(ws.load("solver", 0))
    assert_same_generation(solver, base)
    solver.load_weights(s1)
    # Each policy generates what its own merged weights generate, in any order.
    for eng, path in [(solver, s1), (verifier, v1), (solver, s1)]:
        assert_same_generation(eng, HFEngine.from_dir(path))
    # The two policies really differ, and differ from the base.
    a = solver.generate(PROMPTS, max_new_tokens=6, greedy=True).logprobs
    b = verifier.generate(PROMPTS, max_new_tokens=6, greedy=True).logprobs
    assert a != b
    # One copy of the base: its parameters are the plain model's, once; no merged copy.
    held = shared.base_parameters()
    assert sum(p.numel() for p in held) == plain
    assert len({p.data_ptr() for p in held}) == len(held)
    assert not any(lora.is_peft(m) for m in (base.model,)) and lora.is_peft(shared.peft)
    assert {n.split(".")[-2] for n, _ in shared.model.named_parameters() if ".lora_A." in n} \
        == {"solver", "verifier"}
    # A new solver version swaps the solver's adapter only: base and verifier untouched.
    before = {n: (p.data_ptr(), p.detach().clone())
              for n, p in shared.model.named_parameters() if ".solver." not in n}
    s2 = publish_adapter(ctx, "solver", 3)
    solver.load_weights(s2)
    after = dict(shared.model.named_parameters())
    assert all(after[n].data_ptr() == ptr and torch.equal(after[n], t)
               for n, (ptr, t) in before.items())
    assert_same_generation(solver, HFEngine.from_dir(s2))
    assert_same_generation(verifier, HFEngine.from_dir(v1))
    # Back to the base (a full version with the base's weights): adapters off for it.
    solver.load_weights(ws.load("solver", 0))
    assert_same_generation(solver, base)
    assert_same_generation(verifier, HFEngine.from_dir(v1))


def test_a_different_base_is_refused(tmp_path, tiny_policy_dir):
    ctx = open_shared(tmp_path / "run", tiny_policy_dir)
    shared = SharedAdapters(ctx.weights().load("solver", 0))
    other = tmp_path / "other"
    shutil.copytree(tiny_policy_dir, other)
    model = load_policy(other)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    save_policy(model, other, source=other)
    with pytest.raises(ValueError, match="not the shared base"):
        shared.engine_for("verifier", other)


def test_worker_holds_one_base_for_both_policies(tmp_path, tiny_policy_dir):
    from astraflow.rollout.worker import RolloutWorker

    ctx = open_shared(tmp_path / "run", tiny_policy_dir)
    publish_adapter(ctx, "verifier", 2)
    w = RolloutWorker(ctx, "w0")
    assert w.refresh_weights()
    assert w.versions == {"solver": 0, "verifier": 1}
    assert list(w.shared) == ["b"]
    assert {id(e.shared) for e in w.engines.values()} == {id(w.shared["b"])}
    w.open = {"solver", "verifier"}
    assert w.produce_batch() > 0
    rows = ctx.trajectories().read_after("verifier", 0, min_rows=1, max_rows=100)
    assert rows is not None and set(rows.rows.column("behavior_version").to_pylist()) == {1}
    publish_adapter(ctx, "solver", 1)
    assert w.refresh_weights(["solver"]) and w.versions["solver"] == 1
    assert_same_generation(w.engines["solver"], HFEngine.from_dir(ctx.weights().load("solver", 1)))


def test_evaluators_share_the_base(tmp_path, tiny_policy_dir):
    from astraflow.local.evaluate import Evaluator

    ctx = open_shared(tmp_path / "run", tiny_policy_dir)
    publish_adapter(ctx, "verifier", 2)
    shared: dict = {}
    evs = [Evaluator(ctx, p, shared=shared) for p in ("solver", "verifier")]
    assert list(shared) == ["b"] and all(ev.engine.shared is shared["b"] for ev in evs)
    alone = Evaluator(ctx, "verifier")  # without `shared`: its own merged engine
    assert evs[1](1, 10) == alone(1, 10)
    assert 0.0 <= evs[0](0, 10) <= 1.0


def fill_both(ctx: RunContext, batches: int) -> None:
    from tests.test_stores import make_rows

    for p in ctx.flow.policy_names():
        for _ in range(batches):
            ctx.trajectories().append(p, make_rows(p, ctx.flow.batch_rows(p)))


def step_all(trainers, steps: int) -> None:
    for _ in range(steps):
        for tr in trainers:
            sl = tr.poll()
            assert sl is not None
            tr.train_on(sl)


def test_one_process_trains_each_adapter_as_its_own_trainer_would(tmp_path, tiny_policy_dir):
    """Two AdapterTrainers on one base: one copy of it, each optimizer on its own
    factors, and each policy's versions equal to those of a lone LoRA trainer of it on
    the same rows; checkpoints hold one adapter each and resume per policy."""
    from astraflow.stores import replay
    from astraflow.train.adapters import AdapterTrainer, trainers_for
    from astraflow.train.trainer import Trainer

    shared_ctx = open_shared(tmp_path / "shared", tiny_policy_dir)
    fill_both(shared_ctx, 3)
    shutil.copytree(tmp_path / "shared", tmp_path / "alone")
    alone_ctx = RunContext(shared_ctx.flow, tmp_path / "alone")
    trainers = trainers_for(shared_ctx, ["solver", "verifier"])
    assert all(isinstance(t, AdapterTrainer) for t in trainers)
    solver, verifier = trainers
    assert solver.model is verifier.model and solver.base is verifier.base
    plain = sum(p.numel() for p in load_policy(tiny_policy_dir).parameters())
    assert sum(p.numel() for p in solver.base.base_parameters()) == plain  # the base, once
    own = [{id(p) for g in t.opt.param_groups for p in g["params"]} for t in trainers]
    assert own[0] and own[1] and not own[0] & own[1]
    base_before = [p.detach().clone() for p in solver.base.base_parameters()]
    verifier_before = {n: p.detach().clone() for n, p in verifier.model.named_parameters()
                       if ".verifier." in n}
    step_all([solver], 1)  # the solver's step moves the solver's factors only
    assert all(torch.equal(p, verifier_before[n]) for n, p in verifier.model.named_parameters()
               if ".verifier." in n)
    step_all([verifier], 1)
    step_all(trainers, 1)
    assert all(torch.equal(a, b) for a, b in zip(base_before, solver.base.base_parameters(),
                                                  strict=True))
    ws = shared_ctx.weights()
    for name in ("solver", "verifier"):
        assert ws.versions(name) == [0, 1, 2]
        assert lora.is_adapter(ws.load(name, 2))
        history = replay(shared_ctx.ledger().history(name)).effective
        assert [e.step for e in history] == [0, 1]
    # The same rows through a lone LoRA trainer per policy give the same versions.
    for name in ("solver", "verifier"):
        alone = Trainer(alone_ctx, name)
        assert not isinstance(alone, AdapterTrainer)
        step_all([alone], 2)
        a = lora.factors(ws.load(name, 2))[1]
        b = lora.factors(alone_ctx.weights().load(name, 2))[1]
        assert a.keys() == b.keys()
        for k in a:
            for x, y in zip(a[k], b[k], strict=True):
                assert torch.allclose(x, y, atol=1e-6), (name, k, (x - y).abs().max())
        del alone
    # Checkpoints: one adapter each; a new process resumes each where it stood.
    for t in trainers:
        t.save_checkpoint()
    ck = shared_ctx.checkpoints().latest("solver")
    from safetensors.torch import load as st_load
    keys = [k for k in st_load(ck.files["state.safetensors"]) if k.startswith("model/")]
    assert keys and all(".lora_" in k and ".verifier." not in k for k in keys)
    want = {t.policy: {n: p.detach().clone() for n, p in t.model.named_parameters()
                       if f".{t.policy}." in n} for t in trainers}
    fill_both(shared_ctx, 1)
    again = trainers_for(shared_ctx, ["solver", "verifier"])
    for t in again:
        assert (t.step, t.version) == (2, 2)
        assert all(torch.equal(p, want[t.policy][n]) for n, p in t.model.named_parameters()
                   if f".{t.policy}." in n)
    step_all(again, 1)
    assert [t.version for t in again] == [3, 3]


def test_sync_mode_and_the_cli_use_one_base(tmp_path, tiny_policy_dir):
    from safetensors.torch import load as st_load
    from typer.testing import CliRunner

    from astraflow.cli.app import app
    from astraflow.local.sync import run_sync

    ctx = open_shared(tmp_path / "run", tiny_policy_dir, shared_flow(stop={"max_steps": 2}))
    assert run_sync(ctx) == 2
    for p in ("solver", "verifier"):
        assert [e.step for e in ctx.ledger().entries(p)] == [0, 1]
        # Its checkpoint holds its own adapter alone: it was trained on the shared base.
        ck = ctx.checkpoints().latest(p)
        keys = [k for k in st_load(ck.files["state.safetensors"]) if k.startswith("model/")]
        assert keys and all(".lora_" in k for k in keys)
    res = CliRunner().invoke(app, ["train", str(tmp_path / "run"), "--shared-base", "nope"])
    assert res.exit_code != 0 and "shared bases: b" in res.output
    res = CliRunner().invoke(app, ["train", str(tmp_path / "run"), "--shared-base", "b",
                                   "--policy", "solver"])
    assert res.exit_code != 0 and "give neither --policy" in res.output


def _adapter(policy: dict) -> dict:
    """A policy of MP_FLOW as a rank-2 LoRA adapter on base `b`, at a learning rate an
    adapter moves with."""
    return {**policy, "model": {**policy["model"], "lora": {"r": 2}, "shared_base": "b"},
            "algorithm": {"lr": 0.01}}


# The multi-policy kill test's flow with both policies as adapters on one base.
SHARED_RUN = {**MP_FLOW, "name": "shared-run",
              "policies": [_adapter(p) for p in MP_FLOW["policies"]],
              "stop": {"max_steps": 12, "max_minutes": 8, "eval_every_s": 30,
                       "live_eval_size": 20}}


@pytest.mark.slow
def test_launcher_trains_two_adapters_in_one_process_exactly_once_each(tmp_path):
    """`astraflow run`, real processes: one trainer process `trainer-b` for both
    policies of base `b`, SIGKILLed after the verifier's step 5 (mid-interval: a
    checkpoint follows every 4th step) and restarted; each policy resumes from its own
    checkpoint and rolls back its own lost steps; `astraflow audit` is clean for both."""
    import json
    import os
    import signal
    import subprocess
    import sys

    from tests.test_kill import paused_trainer, pid_of, start_run, stop_run, wait_until

    gate = tmp_path / "gate"
    launcher, run = start_run(tmp_path, SHARED_RUN, {"ASTRAFLOW_TEST_PAUSE_AT_STEP": "verifier:5",
                                                     "ASTRAFLOW_TEST_GATE": str(gate)})
    try:
        pid = paused_trainer(gate, "verifier", 5, 400)
        assert pid == pid_of(run, "trainer-b")
        assert pid_of(run, "trainer-solver") is None and pid_of(run, "trainer-verifier") is None
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: pid_of(run, "trainer-b") not in (None, pid), 60, "restart", run)
        out, _ = launcher.communicate(timeout=600)
    finally:
        stop_run(launcher, run)
    assert launcher.returncode == 0, out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "max_steps", summary["stop_reason"]
    assert summary["restarts"] == {"trainer-b": 1, "rollout-w0": 0}
    audit = subprocess.run([sys.executable, "-m", "astraflow", "audit", str(run), "--json"],
                           capture_output=True, text=True, timeout=300)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    counts = json.loads(audit.stdout)["policies"]
    for p in ("solver", "verifier"):
        assert counts[p]["steps"] == 12 and counts[p]["duplicate_rows"] == 0, counts[p]
        assert counts[p]["violations"] == 0, counts[p]
    assert counts["verifier"]["rollbacks"] == 1 and counts["verifier"]["voided_steps"] == 2
    ctx = RunContext.open(run)
    for p in ("solver", "verifier"):
        versions = ctx.weights().versions(p)
        assert versions[0] == 0 and len(versions) >= 2
        newest = ctx.weights().load(p, versions[-1])
        assert lora.is_adapter(newest) and lora.base_version(newest) == 0
    # Every later version is the policy's adapter alone: a fraction of version 0's bytes.
    ws = ctx.weights()
    for p in ("solver", "verifier"):
        full = ws.manifest(p, 0).total_bytes
        assert all(ws.manifest(p, v).total_bytes < 0.2 * full for v in ws.versions(p)[1:])
