"""The trust region of each optimizer update (`algorithm.max_update_kl`): the KL it
measures, the pull-back it applies, and that updates within it are left alone."""

from __future__ import annotations

import copy
import math

import pydantic
import pytest
import torch

from astraflow.config.algorithm import AlgorithmSpec
from astraflow.train.logprobs import completion_logprobs
from astraflow.train.loss import LossConfig
from astraflow.train.step import StepSettings, optimize, step_settings
from astraflow.train.trust import TrustRegion, kl_sums, signal_rows, update_budget
from tests.test_loss import _model, _rows


def test_kl_sums_is_the_k3_estimate_and_masked():
    before = torch.log(torch.tensor([0.5, 0.5, 0.9]))
    after = torch.log(torch.tensor([0.5, 0.25, 0.1]))
    total, n = kl_sums(before, after, torch.tensor([1.0, 1.0, 0.0]))
    # r = 1 → 0; r = 1/2 → 1/2 − 1 − ln(1/2); the masked token does not count
    assert n == 2 and total == pytest.approx(0.5 - 1 - math.log(0.5), abs=1e-6)


def test_bound_pulls_the_update_back_along_its_direction():
    """A stand-in KL that saturates (as √step, like a large step's real KL): the first,
    quadratic guess falls short; the bound fits the power and measures again until
    within, scaling along the update; an update within it is kept, a non-finite one
    undone."""
    lin = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(lin.parameters(), lr=1.0)
    tr = TrustRegion(opt, 0.01)
    w0 = lin.weight.detach().clone()
    seen: list[float] = []

    def saturating() -> float:
        step = float((lin.weight - w0).abs().mean())  # 1.0 for the whole update
        seen.append(0.04 * step**0.5)
        return seen[-1]

    tr.snapshot()
    with torch.no_grad():
        lin.weight.add_(1.0)
    first, scale = tr.bound(saturating)
    assert first == pytest.approx(0.04) and 0.008 < seen[-1] <= 0.01 and 3 <= len(seen) <= 4
    assert torch.allclose(lin.weight, w0 + scale) and scale == pytest.approx(seen[-1] ** 2 / 0.04 ** 2)
    w1 = lin.weight.detach().clone()
    tr.snapshot()
    with torch.no_grad():
        lin.weight.add_(0.01)
    assert tr.bound(lambda: 0.005) == (0.005, 1.0) and torch.allclose(lin.weight, w1 + 0.01)
    w2 = lin.weight.detach().clone()
    tr.snapshot()
    with torch.no_grad():
        lin.weight.add_(float("nan"))
    assert tr.bound(lambda: float("nan"))[1] == 0.0 and torch.equal(lin.weight, w2)
    with pytest.raises(ValueError, match="> 0"):
        TrustRegion(opt, 0.0)


def _kl_between(a: torch.nn.Module, b: torch.nn.Module, batch) -> float:
    with torch.no_grad():
        la = completion_logprobs(a, batch.prompts, batch.completions, 0, temperature=0.8).logprobs
        lb = completion_logprobs(b, batch.prompts, batch.completions, 0, temperature=0.8).logprobs
    total, n = kl_sums(la, lb, batch.mask)
    return total / n


