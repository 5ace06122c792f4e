"""The backbone's hidden states at completion positions, each distinct prompt run once.

Why: a GRPO batch holds `samples_per_prompt` completions of every prompt, and the
prompt is most of each row (SmolLM2's math question with its chat template is ~46
tokens, the completion ≤ 12). Here each distinct prompt runs once, its KV cache is
indexed out to its rows, and only the completions run on top: the same graph, shared,
so the gradients are the per-row pass's. On SmolLM2, 8 prompts × 4 samples, forward
and backward took 4.7 s instead of 12 s on 2 CPU threads. Not under gradient
checkpointing (no KV cache while a checkpointed model trains; astraflow.train.logprobs
runs the plain pass there). The distinct prompts' common opening (the template's system
prompt, 27 of those 46 tokens) runs once for all of them, as in the rollout engine.
Prompts are left-padded with explicit position ids, as the rollout engine lays them out
(astraflow.models.hf.left_padded).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from astraflow.models.hf import MIN_SHARED_PREFIX, cache_kwarg, left_padded, run_opening


def shared_prompts(prompts: Sequence[Sequence[int]]) -> tuple[list[Sequence[int]], list[int]]:
    """The distinct prompts in first-seen order, and each row's index into them."""
    first: dict[tuple[int, ...], int] = {}
    index = [first.setdefault(tuple(p), len(first)) for p in prompts]
    distinct: list[Sequence[int]] = [()] * len(first)
    for p, i in zip(prompts, index, strict=True):
        distinct[i] = p
    return distinct, index


def prefix_hidden(backbone: torch.nn.Module, prompts: Sequence[Sequence[int]],
                  completions: Sequence[Sequence[int]], pad_id: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden states, target ids) at every completion token, flattened row by row:
    the hidden state that predicts each completion token (the last prompt position
    for the first, the previous completion token for the rest) and that token."""
    device = next(backbone.parameters()).device
    distinct, index = shared_prompts(prompts)
    n = len(prompts)
    kw = cache_kwarg(backbone)
    # The distinct prompts' common opening (a chat template's system prompt) runs once too;
    # its KV cache, repeated for each prompt, carries the gradient back to it.
    shared, distinct, opening = run_opening(backbone, distinct, MIN_SHARED_PREFIX, kw, device)
    ids, attn, pos = (t.to(device) for t in left_padded(distinct, pad_id, shared))
    out = backbone(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True,
                   **opening)
    rows = torch.tensor(index, dtype=torch.long, device=device)
    last = out.last_hidden_state[:, -1, :][rows]          # predicts each row's first token
    # The completions' inputs: every token but the last (nothing follows it to predict).
    c_width = max((len(c) for c in completions), default=0)
    targets = torch.full((n, max(c_width, 1)), pad_id, dtype=torch.long)
    tmask = torch.zeros((n, max(c_width, 1)), dtype=torch.bool)
    for i, c in enumerate(completions):
        if c:
            targets[i, :len(c)] = torch.tensor(list(c), dtype=torch.long)
            tmask[i, :len(c)] = True
    targets, tmask = targets.to(device), tmask.to(device)
    if c_width <= 1:
        return last[tmask[:, 0]], targets[:, 0][tmask[:, 0]]
    cache = getattr(out, kw)
    if cache is None:
        raise RuntimeError(f"{type(backbone).__name__} returned no KV cache (gradient "
                           f"checkpointing in training turns it off): the shared-prompt pass "
                           f"needs one")
    cache.batch_select_indices(rows)                       # each row's copy of its prompt's KV
    c_in = targets[:, :-1]
    c_attn = tmask[:, :-1].long()                          # input j is completion token j
    hidden = backbone(input_ids=c_in, attention_mask=torch.cat([attn[rows], c_attn], dim=1),
                      position_ids=pos[rows][:, -1:] + 1 + torch.arange(c_width - 1, device=device),
                      use_cache=True, **{kw: cache}).last_hidden_state
    h = torch.cat([last[:, None, :], hidden], dim=1)       # (rows, c_width, hidden)
    return h[tmask], targets[tmask]
