"""Policy objectives over per-token logprobs: PPO-clip and AReaL's decoupled PPO.

Every completion token the policy wrote (loss mask 1) carries its row's advantage.
`ppo` clips the ratio new/behaviour; `decoupled` (Fu et al. 2025) clips new/proximal
(the trainer's weights before this step's first update) and corrects the
behaviour→proximal gap by an importance weight truncated at `is_cap`, so a stale row
moves the policy at most eps from where it is now. `dual_clip: c` bounds a
negative-advantage token's objective at c·A (Ye et al. 2020). `kl_coef` adds the k3
estimate of KL(new ‖ reference) per token, capped at `KL_CAP` (as verl's `low_var_kl`
caps it): a token far less likely than under the reference would otherwise carry
exp(ref − new) and set the update alone. `entropy_floor`: see `entropy_floor_on`.

The loss is Σ w·m·ℓ / normalizer: the caller passes the step's global (weighted)
token count, so accumulated micro-batches sum to the one-shot gradient of the mean,
and a row's loss weight (the `length_norm` data stage) gives sequence-mean losses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

KL_CAP = 10.0
"""Largest k3 term one token may carry (verl's cap); beyond it the token pulls no more."""

Objective = Literal["ppo", "decoupled"]


@dataclass(frozen=True)
class LossConfig:
    """The objective's settings (from `algorithm`); see the module docstring."""

    objective: Objective = "ppo"
    clip_eps: float = 0.2
    dual_clip: float | None = None
    is_cap: float = 2.0
    kl_coef: float = 0.0
    pg_mean: Literal["all", "signal"] = "all"
    entropy_floor: float | None = None
    entropy_coef: float = 0.0

    def __post_init__(self) -> None:
        if self.objective not in ("ppo", "decoupled"):
            raise ValueError(f"objective must be 'ppo' or 'decoupled', got {self.objective!r}")
        if not 0 < self.clip_eps < 1:
            raise ValueError(f"clip_eps must be in (0, 1), got {self.clip_eps}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1 (it bounds the objective at c·A), got {self.dual_clip}")
        if self.is_cap < 1:
            raise ValueError(f"is_cap must be >= 1, got {self.is_cap}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.pg_mean not in ("all", "signal"):
            raise ValueError(f"pg_mean must be 'all' or 'signal', got {self.pg_mean!r}")
        if self.entropy_floor is not None and self.entropy_floor <= 0:
            raise ValueError(f"entropy_floor must be > 0 nats per token, got {self.entropy_floor}")
        if self.entropy_coef < 0:
            raise ValueError(f"entropy_coef must be >= 0, got {self.entropy_coef}")


@dataclass
class LossStats:
    """Sums over unmasked tokens, so micro-batches merge exactly; read the means."""

    loss: float = 0.0           # the loss value (already normalised by the caller's count)
    tokens: int = 0
    clipped: float = 0.0        # tokens whose clipped term was the active one
    dual_clipped: float = 0.0   # negative-advantage tokens held at c·A
    ratio_sum: float = 0.0      # new / behaviour
    kl_sum: float = 0.0         # k3 estimate of KL(behaviour ‖ new), per token
    is_weight_sum: float = 0.0  # decoupled: truncated exp(proximal − behaviour)
    is_truncated: float = 0.0   # decoupled: tokens whose weight hit is_cap
    kl_ref_sum: float = 0.0     # kl_coef > 0: k3 estimate of KL(new ‖ reference), per token
    entropy_bonus: float = 0.0  # entropy_floor: tokens that carried the entropy bonus

    def merge(self, other: LossStats) -> LossStats:
        return LossStats(**{k: getattr(self, k) + getattr(other, k) for k in self.__dataclass_fields__})

    def _mean(self, x: float) -> float:
        return x / self.tokens if self.tokens else 0.0

    @property
    def clip_frac(self) -> float:
        return self._mean(self.clipped)

    @property
    def ratio_mean(self) -> float:
        return self._mean(self.ratio_sum)

    @property
    def approx_kl(self) -> float:
        return self._mean(self.kl_sum)

    def metrics(self, objective: Objective, *, kl_ref: bool = False,
                entropy_floor: bool = False) -> dict[str, float]:
        out = {"loss": self.loss, "clip_frac": self.clip_frac, "ratio_mean": self.ratio_mean,
               "approx_kl": self.approx_kl, "dual_clip_frac": self._mean(self.dual_clipped),
               "tokens": float(self.tokens)}
        if objective == "decoupled":
            out["is_weight_mean"] = self._mean(self.is_weight_sum)
            out["is_truncated_frac"] = self._mean(self.is_truncated)
        if kl_ref:
            out["kl_ref"] = self._mean(self.kl_ref_sum)
        if entropy_floor:
            out["entropy_bonus_frac"] = self._mean(self.entropy_bonus)
        return out


def policy_loss(
    logp_new: torch.Tensor,
    logp_behavior: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    *,
    logp_proximal: torch.Tensor | None = None,
    normalizer: float | None = None,
    token_weights: torch.Tensor | None = None,
    logp_ref: torch.Tensor | None = None,
    pg_normalizer: float | None = None,
    entropy: torch.Tensor | None = None,
    entropy_on: bool = False,
) -> tuple[torch.Tensor, LossStats]:
    """The per-token objective of `cfg.objective`, summed over unmasked tokens (times
    `token_weights` when given: the rows' loss weights) and divided by `normalizer`
    (default: this batch's unmasked token count, weighted likewise). The statistics
    count tokens unweighted.

    All tensors are flat with one entry per token. `logp_proximal` is required
    for `decoupled` (pass `logp_new.detach()` when the step makes one update:
    the proximal policy is then the current one) and ignored for `ppo`.
    `logp_ref` (the reference policy's logprobs, no grad) is required when
    `cfg.kl_coef` > 0: each token then adds kl_coef · k3(new, ref) (module docstring).
    `pg_normalizer`: divide the policy term by it instead (the KL term keeps
    `normalizer`): `pg_mean: signal` passes the tokens of rows with a non-zero advantage.
    `entropy_on` (from `entropy_floor_on`, for the whole minibatch): each token adds
    −entropy_coef · `entropy` (the new policy's, with grad), under `normalizer`.
    """
    if not (logp_new.shape == logp_behavior.shape == advantages.shape == mask.shape):
        raise ValueError("policy_loss: inputs must have one entry per token")
    mask = mask.to(logp_new.dtype)
    count = float(mask.sum())
    scale = mask
    if token_weights is not None:
        if token_weights.shape != mask.shape:
            raise ValueError("policy_loss: token_weights must have one entry per token")
        scale = mask * token_weights.to(mask.dtype)
    if normalizer is not None:
        n = normalizer
    else:
        n = max(count, 1.0) if token_weights is None else max(float(scale.sum()), 1e-12)
    if n <= 0:
        raise ValueError(f"policy_loss: normalizer must be > 0, got {n}")
    eps = cfg.clip_eps
    if cfg.objective == "decoupled":
        if logp_proximal is None:
            raise ValueError("decoupled objective needs logp_proximal")
        if logp_proximal.shape != logp_new.shape:
            raise ValueError("policy_loss: logp_proximal must have one entry per token")
        anchor = logp_proximal.detach()
        raw_w = torch.exp(anchor - logp_behavior)
        weight = torch.clamp(raw_w, max=cfg.is_cap)
    else:
        anchor = logp_behavior
        weight = torch.ones_like(logp_new)
    ratio = torch.exp(logp_new - anchor)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - eps, 1.0 + eps) * advantages
    objective = torch.minimum(unclipped, clipped)
    if cfg.dual_clip is not None:
        floor = cfg.dual_clip * advantages
        dual = torch.where(advantages < 0, torch.maximum(objective, floor), objective)
    else:
        dual = objective
    per_token = -dual * weight
    if pg_normalizer is not None:
        if pg_normalizer <= 0:
            raise ValueError(f"policy_loss: pg_normalizer must be > 0, got {pg_normalizer}")
        per_token = per_token * (n / pg_normalizer)  # its sum over n is then over pg_normalizer
    kl_ref = None
    if cfg.kl_coef > 0:
        if logp_ref is None:
            raise ValueError("policy_loss: kl_coef > 0 needs logp_ref (the reference logprobs)")
        if logp_ref.shape != logp_new.shape:
            raise ValueError("policy_loss: logp_ref must have one entry per token")
        # Masked tokens (a tool's) get 0 before exp, so no inf·0 reaches loss or grad;
        # the ±20 clamp (verl's) keeps one stale token's exp finite.
        ref_log_ratio = torch.where(mask > 0, logp_ref.detach() - logp_new,
                                    torch.zeros_like(logp_new)).clamp(-20.0, 20.0)
        kl_ref = (torch.exp(ref_log_ratio) - ref_log_ratio - 1).clamp(max=KL_CAP)
        per_token = per_token + cfg.kl_coef * kl_ref
    if entropy_on and cfg.entropy_coef > 0:
        if entropy is None or entropy.shape != logp_new.shape:
            raise ValueError("policy_loss: entropy_on needs the new policy's entropy, one per token")
        per_token = per_token - cfg.entropy_coef * entropy
    loss = (per_token * scale).sum() / n
    with torch.no_grad():
        beh_log_ratio = logp_new - logp_behavior
        beh_ratio = torch.exp(beh_log_ratio)
        stats = LossStats(
            loss=float(loss),
            tokens=int(count),
            clipped=float(((unclipped != clipped) & (objective == clipped)).to(mask.dtype).mul(mask).sum()),
            dual_clipped=float(((dual != objective).to(mask.dtype) * mask).sum()),
            ratio_sum=float((beh_ratio * mask).sum()),
            kl_sum=float(((beh_ratio - 1 - beh_log_ratio) * mask).sum()),
        )
        if cfg.objective == "decoupled":
            stats.is_weight_sum = float((weight * mask).sum())
            stats.is_truncated = float(((raw_w > cfg.is_cap).to(mask.dtype) * mask).sum())
        if kl_ref is not None:
            stats.kl_ref_sum = float((kl_ref * mask).sum())
        if entropy_on and cfg.entropy_coef > 0:
            stats.entropy_bonus = count
    return loss, stats


def entropy_floor_on(cfg: LossConfig, behavior_logprobs: torch.Tensor,
                     mask: torch.Tensor) -> bool:
    """Does this minibatch carry the entropy bonus? Yes when its sampled tokens'
    entropy is under `cfg.entropy_floor`, estimated as −mean(behaviour logprob): the
    mean surprisal of tokens drawn from a distribution is an unbiased estimate of its
    entropy. Known before any forward pass and the same on every rank (each holds the
    whole batch), so micro-batches and shards all add the same term, and a resumed
    trainer decides as the crashed one did (nothing is carried between steps).

    A hinge on the batch, not on each token: a per-token floor would push the
    deterministic tokens (the question copied out, the format) off their one right
    choice, while the bonus's gradient, p·(log p + H) per logit, already falls on the
    tokens whose choice is open."""
    if cfg.entropy_floor is None or cfg.entropy_coef <= 0:
        return False
    m = mask.to(behavior_logprobs.dtype)
    n = float(m.sum())
    if n == 0:
        return False
    return -float((behavior_logprobs * m).sum()) / n < cfg.entropy_floor


def ppo_clip_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    *,
    dual_clip: float | None = None,
    normalizer: float | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """PPO-clip against the behaviour logprobs (`policy_loss` with objective `ppo`)."""
    return policy_loss(logp_new, logp_old, advantages, mask,
                       LossConfig("ppo", clip_eps, dual_clip), normalizer=normalizer)

