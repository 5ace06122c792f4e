"""The policy losses on cases small enough to compute by hand, and the chunked
logprobs against the full-vocabulary reference (values and gradients)."""

from __future__ import annotations

import math

import pytest
import torch

from astraflow.models.factory import tiny_llama
from astraflow.models.tokenizer import CharCodec
from astraflow.train.batch import Batch
from astraflow.train.logprobs import completion_logprobs, completion_logprobs_reference
from astraflow.train.loss import LossConfig, policy_loss, ppo_clip_loss
from astraflow.train.step import StepSettings, optimize


def test_ppo_clip_loss_hand_computed():
    # Three tokens; the third is masked out (a tool wrote it).
    old = torch.log(torch.tensor([0.5, 0.5, 0.5]))
    new = torch.log(torch.tensor([0.75, 0.25, 0.9]))  # ratios 1.5, 0.5, 1.8
    adv = torch.tensor([1.0, -2.0, 5.0])
    mask = torch.tensor([1.0, 1.0, 0.0])
    loss, stats = ppo_clip_loss(new, old, adv, mask, clip_eps=0.2)
    # token 1: min(1.5*1, 1.2*1) = 1.2   → -1.2
    # token 2: min(0.5*-2, 0.8*-2) = -1.6 → +1.6
    # mean over the 2 unmasked tokens: (-1.2 + 1.6) / 2 = 0.2
    assert loss.item() == pytest.approx(0.2, abs=1e-6)
    assert stats.tokens == 2
    assert stats.clip_frac == pytest.approx(1.0)  # both unmasked tokens were clipped
    assert stats.ratio_mean == pytest.approx(1.0)


def test_ppo_clip_loss_gradient_is_policy_gradient_inside_the_clip():
    new = torch.log(torch.tensor([0.5, 0.5])).requires_grad_(True)
    old = new.detach().clone()
    adv = torch.tensor([2.0, -1.0])
    loss, _ = ppo_clip_loss(new, old, adv, torch.ones(2), clip_eps=0.2)
    loss.backward()
    # ratio = 1 → d(-ratio*A)/dlogp = -A, averaged over 2 tokens
    assert new.grad.tolist() == pytest.approx([-1.0, 0.5])


def test_clipped_tokens_get_no_gradient():
    new = torch.log(torch.tensor([0.9])).requires_grad_(True)
    old = torch.log(torch.tensor([0.5]))
    loss, _ = ppo_clip_loss(new, old, torch.tensor([1.0]), torch.ones(1), clip_eps=0.2)
    loss.backward()
    assert new.grad.item() == 0.0


def test_completion_logprobs_match_engine(tiny_policy_dir):
    """The trainer's right-padded forward gives the logprobs the engine sampled with."""
    from astraflow.rollout.engine import HFEngine

    eng = HFEngine.from_dir(tiny_policy_dir)
    prompts = [eng.codec.encode("12+3="), eng.codec.encode("7+8=")]  # different lengths
    gen = eng.generate(prompts, samples_per_prompt=3, max_new_tokens=5,
                       generator=torch.Generator().manual_seed(0))
    rep = [p for p in prompts for _ in range(3)]
    with torch.no_grad():
        lp = completion_logprobs(eng.model, rep, gen.completions, eng.codec.pad_id).logprobs
    flat = [x for r in gen.logprobs for x in r]
    assert len(flat) == lp.numel()
    assert max(abs(a - b) for a, b in zip(flat, lp.tolist(), strict=True)) < 1e-4
    assert all(math.isfinite(x) for x in flat)


def _model(seed: int = 0) -> torch.nn.Module:
    return tiny_llama(hidden_size=64, layers=2, heads=2, intermediate_size=128, seed=seed).train()


