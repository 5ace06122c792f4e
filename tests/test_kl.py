"""The KL penalty toward a reference policy (`algorithm.kl_coef`): the k3 term by hand,
its effect on learning, the flow field, and the trainer's frozen version-0 reference."""

from __future__ import annotations

import copy
import math

import pydantic
import pytest
import torch

from astraflow.config.algorithm import AlgorithmSpec
from astraflow.config.loader import parse_flow
from astraflow.models.hf import load_policy
from astraflow.train.batch import Batch
from astraflow.train.dist import Ranks
from astraflow.train.fsdp import ShardedStep
from astraflow.train.loss import LossConfig, policy_loss
from astraflow.train.step import StepSettings, optimize
from astraflow.train.trainer import Trainer
from astraflow.train.version0 import reference_model
from tests.runs import seeded_run
from tests.test_loss import _model, _rows
from tests.test_resume import fill, params, train


def k3(ref: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    return torch.exp(ref - new) - (ref - new) - 1


# --------------------------------------------------------------------------- the term
def test_kl_term_hand_computed_and_masked():
    """Zero advantages isolate the KL term: token 1 equals the reference (0), token 2
    has half the reference's probability (1 − ln 2), token 3 is masked."""
    new = torch.log(torch.tensor([0.5, 0.25, 0.9])).requires_grad_(True)
    ref = torch.log(torch.tensor([0.5, 0.5, 0.1]))
    adv = torch.zeros(3)
    mask = torch.tensor([1.0, 1.0, 0.0])
    cfg = LossConfig(kl_coef=0.4)
    loss, stats = policy_loss(new, new.detach(), adv, mask, cfg, logp_ref=ref)
    assert loss.item() == pytest.approx(0.4 * (1 - math.log(2)) / 2, abs=1e-6)
    assert stats.kl_ref_sum == pytest.approx(1 - math.log(2), abs=1e-6)
    assert stats.metrics("ppo", kl_ref=True)["kl_ref"] == pytest.approx((1 - math.log(2)) / 2)
    assert "kl_ref" not in stats.metrics("ppo")
    loss.backward()
    # d/dnew of c·k3/n = c·(1 − exp(ref − new))/n: 0 at equality, −c/2 where ref = 2·new
    assert new.grad.tolist() == pytest.approx([0.0, -0.4 / 2, 0.0], abs=1e-6)

    # normalised exactly like the policy term: token weights and the caller's count
    w = torch.tensor([2.0, 1.0, 1.0])
    loss_w, _ = policy_loss(new, new.detach(), adv, mask, cfg, logp_ref=ref, token_weights=w)
    assert loss_w.item() == pytest.approx(0.4 * (1 - math.log(2)) / 3, abs=1e-6)
    loss_n, _ = policy_loss(new, new.detach(), adv, mask, cfg, logp_ref=ref, normalizer=8.0)
    assert loss_n.item() == pytest.approx(0.4 * (1 - math.log(2)) / 8, abs=1e-6)

    # a random case against the formula, with a nonzero policy term added unchanged
    g = torch.Generator().manual_seed(0)
    new = -torch.rand(20, generator=g) * 3
    ref = -torch.rand(20, generator=g) * 3
    beh = -torch.rand(20, generator=g) * 3
    adv = torch.randn(20, generator=g)
    mask = (torch.rand(20, generator=g) > 0.3).float()
    plain, _ = policy_loss(new, beh, adv, mask, LossConfig())
    with_kl, st = policy_loss(new, beh, adv, mask, LossConfig(kl_coef=0.7), logp_ref=ref)
    want = 0.7 * float((k3(ref, new) * mask).sum()) / float(mask.sum())
    assert with_kl.item() - plain.item() == pytest.approx(want, abs=1e-5)
    assert st.kl_ref_sum == pytest.approx(float((k3(ref, new) * mask).sum()), abs=1e-4)
    # zero when the policy is the reference, positive otherwise
    _, same = policy_loss(new, beh, adv, mask, LossConfig(kl_coef=0.7), logp_ref=new)
    assert same.kl_ref_sum == 0.0 and st.kl_ref_sum > 0


def test_masked_tokens_far_from_the_reference_stay_finite():
    """A tool's token the policy finds 200 nats less likely than the reference does:
    masked, it must not put inf·0 = nan into the loss or the gradient."""
    new = torch.tensor([-1.0, -250.0]).requires_grad_(True)
    ref = torch.tensor([-1.0, -50.0])
    loss, stats = policy_loss(new, new.detach(), torch.ones(2), torch.tensor([1.0, 0.0]),
                              LossConfig(kl_coef=1.0), logp_ref=ref)
    loss.backward()
    assert math.isfinite(loss.item()) and math.isfinite(stats.kl_ref_sum)
    assert torch.isfinite(new.grad).all() and new.grad[1] == 0


def test_kl_coef_needs_reference_logprobs():
    x = torch.zeros(2)
    with pytest.raises(ValueError, match="logp_ref"):
        policy_loss(x, x, x, torch.ones(2), LossConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="ref_model"):
        optimize(_model(), torch.optim.SGD(_model().parameters(), lr=0.1), _rows(3, seed=1), 0,
                 StepSettings(loss=LossConfig(kl_coef=0.1)))


def frozen(model: torch.nn.Module) -> torch.nn.Module:
    ref = copy.deepcopy(model).eval()
    ref.requires_grad_(False)
    return ref


def test_policy_equal_to_reference_has_zero_kl_and_micro_batches_add_up():
    """Before the first update the policy is the reference: kl_ref 0. With the penalty,
    micro-batches still accumulate the one-shot gradient. After an update, kl_ref > 0."""
    batch = _rows(10, seed=3)
    ref = frozen(_model(seed=5))
    grads, metrics = [], []
    for micro in (None, 3):
        model = _model(seed=5)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        s = StepSettings(loss=LossConfig("ppo", 0.2, kl_coef=2.0), temperature=0.8,
                         micro_batch_rows=micro, chunk_tokens=7, grad_clip=1e9, ref_model=ref)
        m, _ = optimize(model, opt, batch, 0, s)
        metrics.append(m)
        grads.append([p.grad.clone() for p in model.parameters()])
    assert max(float((a - b).abs().max()) for a, b in zip(*grads, strict=True)) < 1e-5
    assert metrics[0]["kl_ref"] == pytest.approx(0.0, abs=1e-6)
    again, _ = optimize(model, opt, batch, 0, s)
    assert again["kl_ref"] > 1e-4
    # the reference never trains
    assert all(p.grad is None and not p.requires_grad for p in ref.parameters())
    plain, _ = optimize(_model(seed=5), opt, batch, 0, StepSettings())
    assert "kl_ref" not in plain


# --------------------------------------------------------------------------- learning
def exact_kl(model: torch.nn.Module, ref: torch.nn.Module, batch: Batch) -> float:
    """Mean over the batch's completion positions of the full-vocabulary KL(model ‖ ref)."""
    total, n = 0.0, 0
    with torch.no_grad():
        for p, c in zip(batch.prompts, batch.completions, strict=True):
            ids = torch.tensor([p + c])
            sl = slice(len(p) - 1, len(p) + len(c) - 1)
            lp = torch.log_softmax(model(input_ids=ids).logits[0, sl].float(), -1)
            lr = torch.log_softmax(ref(input_ids=ids).logits[0, sl].float(), -1)
            total += float((lp.exp() * (lp - lr)).sum())
            n += len(c)
    return total / n


def train_away(kl_coef: float, steps: int = 12) -> float:
    """Advantages +1 on random completions the reference finds unlikely: the policy
    moves toward them. On-policy each step (behaviour = the current logprobs)."""
    torch.manual_seed(0)
    ref = frozen(_model(seed=7))
    model = _model(seed=7)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    base = _rows(8, seed=11)
    s = StepSettings(loss=LossConfig("ppo", 0.2, kl_coef=kl_coef), grad_clip=1e9,
                     ref_model=ref if kl_coef > 0 else None)
    for _ in range(steps):
        from astraflow.train.logprobs import completion_logprobs

        with torch.no_grad():
            beh = completion_logprobs(model, base.prompts, base.completions, 0).logprobs
        batch = Batch(base.prompts, base.completions, beh, base.mask,
                      torch.ones_like(base.advantages))
        optimize(model, opt, batch, 0, s)
    return exact_kl(model, ref, base)


def test_kl_penalty_holds_the_policy_near_the_reference():
    """Same seed, data and pushes: with a large kl_coef the trained policy ends much
    closer to the reference than without (fails if the term is dropped or its sign
    flipped)."""
    free = train_away(0.0)
    held = train_away(5.0)
    assert free > 0.05, free
    assert held < 0.5 * free, (held, free)


# --------------------------------------------------------------------------- config
def test_kl_coef_validated_and_off_by_default():
    assert AlgorithmSpec().kl_coef == 0.0
    assert AlgorithmSpec(kl_coef=0.05).kl_coef == 0.05
    with pytest.raises(pydantic.ValidationError, match="kl_coef"):
        AlgorithmSpec(kl_coef=-0.1)
    with pytest.raises(ValueError, match="kl_coef"):
        LossConfig(kl_coef=-1.0)


FLOW = {
    "name": "kl", "policies": [{"name": "solver", "model": {"hidden_size": 64, "layers": 2,
                                                            "heads": 2, "intermediate_size": 128},
                                "algorithm": {"lr": 0.01, "publish_every": 1, "kl_coef": 0.5}}],
    "env": {"digits": 2, "eval_size": 20},
    "rollout": {"prompts_per_batch": 2, "samples_per_prompt": 4},
    "trainer": {"checkpoint_every": 2},
    "store": {"keep_last": 1, "keep_every": 0},
}


def test_sharded_training_with_kl_needs_its_reference():
    """Several ranks take a KL anchor (tests/test_distributed.py holds them to one
    process); a step handed none refuses."""
    parse_flow({**FLOW, "trainer": {"ranks": 2}})
    s = StepSettings(loss=LossConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="needs StepSettings.ref_model"):
        ShardedStep(Ranks(world=2))(_model(), torch.optim.SGD(_model().parameters(), lr=0.1),
                                    _rows(3, seed=1), 0, s)


def test_a_token_far_below_the_reference_is_capped_not_explosive():
    """k3 grows as exp(ref − new): one sampled token the policy now finds 15 nats less
    likely than version 0 did would carry a penalty of e^15 ≈ 3e6 and, after the
    gradient clip, set the whole update's direction (a measured SmolLM2 step: gradient
    norm 1,774, kl_ref 110). Each token's term is capped at KL_CAP, as verl caps it."""
    from astraflow.train.loss import KL_CAP

    new = torch.tensor([-16.0, -1.0]).requires_grad_(True)
    ref = torch.tensor([-1.0, -1.5])
    loss, stats = policy_loss(new, new.detach(), torch.zeros(2), torch.ones(2),
                              LossConfig(kl_coef=1.0), logp_ref=ref)
    loss.backward()
    assert stats.kl_ref_sum == pytest.approx(KL_CAP + float(k3(ref[1:], new.detach()[1:])))
    assert new.grad[0] == 0 and new.grad[1] != 0


# --------------------------------------------------------------------------- trainer
def test_trainer_anchors_to_version_0_across_publishes_and_restarts(tmp_path, tiny_policy_dir):
    ctx = seeded_run(tmp_path / "run", FLOW, tiny_policy_dir)
    fill(ctx, 6)
    tr = Trainer(ctx)
    ref = tr.ref_model
    assert ref is not None and not ref.training
    assert all(not p.requires_grad for p in ref.parameters())
    v0 = params(load_policy(ctx.weights().load("solver", 0)))
    assert all(torch.equal(a, b) for a, b in zip(v0, params(ref), strict=True))
    assert ref.dtype == tr.model.dtype and next(ref.parameters()).device == tr.ranks.device
    first = tr.train_on(tr.poll())
    assert first.metrics["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # policy == v0 still
    train(tr, 2)  # publishes v1..v3; v1, v2 pruned (keep_last 1)
    last = tr.train_on(tr.poll())
    assert last.metrics["kl_ref"] > 0
    assert all(torch.equal(a, b) for a, b in zip(v0, params(tr.ref_model), strict=True))
    tr.save_checkpoint()
    del tr
    resumed = Trainer(ctx)  # restart: the reference is version 0 again, not the checkpoint
    assert resumed.step == 4 and resumed.version > 1
    assert all(torch.equal(a, b) for a, b in zip(v0, params(resumed.ref_model), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(v0, params(resumed.model), strict=True))
    # were this trainer on several ranks, each would hold the whole version 0
    whole = reference_model(resumed.ctx, resumed.spec, Ranks(world=2), [0])
    assert whole is not None
    assert all(torch.equal(a, b) for a, b in zip(v0, params(whole), strict=True))


def test_kl_coef_0_loads_no_reference(tmp_path, tiny_policy_dir):
    flow = copy.deepcopy(FLOW)
    flow["policies"][0]["algorithm"]["kl_coef"] = 0.0
    ctx = seeded_run(tmp_path / "run", flow, tiny_policy_dir)
    fill(ctx, 1)
    tr = Trainer(ctx)
    assert tr.ref_model is None
    assert "kl_ref" not in tr.train_on(tr.poll()).metrics


def test_lora_policy_anchors_to_the_full_version_0(tmp_path, tiny_policy_dir):
    """A LoRA policy's reference is the plain model version 0 holds (the base): at the
    start the adapters add zero, so kl_ref is 0; after updates it is not."""
    flow = copy.deepcopy(FLOW)
    flow["policies"][0]["model"] = {**flow["policies"][0]["model"], "lora": {"r": 4}}
    flow["policies"][0]["algorithm"]["lr"] = 0.05
    ctx = seeded_run(tmp_path / "run", flow, tiny_policy_dir)
    fill(ctx, 3)
    tr = Trainer(ctx)
    assert tr.ref_model is not None and not hasattr(tr.ref_model, "peft_config")
    assert tr.train_on(tr.poll()).metrics["kl_ref"] == pytest.approx(0.0, abs=1e-6)
    tr.train_on(tr.poll())
    assert tr.train_on(tr.poll()).metrics["kl_ref"] > 0


# --------------------------------------------------------------------------- pg_mean
def _with_zero_rows(batch: Batch, zeros: int) -> Batch:
    """`batch` with `zeros` extra rows of advantage 0 (a kept zero-variance group)."""
    from tests.test_loss import _rows as rows

    extra = rows(zeros, seed=11)
    n = len(batch)

    def per_row(b: Batch, field: str) -> list[list[float]]:
        off = b.offsets()
        t = getattr(b, field)
        return [t[off[i]:off[i + 1]].tolist() for i in range(len(b))]

    adv = [per_row(batch, "advantages")[i][0] for i in range(n)] + [0.0] * zeros
    return Batch.from_rows(
        list(batch.prompts) + list(extra.prompts),
        list(batch.completions) + list(extra.completions),
        per_row(batch, "behavior_logprobs") + per_row(extra, "behavior_logprobs"),
        [[int(x) for x in m] for m in per_row(batch, "mask") + per_row(extra, "mask")],
        adv)


def test_pg_mean_signal_keeps_zero_advantage_rows_from_diluting_the_update():
    """Rows of advantage 0 in the loss: with `pg_mean: all` they shrink the policy
    gradient (a larger token mean), with `signal` the update is the one without them
    (no KL term here), and the KL term still covers every row."""
    signal = _rows(6, seed=3)
    mixed = _with_zero_rows(signal, 5)
    grads = {}
    for name, batch, mean in (("alone", signal, "all"), ("all", mixed, "all"),
                              ("signal", mixed, "signal")):
        model = _model(seed=5)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        optimize(model, opt, batch, 0, StepSettings(loss=LossConfig("ppo", pg_mean=mean),
                                                    temperature=0.8, grad_clip=1e9))
        grads[name] = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert torch.allclose(grads["signal"], grads["alone"], atol=1e-6)
    share = float(signal.mask.sum()) / float(mixed.mask.sum())
    assert torch.allclose(grads["all"], grads["alone"] * share, atol=1e-6)
    # the anchor's term keeps the whole token mean: policy_loss by hand
    new = torch.log(torch.tensor([0.5, 0.25])).requires_grad_(True)
    ref = torch.log(torch.tensor([0.5, 0.5]))
    adv = torch.tensor([1.0, 0.0])
    loss, _ = policy_loss(new, new.detach(), adv, torch.ones(2),
                          LossConfig(kl_coef=0.4, pg_mean="signal"), logp_ref=ref,
                          pg_normalizer=1.0)
    assert loss.item() == pytest.approx(-1.0 + 0.4 * (1 - math.log(2)) / 2, abs=1e-6)
