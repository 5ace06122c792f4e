"""The PPO-clip loss on a case small enough to compute by hand."""

from __future__ import annotations

import math

import pytest
import torch

from astraflow.train.loss import completion_logprobs, ppo_clip_loss


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
        lp = completion_logprobs(eng.model, rep, gen.completions, eng.codec.pad_id)
    flat = [x for r in gen.logprobs for x in r]
    assert len(flat) == lp.numel()
    assert max(abs(a - b) for a, b in zip(flat, lp.tolist(), strict=True)) < 1e-4
    assert all(math.isfinite(x) for x in flat)