def test_on_policy_at_temperature_0_7_ratio_is_one_and_nothing_clipped():
    """The engine records log_softmax(logits / T); the trainer must divide by the same T."""
    from astraflow.rollout.engine import HFEngine

    model = _model()
    codec = CharCodec.default()
    eng = HFEngine(model, codec)
    prompts = [codec.encode("12+3="), codec.encode("7+8="), codec.encode("45+61=")]
    gen = eng.generate(prompts, samples_per_prompt=4, max_new_tokens=6, temperature=0.7,
                       generator=torch.Generator().manual_seed(1))
    rep = [p for p in prompts for _ in range(4)]
    behaviour = torch.tensor([x for r in gen.logprobs for x in r])
    model.train()
    new = completion_logprobs(model, rep, gen.completions, codec.pad_id, temperature=0.7).logprobs
    assert new.numel() == behaviour.numel() > 12
    assert (new.detach() - behaviour).abs().max() < 1e-5
    # the bug this guards against: at T = 1 the same tokens get other logprobs
    at_one = completion_logprobs(model, rep, gen.completions, codec.pad_id).logprobs.detach()
    assert (at_one - behaviour).abs().max() > 1e-2
    adv = torch.tensor([1.0 if i % 2 else -1.0 for i, c in enumerate(gen.completions) for _ in c])
    _, stats = ppo_clip_loss(new, behaviour, adv, torch.ones_like(adv), clip_eps=0.2)
    assert stats.ratio_mean == pytest.approx(1.0, abs=1e-5)
    assert stats.clip_frac == 0.0


CASE = ([[1, 5, 6, 7], [1, 8], [1, 9, 9, 10, 11]],
        [[12, 13, 14], [15, 16, 17, 18, 2], [2]])


@pytest.mark.parametrize("chunk", [1, 4, 1024])
def test_chunked_logprobs_equal_the_full_vocabulary_reference(chunk):
    """Values and gradients, over several chunks, at T ≠ 1."""
    model = _model()
    prompts, comps = CASE
    params = [p for p in model.parameters() if p.requires_grad]
    ref = completion_logprobs_reference(model, prompts, comps, 0, temperature=0.7)
    weights = torch.linspace(-1.0, 1.0, ref.numel())  # any loss that weighs tokens differently
    g_ref = torch.autograd.grad((ref * weights).sum(), params)
    out = completion_logprobs(model, prompts, comps, 0, temperature=0.7, chunk_tokens=chunk,
                              entropy=True)
    g_new = torch.autograd.grad((out.logprobs * weights).sum(), params, retain_graph=True)
    assert out.logprobs.shape == ref.shape
    assert (out.logprobs - ref).abs().max() < 1e-5
    assert max(float((a - b).abs().max()) for a, b in zip(g_ref, g_new, strict=True)) < 1e-5
    # entropy of the temperature-T distribution at each completion position, with its
    # gradient (algorithm.entropy_floor trains on it)
    ids = [p + c for p, c in zip(prompts, comps, strict=True)]
    want = []
    for p, row in zip(prompts, ids, strict=True):
        logits = model(input_ids=torch.tensor([row])).logits[0, len(p) - 1 : len(row) - 1]
        lp = torch.log_softmax(logits / 0.7, -1)
        want.append(-(lp.exp() * lp).sum(-1))
    want_h = torch.cat(want)
    assert out.entropy is not None and out.entropy.requires_grad
    assert torch.allclose(out.entropy, want_h, atol=1e-4)
    g_h = torch.autograd.grad((out.entropy * weights).sum(), params)
    g_h_ref = torch.autograd.grad((want_h * weights).sum(), params)
    assert max(float((a - b).abs().max()) for a, b in zip(g_h, g_h_ref, strict=True)) < 1e-5


def test_a_model_whose_logits_are_not_head_of_hidden_is_refused():
    model = _model()
    original = model.forward

    def scaled(*args, **kwargs):
        out = original(*args, **kwargs)
        out.logits = out.logits * 0.5  # like Granite's logits_scaling
        return out

    model.forward = scaled
    with pytest.raises(TypeError, match="not head"):
        completion_logprobs(model, *CASE, 0)