@pytest.mark.parametrize("micro", [None, 3])
def test_an_update_past_the_bound_lands_near_it_and_one_within_is_untouched(micro):
    """Real torch updates of a tiny llama: a large AdamW step measured past the bound is
    pulled back to about the bound (KL is quadratic in a small step); with a loose
    bound the same step is bit-identical to the unbounded one."""
    batch = _rows(10, seed=3)
    start = _model(seed=5)

    def run(max_kl: float | None, lr: float) -> tuple[torch.nn.Module, dict[str, float]]:
        model = copy.deepcopy(start)
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        cfg = StepSettings(loss=LossConfig("ppo", 0.2), temperature=0.8, micro_batch_rows=micro,
                           grad_clip=1.0, max_update_kl=max_kl)
        metrics, updates = optimize(model, opt, batch, 0, cfg)
        assert updates == 1
        return model, metrics

    free, m_free = run(None, 3e-2)
    assert "update_kl" not in m_free
    moved = _kl_between(start, free, batch)
    assert moved > 0.02
    bounded, m = run(0.005, 3e-2)
    assert m["update_kl"] == pytest.approx(moved, rel=1e-4)  # measured on the same tokens
    # A step this large is far from quadratic: the first guess √(0.005 / KL) falls short
    # and the bound measures again; it ends within the bound, along the update.
    assert m["update_scale"] < math.sqrt(0.005 / moved)
    assert 0.001 < _kl_between(start, bounded, batch) <= 0.005 * 1.0001
    loose, m_loose = run(10.0, 3e-2)
    assert m_loose["update_scale"] == 1.0
    for p, q in zip(loose.parameters(), free.parameters(), strict=True):
        assert torch.equal(p, q)


def test_field_validated_and_off_by_default():
    assert AlgorithmSpec().max_update_kl is None
    assert step_settings(AlgorithmSpec(), temperature=1.0, first_update=0).max_update_kl is None
    s = step_settings(AlgorithmSpec(max_update_kl=0.02), temperature=1.0, first_update=0)
    assert s.max_update_kl == 0.02
    with pytest.raises(pydantic.ValidationError):
        AlgorithmSpec(max_update_kl=0)


def test_budget_grows_with_the_rows_that_carry_signal():
    adv = torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0, -0.5, 0.0])
    assert signal_rows(adv, [0, 2, 4, 4, 7]) == 2  # rows 0 (zeros), 1, 2 (empty), 3
    assert update_budget(0.02, 4, None) == 0.02
    assert update_budget(0.02, 4, 32) == pytest.approx(0.0025)
    assert update_budget(0.02, 64, 32) == 0.02
    assert update_budget(0.02, 0, 32) == pytest.approx(0.02 / 32)  # a KL penalty's update


def test_budget_shrinks_with_the_share_of_groups_already_solved():
    """The update's length (KL ~ its square) scales with the unsolved share."""
    assert update_budget(0.02, 4, None, 0.0) == 0.02
    assert update_budget(0.02, 4, None, 0.75) == pytest.approx(0.02 / 16)
    assert update_budget(0.02, 4, 8, 0.5) == pytest.approx(0.02 * 0.5 * 0.25)
    assert update_budget(0.02, 4, None, 1.0) == 0.0  # nothing left to learn from


def test_an_update_on_few_signal_rows_gets_its_share_of_the_bound():
    """`max_update_kl_rows`: a real update on a batch whose advantages are zeroed on half
    its rows gets half the bound (reported as `update_kl_bound`) and lands within it;
    the same update with the whole bound lands past that half."""
    batch = _rows(10, seed=3)
    start = _model(seed=5)
    off = batch.offsets()
    half = copy.deepcopy(batch)
    for i in range(0, 10, 2):
        half.advantages[off[i]:off[i + 1]] = 0.0
    assert signal_rows(half.advantages, off) == 5

    def run(rows: int | None) -> tuple[float, dict[str, float]]:
        model = copy.deepcopy(start)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)  # a step near quadratic in KL: it lands near its bound
        cfg = StepSettings(loss=LossConfig("ppo", 0.2), temperature=0.8, grad_clip=1.0,
                           max_update_kl=0.004, max_update_kl_rows=rows)
        metrics = optimize(model, opt, half, 0, cfg)[0]
        return _kl_between(start, model, half), metrics

    whole, m_whole = run(None)
    share, m_share = run(10)
    assert m_whole["update_kl_bound"] == pytest.approx(0.004)
    assert m_share["update_kl_bound"] == pytest.approx(0.002)
    assert m_whole["update_kl"] == pytest.approx(m_share["update_kl"])  # the same update
    assert 0.002 < whole <= 0.004 * 1.0001
    assert share <= 0.002 * 1.0001
