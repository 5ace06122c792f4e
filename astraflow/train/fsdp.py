"""The FSDP2 step: shard a policy over the trainer's ranks and train it there.

`shard` wraps every decoder layer and the `LogprobModel` root in FSDP2 units;
`ShardedStep` is the `Step` (astraflow/train/step.py) on those ranks: each rank trains
on its contiguous share of every minibatch's rows, FSDP2 averages the gradients, and
the loss is pre-scaled by the world size so the update equals the single-process one.
`full_state_dict` gathers the full weights on rank 0 for publishing.
"""

from __future__ import annotations

import torch

from astraflow.train.batch import Batch
from astraflow.train.checkpoint import WRAPPER_PREFIX
from astraflow.train.dist import Ranks
from astraflow.train.logprobs import TokenLogprobs, completion_logprobs
from astraflow.train.loss import LossStats, entropy_floor_on, policy_loss
from astraflow.train.step import (
    StepSettings,
    move_metrics,
    set_lr,
    signal_tokens,
    split,
    step_metrics,
)
from astraflow.train.trust import TrustRegion, batch_budget, kl_sums


def shard(wrapper: torch.nn.Module, policy: torch.nn.Module, ranks: Ranks,
          compute: torch.dtype | None) -> None:
    """FSDP2 over `ranks.mesh`: each decoder layer its own unit (all-gathered just in
    time, freed after), the embeddings, final norm and (tied) head in the root unit
    `wrapper`, whose forward runs the whole chunked-logprob pass so FSDP sees every
    parameter use inside a forward it hooks. Mixed precision: bf16 parameters for
    compute, float32 gradient reduction, float32 master copies in the optimizer."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = (MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
          if compute is not None else MixedPrecisionPolicy())
    layers = decoder_layers(policy)
    for layer in layers:
        fully_shard(layer, mesh=ranks.mesh, mp_policy=mp)
    fully_shard(wrapper, mesh=ranks.mesh, mp_policy=mp)


def decoder_layers(policy: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of an HF causal LM (`model.layers` for Llama-like models)."""
    backbone = policy.get_decoder() if hasattr(policy, "get_decoder") else None
    layers = getattr(backbone, "layers", None)
    if layers is None:
        raise TypeError(f"{type(policy).__name__}: no decoder layers to shard "
                        f"(expected get_decoder().layers)")
    return list(layers)


def full_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The sharded module's full weights on the CPU, keyed as the plain HF model's. A
    collective: every rank sends its shards to rank 0."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True,
                                                                 cpu_offload=True))
    return {k.removeprefix(WRAPPER_PREFIX): v for k, v in full.items()}


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


class ShardedStep:
    """The `Step` on one of several FSDP2 ranks (`model` is the sharded `LogprobModel`
    on every rank, each holding the same batch): `optimize`'s minibatches and updates,
    each rank running forward/backward on its contiguous share of every minibatch's rows.

    Every micro-batch loss is still divided by the minibatch's *global* token count;
    FSDP2 averages gradients over the ranks, so each rank scales its loss by the world
    size and the reduced gradient is the single-process one. A rank whose share of a
    minibatch is short runs a zero-weighted pass on a real row instead of an empty
    micro-batch, so every rank issues the same collectives. Metrics are summed over
    the ranks; the gradient norm is the global one (clip_grad_norm_ over DTensors).
    """

    def __init__(self, ranks: Ranks):
        self.ranks = ranks

    def __call__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, batch: Batch,
                 pad_id: int, s: StepSettings) -> tuple[dict[str, float], int]:
        if s.loss.kl_coef > 0 and s.ref_model is None:
            raise ValueError("ShardedStep: loss.kl_coef > 0 needs StepSettings.ref_model")
        return _sharded_step(model, opt, batch, pad_id, s, self.ranks)