def _rows(n: int, seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    prompts = [[1, *torch.randint(3, 30, (int(torch.randint(1, 5, (1,), generator=g)),),
                                  generator=g).tolist()] for _ in range(n)]
    comps = [torch.randint(3, 30, (int(torch.randint(1, 7, (1,), generator=g)),),
                           generator=g).tolist() for _ in range(n)]
    behaviour = [(-torch.rand(len(c), generator=g) * 3).tolist() for c in comps]
    mask = [[int(x) for x in (torch.rand(len(c), generator=g) > 0.2)] for c in comps]
    mask[0] = [1] * len(comps[0])
    adv = torch.randn(n, generator=g).tolist()
    return Batch.from_rows(prompts, comps, behaviour, mask, adv)


@pytest.mark.parametrize("objective", ["ppo", "decoupled"])
def test_micro_batches_accumulate_the_one_shot_gradient(objective):
    """Loss normalised by the step's global token count: 3-row micro-batches give the
    gradient of one pass over all 10 rows (and the same update)."""
    batch = _rows(10, seed=3)
    grads, params = [], []
    for micro in (None, 3):
        model = _model(seed=5)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        cfg = StepSettings(loss=LossConfig(objective, 0.2, 3.0), temperature=0.8,
                           micro_batch_rows=micro, chunk_tokens=7, grad_clip=1e9)
        metrics, updates = optimize(model, opt, batch, 0, cfg)
        assert updates == 1
        grads.append([p.grad.clone() for p in model.parameters()])
        params.append([p.detach().clone() for p in model.parameters()])
    assert max(float((a - b).abs().max()) for a, b in zip(*grads, strict=True)) < 1e-5
    assert max(float((a - b).abs().max()) for a, b in zip(*params, strict=True)) < 1e-6
    assert metrics["tokens"] == float(batch.mask.sum())


def test_minibatches_make_several_updates_each_row_once():
    batch = _rows(9, seed=4)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    metrics, updates = optimize(model, opt, batch, 0, StepSettings(minibatches=3))
    assert updates == 3
    assert metrics["tokens"] == float(batch.mask.sum())  # every row used, once
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_decoupled_hand_computed():
    """Clip on new/proximal, times min(exp(prox − behaviour), is_cap), detached."""
    behaviour = torch.log(torch.tensor([0.5, 0.2, 0.5]))
    prox = torch.log(torch.tensor([0.6, 0.8, 0.5]))     # weights 1.2, 4 → capped 2, 1
    new = torch.log(torch.tensor([0.66, 0.8, 0.75])).requires_grad_(True)  # r = 1.1, 1, 1.5
    adv = torch.tensor([1.0, -1.0, 1.0])
    cfg = LossConfig("decoupled", clip_eps=0.2, is_cap=2.0)
    loss, stats = policy_loss(new, behaviour, adv, torch.ones(3), cfg, logp_proximal=prox)
    # token 1: 1.2 * min(1.1, 1.1) = 1.32; token 2: 2 * -1 = -2; token 3: 1 * min(1.5, 1.2) = 1.2
    assert loss.item() == pytest.approx(-(1.32 - 2.0 + 1.2) / 3, abs=1e-5)
    assert stats.clip_frac == pytest.approx(1 / 3)
    assert stats.is_truncated == 1
    loss.backward()
    # d/dlogp of -(w * r * A)/3 = -w*r*A/3 inside the clip, 0 where clipped
    assert new.grad.tolist() == pytest.approx([-1.32 / 3, 2.0 / 3, 0.0], abs=1e-5)
    with pytest.raises(ValueError, match="logp_proximal"):
        policy_loss(new, behaviour, adv, torch.ones(3), cfg)


def test_dual_clip_bounds_negative_advantage_tokens():
    old = torch.log(torch.tensor([0.1, 0.1]))
    new = torch.log(torch.tensor([0.5, 0.5])).requires_grad_(True)  # ratio 5
    adv = torch.tensor([-1.0, 1.0])
    plain, _ = ppo_clip_loss(new, old, adv, torch.ones(2), clip_eps=0.2)
    loss, stats = ppo_clip_loss(new, old, adv, torch.ones(2), clip_eps=0.2, dual_clip=3.0)
    # A < 0: min(5·-1, 0.8·-1) = -5, bounded at 3·-1 = -3; A > 0: clipped at 1.2
    assert plain.item() == pytest.approx((5.0 - 1.2) / 2, abs=1e-5)
    assert loss.item() == pytest.approx((3.0 - 1.2) / 2, abs=1e-5)
    assert stats.dual_clipped == 1
    loss.backward()
    assert new.grad.tolist() == pytest.approx([0.0, 0.0])  # both held by a clip


def test_global_normalizer():
    new = torch.log(torch.tensor([0.5, 0.5]))
    adv = torch.tensor([1.0, 1.0])
    loss, _ = ppo_clip_loss(new, new, adv, torch.ones(2), clip_eps=0.2, normalizer=8.0)
    assert loss.item() == pytest.approx(-2 / 8)
