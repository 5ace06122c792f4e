"""The forward pass that feeds the loss: each completion token's logprob under a model.

`completion_logprobs` runs the backbone once (each distinct prompt once, when rows
share one: astraflow.train.prefix), then the output head and log-softmax only at
completion positions, a chunk of tokens at a time under activation
checkpointing, so neither forward nor backward holds a (batch × sequence ×
vocabulary) tensor. `completion_logprobs_reference` is the plain full-vocabulary
computation the tests and `benchmarks/memory.py` compare against. `LogprobModel`
wraps a model so that one forward covers the whole pass (what FSDP2 needs).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from astraflow.train.prefix import prefix_hidden

log = logging.getLogger(__name__)


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
    """Per completion token, flattened row by row: the logprob and, if asked, the
    entropy of the temperature-T distribution it was sampled from (both with grad when
    the caller's context has grad: `algorithm.entropy_floor` trains on the entropy;
    detach it to only measure it)."""

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
            ids = torch.tensor([[0, 1, 2, 1]], dtype=torch.long, device=device_of(model))
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


#: Models whose shared-prompt pass `_prefix_matches` has checked: True where it matches.
_PREFIX: weakref.WeakKeyDictionary[torch.nn.Module, bool] = weakref.WeakKeyDictionary()


def _prefix_matches(model: torch.nn.Module, parts: _Parts) -> bool:
    """Once per model object: the shared-prompt pass (astraflow.train.prefix) must give
    the plain pass's logprobs. An architecture whose forward does not take position ids
    and a KV cache the way Llama-style models do keeps the plain pass, with a warning
    (it is slower, never different)."""
    known = _PREFIX.get(model)
    if known is not None:
        return known
    prompts, comps = [[5, 1, 2], [5, 1, 2], [3, 1]], [[1, 2, 4], [2], [0, 1, 2, 6]]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            ids, attn, tmask = _right_padded(prompts, comps, 0)
            dev = device_of(model)
            want, _ = _token_logprobs(parts, ids.to(dev), attn.to(dev), tmask.to(dev), 1.0,
                                      1024, False)
            h, targets = prefix_hidden(parts.backbone, prompts, comps, 0)
            got, _ = _head_logprobs(parts, h, targets, 1.0, 1024, False)
        ok = got.shape == want.shape and torch.allclose(got, want, atol=1e-3, rtol=1e-3)
        why = "its logprobs differ from the plain pass"
    except (TypeError, ValueError, RuntimeError, AttributeError) as e:
        ok, why = False, f"{type(e).__name__}: {e}"
    finally:
        model.train(was_training)
    if not ok:
        log.warning("%s: rows that share a prompt run it once each (the shared-prompt pass "
                    "does not fit this architecture: %s)", type(model).__name__, why)
    _PREFIX[model] = ok
    return ok


def _chunk_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor,
                    temperature: float, entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprobs of `targets` and, if asked, the entropy of each position's distribution
    (empty otherwise), from one head matmul; both with grad when grad is on."""
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    taken = logp.gather(-1, targets[:, None]).squeeze(-1)
    if not entropy:
        return taken, taken.new_zeros((0,))
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
    in the rollout engine's left-padded decode with explicit position ids. Rows
    that share a prompt (a GRPO group) run it once (astraflow.train.prefix, laid
    out as the engine lays it out), the completions on its KV cache. The
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
    repeats = len({tuple(p) for p in prompts}) < len(prompts)
    if isinstance(model, LogprobModel):  # one forward FSDP can hook (see LogprobModel)
        device = model.device
        shared = (prompts, completions, pad_id) if repeats and model.shared_ok() else None
        out, ent = model(ids.to(device), attn.to(device), target_mask.to(device),
                         temperature, chunk_tokens, entropy, shared)
        return TokenLogprobs(out, ent if entropy else None)
    parts = _parts(model)
    _check_head_matches(model, parts)
    if repeats and not _checkpointed(model) and _prefix_matches(model, parts):
        h, targets = prefix_hidden(parts.backbone, prompts, completions, pad_id)
        out, ent = _head_logprobs(parts, h, targets, temperature, chunk_tokens, entropy)
        return TokenLogprobs(out, ent if entropy else None)
    device = device_of(model)
    if device.type != "cpu":
        ids, attn, target_mask = ids.to(device), attn.to(device), target_mask.to(device)
    out, ent = _token_logprobs(parts, ids, attn, target_mask, temperature, chunk_tokens, entropy)
    return TokenLogprobs(out, ent if entropy else None)


def _checkpointed(model: torch.nn.Module) -> bool:
    """Training under gradient checkpointing: the model keeps no KV cache then (its
    layers run again in backward), so the shared-prompt pass cannot run."""
    return torch.is_grad_enabled() and bool(getattr(model, "is_gradient_checkpointing", False))


def device_of(model: torch.nn.Module) -> torch.device:
    """Where the model's parameters live (the CPU for a model without any)."""
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _token_logprobs(parts: _Parts, ids: torch.Tensor, attn: torch.Tensor,
                    target_mask: torch.Tensor, temperature: float, chunk_tokens: int,
                    entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The backbone once, then head + log-softmax chunk by chunk (see completion_logprobs)."""
    hidden = parts.backbone(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
    h = hidden[:, :-1, :][target_mask]           # (tokens, hidden)
    targets = ids[:, 1:][target_mask]            # (tokens,)
    return _head_logprobs(parts, h, targets, temperature, chunk_tokens, entropy)


def _head_logprobs(parts: _Parts, h: torch.Tensor, targets: torch.Tensor, temperature: float,
                   chunk_tokens: int, entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Head + log-softmax over (tokens, hidden) states, `chunk_tokens` at a time."""
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
    and then this wrapper (astraflow.train.fsdp.shard). `policy` is the HF model
    itself (its state-dict keys gain a `policy.` prefix here)."""

    def __init__(self, policy: torch.nn.Module, device: torch.device):
        super().__init__()
        parts = _parts(policy)
        _check_head_matches(policy, parts)  # before sharding: these call the model
        self._prefix = _prefix_matches(policy, parts)
        self.policy = policy
        self.device = device

    def shared_ok(self) -> bool:
        """May rows that share a prompt run it once (astraflow.train.prefix)?"""
        return self._prefix and not _checkpointed(self.policy)

    def forward(self, ids: torch.Tensor, attn: torch.Tensor, target_mask: torch.Tensor,
                temperature: float, chunk_tokens: int, entropy: bool,
                shared: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`shared`: (prompts, completions, pad id) for the shared-prompt pass; the
        padded `ids` pass otherwise."""
        parts = _parts(self.policy)
        if shared is not None:
            h, targets = prefix_hidden(parts.backbone, *shared)
            return _head_logprobs(parts, h, targets, temperature, chunk_tokens, entropy)
        return _token_logprobs(parts, ids, attn, target_mask, temperature, chunk_tokens,
                               entropy)

