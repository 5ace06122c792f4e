"""Policy losses over per-token logprobs, the forward pass that feeds them, and one
optimizer step on a batch (shared by the trainer and the tests of learning).

Token-level: every completion token the policy wrote (loss mask 1) carries its
sequence's advantage. Two objectives (`algorithm.objective`):

  * `ppo`: the importance ratio is the new policy's probability over the
    behaviour probability the rollout worker recorded, clipped to 1±eps. The
    trust region is centred on the behaviour policy, which in an asynchronous
    run may be up to `rollout.max_weight_lag` versions old.
  * `decoupled` (AReaL's decoupled PPO, Fu et al. 2025): the clip is centred on
    a *proximal* policy, the trainer's weights before this step's first update,
    and the behaviour→proximal gap is corrected by an importance weight
    exp(proximal − behaviour), truncated at `is_cap` and detached. So a stale
    row moves the policy at most eps away from where it is now, not from where
    it was when the row was sampled. (AReaL masks tokens whose weight exceeds
    its cap; we truncate, as truncated IS / V-trace do, so such a token still
    pushes, at most `is_cap` times as hard.)

Dual clip (Ye et al. 2020, `dual_clip: c`): for a negative advantage the plain
PPO objective min(r·A, clip(r)·A) is unbounded below as r grows (a token the
new policy likes far more than the behaviour policy did); the dual clip bounds
the per-token objective at c·A, so one such token cannot dominate the batch.

The loss is normalised by a caller-given token count (`normalizer`): with
gradient accumulation every micro-batch divides by the *global* number of
unmasked tokens of the optimizer step, so the summed gradient equals the
one-shot gradient of the mean over the whole step.

KL penalty toward a reference (`kl_coef`, as verl/TRL offer): with reference
logprobs (a frozen copy of the policy's version 0, `StepSettings.ref_model`) every
unmasked token adds kl_coef · k3, the estimator exp(ref − new) − (ref − new) − 1
of KL(new ‖ ref) (≥ 0, unbiased, low variance; Schulman, "Approximating KL
Divergence"), normalised like the policy term (same token count and weights).
Its gradient pulls the policy back toward the reference on the tokens it sampled.
The log ratio is clamped to ±20 first (as verl does), so one token far from the
reference (a stale row's) cannot make the term infinite.

Length normalisation: a row may carry a loss weight (the `length_norm` data stage
writes one; astraflow/data/shaping.py). The loss is then the weighted token mean
Σ w·m·ℓ / Σ w·m over the update's tokens: w = 1 everywhere is the plain token mean
(the default), w = 1/(row's unmasked tokens) the mean over rows of each row's
token mean (sequence-mean). The normaliser is the weighted count, so the result
is exact for any minibatch and micro-batch cut.

Memory: `completion_logprobs` runs the backbone once, then the output head and
log-softmax only at completion positions, a chunk of tokens at a time under
activation checkpointing, so neither forward nor backward ever holds a
(batch × sequence × vocabulary) tensor; `completion_logprobs_reference` is the
old full-vocabulary computation, kept as the reference the tests and
`benchmarks/memory.py` compare against.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch
from torch.utils.checkpoint import checkpoint

if TYPE_CHECKING:
    from astraflow.train.dist import Ranks

Objective = Literal["ppo", "decoupled"]


# --------------------------------------------------------------------------- losses
@dataclass(frozen=True)
class LossConfig:
    """The objective's settings (from `algorithm`); see the module docstring."""

    objective: Objective = "ppo"
    clip_eps: float = 0.2
    dual_clip: float | None = None
    is_cap: float = 2.0
    kl_coef: float = 0.0

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

    def metrics(self, objective: Objective, *, kl_ref: bool = False) -> dict[str, float]:
        out = {"loss": self.loss, "clip_frac": self.clip_frac, "ratio_mean": self.ratio_mean,
               "approx_kl": self.approx_kl, "dual_clip_frac": self._mean(self.dual_clipped),
               "tokens": float(self.tokens)}
        if objective == "decoupled":
            out["is_weight_mean"] = self._mean(self.is_weight_sum)
            out["is_truncated_frac"] = self._mean(self.is_truncated)
        if kl_ref:
            out["kl_ref"] = self._mean(self.kl_ref_sum)
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
        kl_ref = torch.exp(ref_log_ratio) - ref_log_ratio - 1
        per_token = per_token + cfg.kl_coef * kl_ref
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
    return loss, stats


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