def _sharded_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: Batch,
                  pad_id: int, s: StepSettings, ranks: Ranks) -> tuple[dict[str, float], int]:
    """ShardedStep's body (see there)."""
    model.train()
    batch = batch.to(ranks.device)
    rows = len(batch)
    ranges = split(rows, s.minibatches)
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
        ent[0] += float((out.entropy.detach() * micro.mask).sum())
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
    kl = s.loss.kl_coef > 0
    trust = TrustRegion(opt, s.max_update_kl) if s.max_update_kl else None
    moves: list[tuple[float, float, float]] = []  # (KL before bounding, scale, bound)
    for k, ((a, b), plan) in enumerate(zip(ranges, plans, strict=True)):
        whole = batch.select(a, b)  # loss weights (data stages) scale the token count too
        n_tokens = float(whole.mask.sum() if whole.weights is None
                         else (whole.mask * whole.weights).sum())
        if n_tokens == 0:
            continue  # the same on every rank: they all hold the whole batch
        n_pg = signal_tokens(whole, s.loss)
        bonus = entropy_floor_on(s.loss, whole.behavior_logprobs, whole.mask)
        opt.zero_grad(set_to_none=True)
        real = 0
        befores: list[torch.Tensor] = []  # this rank's pre-update logprobs (trust region)
        for x, y in plan:
            first_pass = k == 0 and proximal is None
            micro, out, dummy = logprobs(a, x, y, first_pass or bonus)
            new = out.logprobs
            if trust is not None and not dummy:
                befores.append(new.detach())
            if first_pass and not dummy:
                measure(micro, out)
            prox = new.detach() if proximal is None or dummy else proximal[k][real]
            ref = None
            if kl:  # the reference is whole on every rank: it runs this rank's rows only
                ref = new.detach() if dummy else _reference(s, micro, pad_id)
            loss, st = policy_loss(new, micro.behavior_logprobs, micro.advantages, micro.mask,
                                   s.loss, logp_proximal=prox, normalizer=n_tokens,
                                   token_weights=micro.weights, logp_ref=ref,
                                   pg_normalizer=n_pg, entropy_on=bonus,
                                   entropy=new * 0.0 if dummy else out.entropy)
            if dummy:
                (loss * 0.0).backward()
            else:
                (loss * ranks.world).backward()
                stats = stats.merge(st)
                real += 1
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        full = getattr(norm, "full_tensor", None)
        grad_norms.append(float(full() if full is not None else norm))
        set_lr(opt, s, len(grad_norms) - 1)
        if trust is not None:
            trust.snapshot()
        opt.step()
        if trust is not None:
            # every rank holds the whole batch, so every rank computes the same bound
            limit = batch_budget(trust.max_kl, whole.advantages, whole.offsets(),
                                 s.max_update_kl_rows, whole.solved_share)
            moves.append((*_bound_update(model, trust, plan, a, logprobs, ranks, befores, limit),
                          limit))
    names = list(LossStats.__dataclass_fields__)
    summed = ranks.all_sum([float(getattr(stats, n)) for n in names] + ent + mis)
    stats = LossStats(**{n: (int(v) if n == "tokens" else v)
                         for n, v in zip(names, summed[:len(names)], strict=True)})
    ent_sum, ent_n, mis_sum, mis_n = summed[len(names):]
    metrics = step_metrics(stats, s.loss, grad_norms, (ent_sum, ent_n), (mis_sum, mis_n))
    metrics.update(move_metrics(moves), lr=opt.param_groups[0]["lr"])  # the last update's
    return metrics, len(grad_norms)


def _reference(s: StepSettings, micro: Batch, pad_id: int) -> torch.Tensor:
    """The KL anchor's logprobs of a micro-batch's completions under `s.ref_model`."""
    assert s.ref_model is not None
    with torch.no_grad():
        return completion_logprobs(s.ref_model, micro.prompts, micro.completions, pad_id,
                                   temperature=s.temperature,
                                   chunk_tokens=s.chunk_tokens).logprobs


def _bound_update(model: torch.nn.Module, trust: TrustRegion, plan: list[tuple[int, int]],
                  a: int, logprobs, ranks: Ranks,
                  befores: list[torch.Tensor], limit: float) -> tuple[float, float]:
    """The trust region on FSDP2 ranks: each rank measures KL on its own rows (running
    its zero-weighted passes too, so every rank issues the same all-gathers), the sums
    are reduced, and every rank scales its shards by the same factor. The root unit
    keeps its all-gathered parameters after a forward: they are freed first, or the
    next forward would compute with the unbounded update."""
    from torch.distributed.fsdp import FSDPModule

    def measure() -> float:
        total, n = 0.0, 0.0
        with torch.no_grad():
            for (x, y), before in zip(plan, _with_dummies(plan, befores), strict=True):
                micro, out, dummy = logprobs(a, x, y, False)
                if not dummy:
                    t, m = kl_sums(before, out.logprobs, micro.mask)
                    total, n = total + t, n + m
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.reshard()
        total, n = ranks.all_sum([total, n])
        return total / max(n, 1.0)

    return trust.bound(measure, limit)


def _with_dummies(plan: list[tuple[int, int]], befores: list[torch.Tensor]
                  ) -> list[torch.Tensor | None]:
    """`befores` (one per real micro-batch) aligned with `plan` (None for a dummy)."""
    it = iter(befores)
    return [None if x == y else next(it) for x, y in plan]
