"""Trainer device, precision, learning-rate schedule and gradient checkpointing (one process)."""

from __future__ import annotations

import copy
import math
import shutil

import pytest
import torch

from astraflow.config.algorithm import AlgorithmSpec
from astraflow.context import RunContext
from astraflow.train.dist import compute_dtype, resolve_device
from astraflow.train.step import lr_schedule, make_optimizer
from astraflow.train.trainer import Trainer
from tests.runs import seeded_run
from tests.test_resume import BATCH, fill, params, train


def test_device_choice_never_falls_back_silently(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(RuntimeError, match="trainer.device is cuda but torch sees no CUDA"):
        resolve_device("cuda")
    assert compute_dtype("auto", torch.device("cpu")) is None
    assert compute_dtype("auto", torch.device("cuda", 0)) is torch.bfloat16
    assert compute_dtype("bf16", torch.device("cpu")) is torch.bfloat16
    assert compute_dtype("fp32", torch.device("cuda", 0)) is None


def test_optimizer_is_fused_with_its_moments_allocated_and_updates_as_adamw():
    """The trainer's AdamW (fused, moments allocated before the first update) makes the
    updates torch's lazily initialised, unfused AdamW makes; a frozen parameter gets no
    state."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    net[0].bias.requires_grad_(False)
    twin, start = copy.deepcopy(net), copy.deepcopy(net)
    algo = AlgorithmSpec(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.01)
    trainable = [p for p in net.parameters() if p.requires_grad]
    ours = make_optimizer(trainable, algo)
    assert ours.defaults["fused"] is True
    assert len(ours.state) == 3 and all(float(st["step"]) == 0 and not st["exp_avg"].any()
                                        for st in ours.state.values())
    assert not make_optimizer(trainable, algo, allocate=False).state  # a resume's: restored
    ref = torch.optim.AdamW([p for p in twin.parameters() if p.requires_grad], lr=1e-2,
                            betas=(0.9, 0.99), weight_decay=0.01)
    for k in range(3):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(k))
        for model, opt in ((net, ours), (twin, ref)):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.step()
    for a, b in zip(net.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert not torch.equal(net[0].weight, start[0].weight)  # it trained
    assert torch.equal(net[0].bias, start[0].bias)  # frozen


def test_lr_schedule_warmup_then_cosine():
    assert lr_schedule(AlgorithmSpec(lr=1e-3)) is None  # constant: the optimizer's own
    at = lr_schedule(AlgorithmSpec(lr=1e-3, lr_warmup_steps=4, lr_schedule="cosine",
                                   lr_decay_steps=10, lr_min_ratio=0.1))
    assert at is not None
    assert [at(n) for n in range(4)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert at(4) == pytest.approx(1e-3)
    assert at(9) == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert at(14) == pytest.approx(1e-4) and at(100) == pytest.approx(1e-4)
    flat = lr_schedule(AlgorithmSpec(lr=1e-3, lr_warmup_steps=2))
    assert flat is not None and [flat(n) for n in range(4)] == pytest.approx([5e-4, 1e-3, 1e-3, 1e-3])


def test_lr_schedule_over_the_runs_budget():
    """Without `lr_decay_steps` the cosine spans the run's budget: its position is the
    larger of the updates made over the step budget and the share of minutes gone."""
    algo = AlgorithmSpec(lr=1e-3, lr_schedule="cosine", lr_min_ratio=0.1)
    cos = lambda t: 1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * t))  # noqa: E731
    by_steps = lr_schedule(algo, budget_updates=20)
    assert by_steps is not None
    assert [by_steps(n) for n in (0, 5, 10, 20, 40)] == pytest.approx(
        [1e-3, cos(0.25), cos(0.5), 1e-4, 1e-4])
    by_time = lr_schedule(algo, budget_updates=1000, budget_used=0.5)
    assert by_time is not None and by_time(3) == pytest.approx(cos(0.5))
    late = lr_schedule(algo, budget_updates=1000, budget_used=1.7)  # past the deadline
    assert late is not None and late(3) == pytest.approx(1e-4)
    warm = lr_schedule(algo.model_copy(update={"lr_warmup_steps": 4}), budget_updates=14)
    assert warm is not None and warm(9) == pytest.approx(cos(0.5))


@pytest.mark.parametrize(("minutes", "steps"), [(1e6, 4), (1e-4, 2000)])
def test_trainer_decays_over_the_runs_budget(tmp_path, tiny_policy_dir, minutes, steps):
    """The trainer hands its step budget and the share of `stop.max_minutes` gone since
    version 0's publish to the schedule: a 4-step budget ends at the floor after 4
    steps; a budget of minutes already spent puts the first update there."""
    flow = {
        "name": "b", "policies": [{"name": "solver", "model": {
            "hidden_size": 64, "layers": 2, "heads": 2, "intermediate_size": 128},
            "algorithm": {"lr": 0.01, "lr_schedule": "cosine", "lr_min_ratio": 0.1}}],
        "env": {"digits": 2, "eval_size": 20},
        "rollout": {"prompts_per_batch": 2, "samples_per_prompt": 4},
        "trainer": {"device": "cpu"}, "stop": {"max_steps": steps, "max_minutes": minutes},
    }
    ctx = seeded_run(tmp_path / "r", flow, tiny_policy_dir)
    fill(ctx, 4)
    tr = Trainer(ctx)
    rates = []
    for _ in range(4):
        train(tr, 1)
        rates.append(tr.opt.param_groups[0]["lr"])
    if steps == 4:
        assert rates == pytest.approx([0.01 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 4)))
                                       for k in range(4)])
    else:
        assert rates == pytest.approx([0.001] * 4)
    logged = sorted((r["step"], r["value"]) for r in ctx.ledger().read_metrics().to_pylist()
                    if r["component"] == "trainer" and r["name"] == "lr")
    assert [v for _, v in logged] == pytest.approx(rates)  # the metric `lr`, step by step


def make(run, policy_dir, **trainer) -> RunContext:
    flow = {
        "name": "d", "policies": [{"name": "solver", "model": {"hidden_size": 64, "layers": 2,
                                                               "heads": 2, "intermediate_size": 128},
                                   "algorithm": {"lr": 0.01, "publish_every": 2,
                                                 "lr_warmup_steps": 3, "lr_schedule": "cosine",
                                                 "lr_decay_steps": 5,
                                                 "gradient_checkpointing": True}}],
        "env": {"digits": 2, "eval_size": 20},
        "rollout": {"prompts_per_batch": 2, "samples_per_prompt": 4},
        "trainer": {"checkpoint_every": 3, "device": "cpu", **trainer},
        "store": {"keep_last": 2, "keep_every": 0},
    }
    ctx = seeded_run(run, flow, policy_dir)
    fill(ctx, 6)
    return ctx


def test_schedule_and_bf16_compute_resume_bit_for_bit(tmp_path, tiny_policy_dir):
    """bf16 compute over float32 weights (autocast, here on the CPU), gradient
    checkpointing and a warmup+cosine schedule: the rate follows the schedule, the
    weights stay float32 and move, and a resumed trainer continues exactly (the
    schedule's position is the checkpointed update count)."""
    a = make(tmp_path / "a", tiny_policy_dir, precision="bf16")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    straight = Trainer(a)
    assert straight.compute is torch.bfloat16 and straight.model.is_gradient_checkpointing
    before = params(straight.model)
    train(straight, 2)
    assert straight.opt.param_groups[0]["lr"] == pytest.approx(0.01 * 2 / 3)
    assert all(p.dtype == torch.float32 for p in straight.model.parameters())
    assert any(not torch.equal(x, y) for x, y in zip(before, params(straight.model), strict=True))
    train(straight, 4)
    at = lr_schedule(straight.spec.algorithm)
    assert at is not None and straight.opt.param_groups[0]["lr"] == pytest.approx(at(5))

    b = RunContext.open(tmp_path / "b")
    first = Trainer(b)
    train(first, 3)  # checkpoint after 3 steps
    del first
    second = Trainer(b)
    assert second.step == 3
    train(second, 3)
    assert all(torch.equal(x, y) for x, y in
               zip(params(straight.model), params(second.model), strict=True))
    assert len(b.ledger().entries("solver")) == 6 and BATCH == 8


@pytest.mark.gpu
def test_trainer_on_cuda_bf16(tmp_path, tiny_policy_dir):
    """On a GPU: the model lives on CUDA in float32, steps in bf16, and the checkpoint
    holds the CUDA RNG state."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    ctx = make(tmp_path / "g", tiny_policy_dir, device="cuda")
    tr = Trainer(ctx)
    assert next(tr.model.parameters()).device.type == "cuda" and tr.compute is torch.bfloat16
    train(tr, 3)
    ck = ctx.checkpoints().latest("solver")
    assert ck is not None
    from safetensors.torch import load

    assert "rng/cuda" in load(ck.files["state.safetensors"])