# --------------------------------------------------------------------------- forward pass
def _right_padded(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                  pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids, attention mask, and the mask of positions whose next token is a completion
    token (logits at position j predict token j+1)."""
    if len(prompts) != len(completions):
        raise ValueError("one completion per prompt")
    for p in prompts:
        if not p:
            raise ValueError("every prompt needs at least one token (the first completion "
                             "token is predicted from the last prompt position)")
    width = max(len(p) + len(c) for p, c in zip(prompts, completions, strict=True))
    n = len(prompts)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    target_mask = torch.zeros((n, width - 1), dtype=torch.bool)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[i, : len(p) + len(c)] = torch.tensor([*p, *c], dtype=torch.long)
        attn[i, : len(p) + len(c)] = 1
        target_mask[i, len(p) - 1 : len(p) + len(c) - 1] = True
    return ids, attn, target_mask


def completion_logprobs_reference(
    model: torch.nn.Module, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
    pad_id: int, *, temperature: float = 1.0,
) -> torch.Tensor:
    """The full-vocabulary computation (logits and a float32 log-softmax at every
    position of the batch): simple and obviously right, and memory-hungry. The
    reference for `completion_logprobs` in tests and in benchmarks/memory.py."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    ids, attn, target_mask = _right_padded(prompts, completions, pad_id)
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1, :].float()
    if temperature != 1.0:  # at T = 1 exactly the old code (and its memory), no extra copy
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    taken = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    return taken[target_mask]


