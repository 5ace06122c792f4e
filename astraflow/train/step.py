"""One trainer step's optimizer updates on a batch: the `Step` protocol and the plain step.

A `Step` takes (model, optimizer, batch, pad id, `StepSettings`) and returns (metrics,
updates made). `optimize` is the step of one process (CPU or one GPU, optionally under
autocast); `astraflow.train.fsdp.ShardedStep` is the same step on FSDP2 ranks. The
trainer picks one from `trainer.ranks`, so the loop never branches on sharding.
`step_settings` turns a policy's `algorithm` section into `StepSettings`.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from astraflow.train.batch import Batch
from astraflow.train.logprobs import completion_logprobs, device_of
from astraflow.train.loss import LossConfig, LossStats, entropy_floor_on, policy_loss
from astraflow.train.trust import TrustRegion, batch_budget, kl_sums

if TYPE_CHECKING:
    from astraflow.config.algorithm import AlgorithmSpec


@dataclass
class StepSettings:
    """How a `Step` cuts a consumed batch: see AlgorithmSpec for each field."""

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
    max_update_kl: float | None = None
    """The trust region of each update (astraflow.train.trust); None: unbounded."""
    max_update_kl_rows: int | None = None
    """Signal rows an update needs for the whole `max_update_kl`; fewer get a share
    (astraflow.train.trust.update_budget). None: every update gets the whole bound."""


class Step(Protocol):
    """One trainer step's updates on `batch` (every rank holds the same batch);
    returns (metrics, optimizer updates made)."""

    def __call__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, batch: Batch,
                 pad_id: int, s: StepSettings) -> tuple[dict[str, float], int]: ...


def split(n: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous, near-equal ranges of range(n) (empty ones dropped)."""
    bounds = [round(i * n / parts) for i in range(parts + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def optimize(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: Batch, pad_id: int,
             s: StepSettings) -> tuple[dict[str, float], int]:
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
    without grad for the reference logprobs; one process only.
    """
    kl = s.loss.kl_coef > 0
    if kl and s.ref_model is None:
        raise ValueError("optimize: loss.kl_coef > 0 needs StepSettings.ref_model")
    model.train()
    batch = batch.to(device_of(model))
    fwd = forward_context(batch, s)
    rows = len(batch)
    ranges = split(rows, s.minibatches)
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
                     for a, b in split(rows, -(-rows // mb_rows))]
        proximal = torch.cat([p.logprobs for p in parts])
        ent = torch.cat([p.entropy for p in parts if p.entropy is not None])
        entropy_sum, entropy_n = float((ent * batch.mask).sum()), int(batch.mask.sum())
        if batch.on_policy_rows is not None and any(batch.on_policy_rows):
            sel = batch.token_rows(batch.on_policy_rows) & (batch.mask > 0)
            mismatch_sum = float((proximal[sel] - batch.behavior_logprobs[sel]).abs().sum())
            mismatch_n = int(sel.sum())
    stats = LossStats()
    grad_norms: list[float] = []
    trust = TrustRegion(opt, s.max_update_kl) if s.max_update_kl else None
    moves: list[tuple[float, float, float]] = []  # (KL before bounding, scale, bound)
    for k, (a, b) in enumerate(ranges):
        mb = batch.select(a, b)
        befores: list[tuple[Batch, torch.Tensor]] = []
        # The minibatch's (weighted) unmasked token count: the mean's denominator.
        n_tokens = float(mb.mask.sum() if mb.weights is None else (mb.mask * mb.weights).sum())
        if n_tokens == 0:
            continue  # every token masked (a tool's turn) or weighted 0: nothing to learn
        n_pg = signal_tokens(mb, s.loss)
        bonus = entropy_floor_on(s.loss, mb.behavior_logprobs, mb.mask)
        opt.zero_grad(set_to_none=True)
        for ma, mb_end in split(len(mb), -(-len(mb) // mb_rows)):
            micro = mb.select(ma, mb_end)
            first_pass = k == 0 and proximal is None
            with fwd():
                out = completion_logprobs(model, micro.prompts, micro.completions, pad_id,
                                          temperature=s.temperature, chunk_tokens=s.chunk_tokens,
                                          entropy=first_pass or bonus)
            new = out.logprobs
            if trust is not None:
                befores.append((micro, new.detach()))
            if first_pass:
                assert out.entropy is not None
                entropy_sum += float((out.entropy.detach() * micro.mask).sum())
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
                                   token_weights=micro.weights, logp_ref=ref,
                                   pg_normalizer=n_pg, entropy=out.entropy, entropy_on=bonus)
            loss.backward()
            stats = stats.merge(st)
        grad_norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)))
        set_lr(opt, s, len(grad_norms) - 1)
        if trust is not None:
            trust.snapshot()
        opt.step()
        if trust is not None:
            def measure(befores=befores) -> float:
                total, n = 0.0, 0.0
                with torch.no_grad(), fwd():
                    for micro, before in befores:
                        after = completion_logprobs(model, micro.prompts, micro.completions,
                                                    pad_id, temperature=s.temperature,
                                                    chunk_tokens=s.chunk_tokens).logprobs
                        t, m = kl_sums(before, after, micro.mask)
                        total, n = total + t, n + m
                return total / max(n, 1.0)

            limit = batch_budget(trust.max_kl, mb.advantages, mb.offsets(),
                                 s.max_update_kl_rows, mb.solved_share)
            moves.append((*trust.bound(measure, limit), limit))
    metrics = step_metrics(stats, s.loss, grad_norms, (entropy_sum, entropy_n),
                           (mismatch_sum, mismatch_n))
    metrics.update(move_metrics(moves), lr=opt.param_groups[0]["lr"])  # the last update's
    return metrics, len(grad_norms)


def signal_tokens(mb: Batch, loss: LossConfig) -> float | None:
    """`pg_mean: signal`: the minibatch's (weighted) unmasked tokens in rows with a
    non-zero advantage, the policy term's denominator (at least 1: with none, that term
    is zero anyway); None for `all` (the term shares the step's token mean)."""
    if loss.pg_mean == "all":
        return None
    m = mb.mask * (mb.advantages != 0).to(mb.mask.dtype)
    return max(float(m.sum() if mb.weights is None else (m * mb.weights).sum()), 1.0)


def move_metrics(moves: list[tuple[float, float, float]]) -> dict[str, float]:
    """`update_kl`: the mean KL(before ‖ after) an update measured before the trust region
    bounded it; `update_scale`: the mean scale the bound kept (1.0: none bounded);
    `update_kl_bound`: the mean bound the updates had (less than `max_update_kl` where
    `max_update_kl_rows` scaled it down)."""
    if not moves:
        return {}
    return {"update_kl": sum(m[0] for m in moves) / len(moves),
            "update_scale": sum(m[1] for m in moves) / len(moves),
            "update_kl_bound": sum(m[2] for m in moves) / len(moves)}


def step_metrics(stats: LossStats, loss: LossConfig, grad_norms: list[float],
                 entropy: tuple[float, float], mismatch: tuple[float, float]) -> dict[str, float]:
    """A step's metrics from its loss sums, per-update gradient norms, and the (sum,
    tokens) of entropy and of |trainer − behaviour| logprob on on-policy rows."""
    metrics = stats.metrics(loss.objective, kl_ref=loss.kl_coef > 0,
                            entropy_floor=loss.entropy_floor is not None)
    if grad_norms:
        metrics["loss"] = stats.loss / len(grad_norms)  # mean of the updates' losses
        metrics["grad_norm"] = sum(grad_norms) / len(grad_norms)
    if entropy[1]:
        metrics["entropy"] = entropy[0] / entropy[1]
    if mismatch[1]:
        metrics["logp_mismatch"] = mismatch[0] / mismatch[1]
        metrics["logp_mismatch_tokens"] = float(mismatch[1])
    return metrics


def forward_context(batch: Batch, s: StepSettings) -> Callable[[], contextlib.AbstractContextManager]:
    """torch.autocast for mixed precision in one process, else nothing."""
    if s.autocast is None:
        return contextlib.nullcontext
    kind = batch.mask.device.type
    return lambda: torch.autocast(kind, dtype=s.autocast)


def set_lr(opt: torch.optim.Optimizer, s: StepSettings, k: int) -> None:
    """The schedule's rate for this call's k-th update, on every parameter group."""
    if s.lr is not None:
        rate = s.lr(s.first_update + k)
        for g in opt.param_groups:
            g["lr"] = rate


def make_optimizer(params: list[torch.nn.Parameter], algo: AlgorithmSpec, *,
                   allocate: bool = True) -> torch.optim.AdamW:
    """The policy's AdamW, on torch's fused kernel: one pass over each parameter instead
    of a chain of elementwise ops per tensor. On SmolLM2-135M, 2 CPU threads, an update
    took 0.04 s fused against 0.3-1.1 s (and 1.3 s against 3.0 s for the first, which
    allocates the moments): a tenth of a trainer step on the peers benchmark. Same
    update rule, state-dict format and checkpoints as the unfused optimizer. `allocate`:
    its moments are allocated here (allocate_moments), off the first update's clock; a
    trainer resuming from a checkpoint passes False, since the checkpoint's moments
    replace them (allocating first would only hold both copies at once)."""
    opt = torch.optim.AdamW(params, lr=algo.lr, betas=algo.betas,
                            weight_decay=algo.weight_decay, fused=True)
    if allocate:
        allocate_moments(opt)
    return opt


def allocate_moments(opt: torch.optim.Optimizer) -> None:
    """Give a fresh AdamW its state now (both moments zero, step 0), as its first
    `step()` would. That first step otherwise allocates and first touches two copies of
    the parameters inside the first update, on the clock (1.8 s of a 5.3 s first step on
    SmolLM2, 2 CPU threads); the trainer calls this before its first batch arrives. The
    update that follows is the one a lazily initialised AdamW makes."""
    sd = opt.state_dict()
    if sd["state"]:
        return
    params = [p for g in opt.param_groups for p in g["params"]]
    ids = [i for g in sd["param_groups"] for i in g["params"]]
    sd["state"] = {i: {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                       "exp_avg_sq": torch.zeros_like(p)}
                   for i, p in zip(ids, params, strict=True) if p.requires_grad}
    opt.load_state_dict(sd)


def lr_schedule(algo: AlgorithmSpec, *, budget_updates: int | None = None,
                budget_used: float = 0.0) -> Callable[[int], float] | None:
    """The learning rate of optimizer update n (`algorithm.lr_warmup_steps`,
    `lr_schedule`): linear warmup to `lr`, then constant or cosine down to
    `lr`·`lr_min_ratio`. Over `lr_decay_steps` updates, a pure function of the update
    count, which checkpoints hold, so a resumed run stays on the curve. With
    `lr_decay_steps` None the cosine spans the run's budget: its position is the larger
    of the updates made over `budget_updates` (`stop.max_steps` × `minibatches`) and
    `budget_used`, the share of `stop.max_minutes` gone at this trainer step (read from
    the store's version 0, so a resumed trainer also stays on it). None when the rate is
    constant from the start."""
    lr, warm = algo.lr, algo.lr_warmup_steps
    if warm == 0 and algo.lr_schedule == "constant":
        return None

    def at(n: int) -> float:
        if n < warm:
            return lr * (n + 1) / warm
        if algo.lr_schedule == "constant":
            return lr
        if algo.lr_decay_steps is not None:
            t = (n - warm) / algo.lr_decay_steps
        else:
            t = budget_used
            if budget_updates is not None:
                t = max(t, (n - warm) / max(1, budget_updates - warm))
        t = min(1.0, max(0.0, t))
        return lr * (algo.lr_min_ratio + (1 - algo.lr_min_ratio) * 0.5 * (1 + math.cos(math.pi * t)))

    return at


def budget_used(algo: AlgorithmSpec, max_minutes: float,
                run_start: Callable[[], float]) -> float:
    """The share of the run's `max_minutes` gone since `run_start()` (only read when the
    rate decays over the run's budget; else 0). The trainer passes version 0's publish
    time, which the store keeps, so a restarted trainer measures from the same moment;
    it reads this on rank 0 and shares it, so every rank steps with one rate."""
    if algo.lr_schedule != "cosine" or algo.lr_decay_steps is not None:
        return 0.0
    return (time.time() - run_start()) / (max_minutes * 60)


def step_settings(algo: AlgorithmSpec, *, temperature: float, first_update: int,
                  autocast: torch.dtype | None = None,
                  ref_model: torch.nn.Module | None = None,
                  budget_updates: int | None = None, budget_used: float = 0.0,
                  entropy_floor: float | None = None) -> StepSettings:
    """A policy's `algorithm` section as StepSettings; logprobs are taken at the flow's
    sampling `temperature`, as the engines record them (the budget: see lr_schedule).
    `entropy_floor`: the floor in nats (astraflow.train.floor.EntropyFloor resolves
    `entropy_floor_of_v0`, which must be passed); None: `algo.entropy_floor`."""
    if entropy_floor is None and algo.entropy_floor_of_v0 is not None:
        raise ValueError("step_settings: algorithm.entropy_floor_of_v0 is a share of version "
                         "0's entropy; pass the floor it resolves to (EntropyFloor.nats())")
    floor = algo.entropy_floor if entropy_floor is None else entropy_floor
    return StepSettings(
        loss=LossConfig(algo.objective, algo.clip_eps, algo.dual_clip, algo.is_cap,
                        algo.kl_coef, algo.pg_mean, floor, algo.entropy_coef),
        temperature=temperature, minibatches=algo.minibatches,
        micro_batch_rows=algo.micro_batch_rows, chunk_tokens=algo.logprob_chunk_tokens,
        grad_clip=algo.grad_clip, first_update=first_update,
        lr=lr_schedule(algo, budget_updates=budget_updates, budget_used=budget_used),
        autocast=autocast, ref_model=ref_model, max_update_kl=algo.max_update_kl,
        max_update_kl_rows=algo.max_update_kl_rows)
