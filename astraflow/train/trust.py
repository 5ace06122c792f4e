"""A bound on how far one optimizer update may move the policy (`algorithm.max_update_kl`).

Why: with gradient clipping and Adam, an update's size hardly depends on how much
signal its batch carries. Late in a run most GRPO groups have zero advantage, yet a
step on the two groups left moves the model as far as a step on eight; on SmolLM2
these updates measured an approx-KL of 0.04-0.10 per update, and held-out accuracy
fell 14-37 points right there (docs/benchmarks/peers.md). PPO's clip bounds the
ratio per token, not the policy's total move. A trust region in the TRPO sense does:
after each update, measure KL(before ‖ after) on the update's own tokens and, above
the bound, pull the parameters back along the update, θ ← θ₀ + s·(θ − θ₀) with
s = √(bound / KL) (KL grows with the square of a small step), measuring again until
within. Cost: one copy of the trainable parameters and one no-grad forward pass per
update (two or more for an update that is pulled back).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


def kl_sums(before: torch.Tensor, after: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """(sum, tokens) of the k3 estimate of KL(before ‖ after) per unmasked token, the
    tokens sampled near `before`: r − 1 − log r with r = p_after / p_before (≥ 0)."""
    d = (after - before).float()
    k3 = torch.expm1(d) - d
    return float((k3 * mask).sum()), float(mask.sum())


def signal_rows(advantages: torch.Tensor, offsets: list[int]) -> int:
    """Rows of a batch (token `offsets`, one more than rows) whose advantage is non-zero:
    the rows that carry a policy-gradient signal."""
    return sum(1 for a, b in zip(offsets, offsets[1:], strict=False)
               if b > a and bool(advantages[a:b].abs().max() > 0))


def update_budget(max_kl: float, rows: int, full_rows: int | None,
                  solved_share: float = 0.0) -> float:
    """The KL one update may move the policy: `max_kl`, scaled down by `rows` (signal
    rows) / `full_rows` when `full_rows` is set (`algorithm.max_update_kl_rows`; an
    update with no signal rows, a KL penalty's alone, gets one row's share), and by
    (1 − `solved_share`)², the square of the share of the step's groups the policy does
    not already solve (`algorithm.update_kl_solved_at`).

    Why the rows: a fixed bound lets an update carried by one group move the model as
    far as one carried by eight (both are cut to the same KL). Why the solved share:
    once most groups are all-correct the update rests on the few left, and what it can
    break is the many it does not see, so its length (KL grows with the square of a
    small step) shrinks with the share of the batch still unsolved. Early in a run few
    groups are solved and the bound is whole, which is where scaling by signal rows
    alone cost speed (docs/benchmarks/peers.md); once a policy that had learnt a task
    falls, fewer groups are solved and its steps grow again."""
    scale = (1.0 - min(max(solved_share, 0.0), 1.0)) ** 2
    if full_rows is None:
        return max_kl * scale
    return max_kl * scale * min(1.0, max(rows, 1) / full_rows)


def batch_budget(max_kl: float, advantages: torch.Tensor, offsets: list[int],
                 full_rows: int | None, solved_share: float = 0.0) -> float:
    """`update_budget` for an update's rows (per-token `advantages`, token `offsets`),
    counting their signal rows only when `full_rows` asks for it: every update of a
    bounded policy calls this, and the count is a Python loop over rows."""
    if full_rows is None:
        return update_budget(max_kl, 0, None, solved_share)
    return update_budget(max_kl, signal_rows(advantages, offsets), full_rows, solved_share)


class TrustRegion:
    """Holds the trainable parameters as they were before an update, and pulls an
    update that moved the policy more than `max_kl` back to that KL."""

    def __init__(self, opt: torch.optim.Optimizer, max_kl: float):
        if max_kl <= 0:
            raise ValueError(f"max_update_kl must be > 0, got {max_kl}")
        self.max_kl = max_kl
        # The optimizer's own parameters: exactly what an update moves (under FSDP2 the
        # sharded DTensors; the module's attributes are swapped for unsharded copies
        # during forward and backward).
        self.params = [p for g in opt.param_groups for p in g["params"]]
        self.before: list[torch.Tensor] = []
        self.tries = 5

    def snapshot(self) -> None:
        """Call just before `opt.step()`."""
        with torch.no_grad():
            self.before = [_local(p).clone() for p in self.params]

    def bound(self, measure: Callable[[], float],
              max_kl: float | None = None) -> tuple[float, float]:
        """Measure the last update's KL (`measure()`: the KL now, a forward pass) and,
        above `max_kl`, pull it back until within. KL ≈ c·sᵖ along the update: the first
        guess takes p = 2 (small steps), later ones fit p to the last two measurements
        (large steps saturate), aiming at 0.9·max_kl, never shrinking more than 8× per
        measurement; at most `tries` measurements more,
        after which an update still past the bound is undone. Returns (KL of the whole
        update, scale kept; 1.0: within the bound, parameters untouched). `max_kl`
        overrides the region's bound for this update (`update_budget`)."""
        limit = self.max_kl if max_kl is None else max_kl
        if limit <= 0:
            raise ValueError(f"an update's KL bound must be > 0, got {limit}")
        first = kl = measure()
        scale, power, prev = 1.0, 2.0, None
        for _ in range(self.tries):
            if math.isfinite(kl) and kl <= limit:
                break
            if not math.isfinite(kl) or kl <= 0:
                new = 0.0
            else:
                if prev is not None and prev[1] > 0 and prev[1] != kl:
                    power = min(max(math.log(kl / prev[1]) / math.log(scale / prev[0]), 0.25), 4.0)
                # at most 8× smaller a step per measurement: a power fitted on the flat
                # top of a saturating curve would otherwise overshoot to nothing
                new = max(scale * (0.9 * limit / kl) ** (1.0 / power), scale / 8)
            self._rescale(scale, new)
            prev, scale = (scale, kl), new
            if scale == 0.0:
                break
            kl = measure()
        if scale > 0.0 and not (math.isfinite(kl) and kl <= limit):
            self._rescale(scale, 0.0)  # still past it: the update is undone
            scale = 0.0
        self.before = []
        return first, scale

    def _rescale(self, old: float, new: float) -> None:
        """Parameters at p0 + old·Δ become p0 + new·Δ."""
        with torch.no_grad():
            for p, p0 in zip(self.params, self.before, strict=True):
                local = _local(p)
                if new == 0.0 or old == 0.0:
                    local.copy_(p0)
                else:
                    local.lerp_(p0, 1.0 - new / old)


def _local(p: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP2 (DTensor) parameter, the tensor itself otherwise:
    every rank scales its own shard by the same factor, with no collective."""
    to_local = getattr(p, "to_local", None)
    return to_local() if to_local is not None else p