@dataclass
class TokenLogprobs:
    """Per completion token, flattened row by row: the logprob (with grad when the
    caller's context has grad) and, if asked, the entropy (no grad) of the
    temperature-T distribution it was sampled from."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None


@dataclass
class _Parts:
    backbone: torch.nn.Module
    head: torch.nn.Module


#: Models whose head/backbone split `_check_head_matches` has verified (by identity).
_VERIFIED: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def _parts(model: torch.nn.Module) -> _Parts:
    """The backbone (hidden states) and output head of an HF causal LM."""
    backbone = None
    get_decoder = getattr(model, "get_decoder", None)
    if callable(get_decoder):
        backbone = get_decoder()
    if backbone is None or backbone is model:
        prefix = getattr(model, "base_model_prefix", "")
        backbone = getattr(model, prefix, None) if prefix else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if backbone is None or backbone is model or head is None:
        raise TypeError(
            f"{type(model).__name__}: cannot split it into a backbone and an output head "
            f"(get_decoder()/base_model_prefix, get_output_embeddings()); the chunked logprobs "
            f"need an HF causal LM")
    return _Parts(backbone, head)


def _check_head_matches(model: torch.nn.Module, parts: _Parts) -> None:
    """Once per model object: the head applied to the backbone's hidden states must
    give the model's own logits. Some architectures transform logits after the
    head (Gemma 2's soft-capping, Granite's and Cohere's scaling); rather than
    list them, refuse any model for which the split is not exact."""
    if model in _VERIFIED:
        return
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            ids = torch.tensor([[0, 1, 2, 1]], dtype=torch.long, device=_device_of(model))
            attn = torch.ones_like(ids)
            want = model(input_ids=ids, attention_mask=attn, use_cache=False).logits.float()
            hidden = parts.backbone(input_ids=ids, attention_mask=attn,
                                    use_cache=False).last_hidden_state
            got = parts.head(hidden).float()
    finally:
        model.train(was_training)
    if got.shape != want.shape or not torch.allclose(got, want, atol=1e-4, rtol=1e-4):
        raise TypeError(
            f"{type(model).__name__}: its logits are not head(backbone(x)) (the model transforms "
            f"them after the output head); completion_logprobs cannot chunk it — use "
            f"completion_logprobs_reference or teach _parts this architecture")
    _VERIFIED.add(model)


def _chunk_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor,
                    temperature: float, entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprobs of `targets` (with grad) and, if asked, the entropy of each position's
    distribution (no grad; empty otherwise), from one head matmul."""
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    taken = logp.gather(-1, targets[:, None]).squeeze(-1)
    if not entropy:
        return taken, taken.new_zeros((0,))
    with torch.no_grad():
        return taken, -(logp.exp() * logp).sum(-1)


def completion_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    entropy: bool = False,
) -> TokenLogprobs:
    """Logprob of every completion token under `model` at sampling temperature
    `temperature` (log_softmax(logits / T), what the engines record), flattened
    row by row.

    Sequences are right-padded, so positions start at 0 for every row exactly as
    in the rollout engine's left-padded decode with explicit position ids. The
    backbone runs once; the head and log-softmax run only at completion
    positions, `chunk_tokens` at a time, each chunk under activation
    checkpointing: backward recomputes a chunk's logits instead of keeping them,
    so peak memory holds one chunk's logits, not the batch's.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    ids, attn, target_mask = _right_padded(prompts, completions, pad_id)
    if isinstance(model, LogprobModel):  # one forward FSDP can hook (see LogprobModel)
        device = model.device
        out, ent = model(ids.to(device), attn.to(device), target_mask.to(device),
                         temperature, chunk_tokens, entropy)
        return TokenLogprobs(out, ent.detach() if entropy else None)
    parts = _parts(model)
    _check_head_matches(model, parts)
    device = _device_of(model)
    if device.type != "cpu":
        ids, attn, target_mask = ids.to(device), attn.to(device), target_mask.to(device)
    out, ent = _token_logprobs(parts, ids, attn, target_mask, temperature, chunk_tokens, entropy)
    return TokenLogprobs(out, ent.detach() if entropy else None)


def _device_of(model: torch.nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _token_logprobs(parts: _Parts, ids: torch.Tensor, attn: torch.Tensor,
                    target_mask: torch.Tensor, temperature: float, chunk_tokens: int,
                    entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The backbone once, then head + log-softmax chunk by chunk (see completion_logprobs)."""
    hidden = parts.backbone(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
    h = hidden[:, :-1, :][target_mask]           # (tokens, hidden)
    targets = ids[:, 1:][target_mask]            # (tokens,)
    pieces: list[torch.Tensor] = []
    ent: list[torch.Tensor] = []
    for s in range(0, h.shape[0], chunk_tokens):
        hc, tc = h[s : s + chunk_tokens], targets[s : s + chunk_tokens]
        if torch.is_grad_enabled():  # backward recomputes the chunk's logits
            lp, e = checkpoint(_chunk_logprobs, parts.head, hc, tc, temperature, entropy,
                               use_reentrant=False)
        else:
            lp, e = _chunk_logprobs(parts.head, hc, tc, temperature, entropy)
        pieces.append(lp)
        ent.append(e)
    empty = h.new_zeros((0,), dtype=torch.float32)
    out = torch.cat(pieces) if pieces else empty
    return out, (torch.cat(ent) if ent and entropy else empty)


class LogprobModel(torch.nn.Module):
    """An HF causal LM whose forward is the chunked completion-logprob pass.

    FSDP2 gathers a unit's parameters in its forward hooks; `completion_logprobs`
    calls the backbone and the output head separately, so sharded, the root
    unit's parameters (embeddings, final norm, tied head) would never be gathered.
    Wrapped, one forward of this module covers every use: shard the decoder layers
    and then this wrapper (astraflow.train.dist.shard). `policy` is the HF model
    itself (its state-dict keys gain a `policy.` prefix here)."""

    def __init__(self, policy: torch.nn.Module, device: torch.device):
        super().__init__()
        _check_head_matches(policy, _parts(policy))  # before sharding: it calls the model
        self.policy = policy
        self.device = device

    def forward(self, ids: torch.Tensor, attn: torch.Tensor, target_mask: torch.Tensor,
                temperature: float, chunk_tokens: int, entropy: bool
                ) -> tuple[torch.Tensor, torch.Tensor]:
        return _token_logprobs(_parts(self.policy), ids, attn, target_mask, temperature,
                               chunk_tokens, entropy)


# --------------------------------------------------------------------------- one step
@dataclass
class Batch:
    """One optimizer step's rows: token ids, and per completion token (flattened
    row by row) the behaviour logprob, loss mask and the row's advantage.
    `on_policy_rows`: rows sampled by exactly the weights the trainer holds
    (for the engine-vs-trainer mismatch), or None when no row is. `weights`: per
    token, its row's loss weight (None: all 1, the plain token mean)."""

    prompts: list[list[int]]
    completions: list[list[int]]
    behavior_logprobs: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor
    on_policy_rows: list[bool] | None = None
    weights: torch.Tensor | None = None

    def __post_init__(self) -> None:
        n = sum(len(c) for c in self.completions)
        if self.weights is not None and self.weights.numel() != n:
            raise ValueError(f"Batch: {n} completion tokens but {self.weights.numel()} weights")
        if not (self.behavior_logprobs.numel() == self.mask.numel() == self.advantages.numel() == n):
            raise ValueError(f"Batch: {n} completion tokens but {self.behavior_logprobs.numel()} "
                             f"behaviour logprobs, {self.mask.numel()} mask entries, "
                             f"{self.advantages.numel()} advantages")

    @classmethod
    def from_rows(cls, prompts: list[list[int]], completions: list[list[int]],
                  behavior_logprobs: list[list[float]], loss_mask: list[list[int]],
                  advantages: list[float], on_policy_rows: list[bool] | None = None,
                  loss_weight: list[float] | None = None) -> Batch:
        weights = None if loss_weight is None else torch.tensor(
            [w for w, c in zip(loss_weight, completions, strict=True) for _ in c], dtype=torch.float32)
        return cls(
            prompts, completions,
            torch.tensor([x for r in behavior_logprobs for x in r], dtype=torch.float32),
            torch.tensor([x for r in loss_mask for x in r], dtype=torch.float32),
            torch.tensor([a for a, c in zip(advantages, completions, strict=True) for _ in c],
                         dtype=torch.float32),
            on_policy_rows, weights)

    def __len__(self) -> int:
        return len(self.prompts)

    def offsets(self) -> list[int]:
        out = [0]
        for c in self.completions:
            out.append(out[-1] + len(c))
        return out

    def select(self, start: int, stop: int) -> Batch:
        """Rows start..stop-1."""
        off = self.offsets()
        a, b = off[start], off[stop]
        return Batch(self.prompts[start:stop], self.completions[start:stop],
                     self.behavior_logprobs[a:b], self.mask[a:b], self.advantages[a:b],
                     None if self.on_policy_rows is None else self.on_policy_rows[start:stop],
                     None if self.weights is None else self.weights[a:b])

    def token_rows(self, flags: Sequence[bool]) -> torch.Tensor:
        """A per-token bool mask from a per-row flag (on the batch's device)."""
        return torch.tensor([f for f, c in zip(flags, self.completions, strict=True) for _ in c],
                            dtype=torch.bool, device=self.mask.device)

    def to(self, device: torch.device) -> Batch:
        """The per-token tensors on `device` (the token ids stay lists until padded)."""
        if self.mask.device == device:
            return self
        return Batch(self.prompts, self.completions, self.behavior_logprobs.to(device),
                     self.mask.to(device), self.advantages.to(device), self.on_policy_rows,
                     None if self.weights is None else self.weights.to(device))


@dataclass
class StepSettings:
    """How `optimize` cuts a consumed batch: see AlgorithmSpec for each field."""

    loss: LossConfig = field(default_factory=LossConfig)
    temperature: float = 1.0
    minibatches: int = 1
    micro_batch_rows: int | None = None
    chunk_tokens: int = 1024
    grad_clip: float = 1.0
    lr: Callable[[int], float] | None = None
    """The learning rate of optimizer update number n (counted over the whole run), set
    on every parameter group before that update; None: the optimizer's own."""
    first_update: int = 0
    """The run-wide number of this call's first update (for `lr`)."""
    autocast: torch.dtype | None = None
    """One process on mixed precision: forward passes under torch.autocast in this
    dtype over float32 weights (sharded ranks use FSDP2's policy instead)."""
    ref_model: torch.nn.Module | None = None
    """`loss.kl_coef` > 0: the frozen reference policy (eval mode, no grad, on the
    policy's device); its logprobs are computed per micro-batch without grad, at the
    same temperature and chunking as the policy's."""


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous, near-equal ranges of range(n) (empty ones dropped)."""
    bounds = [round(i * n / parts) for i in range(parts + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def optimize(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: Batch, pad_id: int,
             s: StepSettings, ranks: Ranks | None = None) -> tuple[dict[str, float], int]:
    """Train on `batch`: `s.minibatches` optimizer updates over contiguous slices of
    its rows (one epoch: every row is used exactly once), each accumulated over
    micro-batches of `s.micro_batch_rows` rows and normalised by the minibatch's
    unmasked token count (weighted by the rows' loss weights, when the batch has
    them). Returns (metrics, updates made).

    Decoupled objective: the proximal logprobs are the model's before the first
    update. With one update they are the micro-batch's own logprobs, detached
    (no extra forward); with several, one no-grad pass over all rows computes
    them first. Entropy and the engine-vs-trainer mismatch (mean |trainer −
    behaviour| logprob over unmasked tokens of `batch.on_policy_rows`) are
    measured on logprobs computed before any update of this call: all rows when
    the proximal pass ran, else the first minibatch's rows.

    KL penalty (`s.loss.kl_coef` > 0): every micro-batch also runs `s.ref_model` once
    without grad for the reference logprobs (module docstring); one process only.

    With `ranks` of more than one rank (an FSDP2-sharded `LogprobModel` on every rank,
    each holding the same `batch`), see `_optimize_sharded`.
    """
    kl = s.loss.kl_coef > 0
    if kl and s.ref_model is None:
        raise ValueError("optimize: loss.kl_coef > 0 needs StepSettings.ref_model")
    if ranks is not None and ranks.world > 1:
        if kl:
            raise ValueError("algorithm.kl_coef > 0 is not supported with FSDP2-sharded "
                             "training (several ranks) yet")
        return _optimize_sharded(model, opt, batch, pad_id, s, ranks)
    model.train()
    batch = batch.to(_device_of(model))
    fwd = _forward_context(batch, s)
    rows = len(batch)
    ranges = _split(rows, s.minibatches)
    many = len(ranges) > 1
    mb_rows = s.micro_batch_rows or rows
    off = batch.offsets()
    proximal: torch.Tensor | None = None
    entropy_sum, entropy_n = 0.0, 0
    mismatch_sum, mismatch_n = 0.0, 0
    if s.loss.objective == "decoupled" and many:
        with torch.no_grad(), fwd():
            parts = [completion_logprobs(model, batch.prompts[a:b], batch.completions[a:b], pad_id,
                                         temperature=s.temperature, chunk_tokens=s.chunk_tokens,
                                         entropy=True)
                     for a, b in _split(rows, -(-rows // mb_rows))]
        proximal = torch.cat([p.logprobs for p in parts])
        ent = torch.cat([p.entropy for p in parts if p.entropy is not None])
        entropy_sum, entropy_n = float((ent * batch.mask).sum()), int(batch.mask.sum())
        if batch.on_policy_rows is not None and any(batch.on_policy_rows):
            sel = batch.token_rows(batch.on_policy_rows) & (batch.mask > 0)
            mismatch_sum = float((proximal[sel] - batch.behavior_logprobs[sel]).abs().sum())
            mismatch_n = int(sel.sum())
    stats = LossStats()
    grad_norms: list[float] = []
    for k, (a, b) in enumerate(ranges):
        mb = batch.select(a, b)
        # The minibatch's (weighted) unmasked token count: the mean's denominator.
        n_tokens = float(mb.mask.sum() if mb.weights is None else (mb.mask * mb.weights).sum())
        if n_tokens == 0:
            continue  # every token masked (a tool's turn) or weighted 0: nothing to learn
        opt.zero_grad(set_to_none=True)
        for ma, mb_end in _split(len(mb), -(-len(mb) // mb_rows)):
            micro = mb.select(ma, mb_end)
            first_pass = k == 0 and proximal is None
            with fwd():
                out = completion_logprobs(model, micro.prompts, micro.completions, pad_id,
                                          temperature=s.temperature, chunk_tokens=s.chunk_tokens,
                                          entropy=first_pass)
            new = out.logprobs
            if first_pass:
                assert out.entropy is not None
                entropy_sum += float((out.entropy * micro.mask).sum())
                entropy_n += int(micro.mask.sum())
                if micro.on_policy_rows is not None and any(micro.on_policy_rows):
                    sel = micro.token_rows(micro.on_policy_rows) & (micro.mask > 0)
                    mismatch_sum += float((new.detach()[sel] - micro.behavior_logprobs[sel])
                                          .abs().sum())
                    mismatch_n += int(sel.sum())
            if proximal is not None:
                prox = proximal[off[a + ma] : off[a + mb_end]]
            else:
                prox = new.detach()
            ref = None
            if kl:
                assert s.ref_model is not None
                with torch.no_grad(), fwd():
                    ref = completion_logprobs(s.ref_model, micro.prompts, micro.completions,
                                              pad_id, temperature=s.temperature,
                                              chunk_tokens=s.chunk_tokens).logprobs
            loss, st = policy_loss(new, micro.behavior_logprobs, micro.advantages, micro.mask,
                                   s.loss, logp_proximal=prox, normalizer=n_tokens,
                                   token_weights=micro.weights, logp_ref=ref)
            loss.backward()
            stats = stats.merge(st)
        grad_norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)))
        _set_lr(opt, s, len(grad_norms) - 1)
        opt.step()
    metrics = stats.metrics(s.loss.objective, kl_ref=kl)
    if grad_norms:
        metrics["loss"] = stats.loss / len(grad_norms)  # mean of the updates' losses
        metrics["grad_norm"] = sum(grad_norms) / len(grad_norms)
    if entropy_n:
        metrics["entropy"] = entropy_sum / entropy_n
    if mismatch_n:
        metrics["logp_mismatch"] = mismatch_sum / mismatch_n
        metrics["logp_mismatch_tokens"] = float(mismatch_n)
    return metrics, len(grad_norms)


def _forward_context(batch: Batch, s: StepSettings) -> Callable[[], contextlib.AbstractContextManager]:
    """torch.autocast for mixed precision in one process, else nothing."""
    if s.autocast is None:
        return contextlib.nullcontext
    kind = batch.mask.device.type
    return lambda: torch.autocast(kind, dtype=s.autocast)


def _set_lr(opt: torch.optim.Optimizer, s: StepSettings, k: int) -> None:
    """The schedule's rate for this call's k-th update, on every parameter group."""
    if s.lr is not None:
        rate = s.lr(s.first_update + k)
        for g in opt.param_groups:
            g["lr"] = rate


def _rank_micros(a: int, b: int, rank: int, world: int, mb_rows: int) -> list[tuple[int, int]]:
    """This rank's contiguous share of minibatch rows a..b-1, cut into micro-batches.
    Every rank gets the same number of them (FSDP's collectives pair up forward for
    forward), some possibly empty (start == stop) when rows do not divide evenly."""
    n = b - a
    bounds = [a + round(i * n / world) for i in range(world + 1)]
    lo, hi = bounds[rank], bounds[rank + 1]
    per_rank = -(-n // world)
    micros = -(-per_rank // mb_rows)
    share = hi - lo
    cuts = [lo + round(i * share / micros) for i in range(micros + 1)]
    return list(zip(cuts, cuts[1:], strict=False))


def _optimize_sharded(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: Batch,
                      pad_id: int, s: StepSettings, ranks: Ranks) -> tuple[dict[str, float], int]:
    """`optimize` on one of several FSDP2 ranks: the same minibatches and updates, each
    rank running forward/backward on its contiguous share of every minibatch's rows.

    Every micro-batch loss is still divided by the minibatch's *global* token count;
    FSDP2 averages gradients over the ranks, so each rank scales its loss by the world
    size and the reduced gradient is the single-process one. A rank whose share of a
    minibatch is short runs a zero-weighted pass on a real row instead of an empty
    micro-batch, so every rank issues the same collectives. Metrics are summed over
    the ranks; the gradient norm is the global one (clip_grad_norm_ over DTensors).
    """
    model.train()
    batch = batch.to(ranks.device)
    rows = len(batch)
    ranges = _split(rows, s.minibatches)
    mb_rows = s.micro_batch_rows or rows
    plans = [_rank_micros(a, b, ranks.rank, ranks.world, mb_rows) for a, b in ranges]

    def logprobs(a: int, x: int, y: int, entropy: bool) -> tuple[Batch, TokenLogprobs, bool]:
        dummy = x == y
        micro = batch.select(a, a + 1) if dummy else batch.select(x, y)
        out = completion_logprobs(model, micro.prompts, micro.completions, pad_id,
                                  temperature=s.temperature, chunk_tokens=s.chunk_tokens,
                                  entropy=entropy and not dummy)
        return micro, out, dummy

    ent = [0.0, 0.0]  # entropy sum, tokens
    mis = [0.0, 0.0]  # |trainer - behaviour| sum, tokens

    def measure(micro: Batch, out: TokenLogprobs) -> None:
        assert out.entropy is not None
        ent[0] += float((out.entropy * micro.mask).sum())
        ent[1] += float(micro.mask.sum())
        if micro.on_policy_rows is not None and any(micro.on_policy_rows):
            sel = micro.token_rows(micro.on_policy_rows) & (micro.mask > 0)
            mis[0] += float((out.logprobs.detach()[sel] - micro.behavior_logprobs[sel]).abs().sum())
            mis[1] += float(sel.sum())

    proximal: list[list[torch.Tensor]] | None = None
    if s.loss.objective == "decoupled" and len(ranges) > 1:
        proximal = []
        with torch.no_grad():
            for (a, _), plan in zip(ranges, plans, strict=True):
                pieces = []
                for x, y in plan:
                    micro, out, dummy = logprobs(a, x, y, True)
                    if not dummy:
                        measure(micro, out)
                        pieces.append(out.logprobs)
                proximal.append(pieces)
    stats = LossStats()
    grad_norms: list[float] = []
    for k, ((a, b), plan) in enumerate(zip(ranges, plans, strict=True)):
        whole = batch.select(a, b)  # loss weights (data stages) scale the token count too
        n_tokens = float(whole.mask.sum() if whole.weights is None
                         else (whole.mask * whole.weights).sum())
        if n_tokens == 0:
            continue  # the same on every rank: they all hold the whole batch
        opt.zero_grad(set_to_none=True)
        real = 0
        for x, y in plan:
            first_pass = k == 0 and proximal is None
            micro, out, dummy = logprobs(a, x, y, first_pass)
            new = out.logprobs
            if first_pass and not dummy:
                measure(micro, out)
            prox = new.detach() if proximal is None or dummy else proximal[k][real]
            loss, st = policy_loss(new, micro.behavior_logprobs, micro.advantages, micro.mask,
                                   s.loss, logp_proximal=prox, normalizer=n_tokens,
                                   token_weights=micro.weights)
            if dummy:
                (loss * 0.0).backward()
            else:
                (loss * ranks.world).backward()
                stats = stats.merge(st)
                real += 1
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        full = getattr(norm, "full_tensor", None)
        grad_norms.append(float(full() if full is not None else norm))
        _set_lr(opt, s, len(grad_norms) - 1)
        opt.step()
    names = list(LossStats.__dataclass_fields__)
    summed = ranks.all_sum([float(getattr(stats, n)) for n in names] + ent + mis)
    stats = LossStats(**{n: (int(v) if n == "tokens" else v) 
                         for n, v in zip(names, summed[:len(names)], strict=True)})
    ent_sum, ent_n, mis_sum, mis_n = summed[len(names):]
    metrics = stats.metrics(s.loss.objective)
    if grad_norms:
        metrics["loss"] = stats.loss / len(grad_norms)
        metrics["grad_norm"] = sum(grad_norms) / len(grad_norms)
    if ent_n:
        metrics["entropy"] = ent_sum / ent_n
    if mis_n:
        metrics["logp_mismatch"] = mis_sum / mis_n
        metrics["logp_mismatch_tokens"] = float(mis_n)
    return metrics, len(grad_norms)
