"""PPO-clip policy loss over per-token logprobs, and the forward pass that feeds it.

Token-level: every completion token the policy wrote (loss mask 1) carries its
sequence's advantage; the importance ratio is new-policy probability over the
behaviour probability recorded by the rollout worker, clipped to 1±eps. The
loss is the mean over all unmasked tokens of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LossStats:
    loss: float
    clip_frac: float
    ratio_mean: float
    approx_kl: float
    tokens: int


def ppo_clip_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
) -> tuple[torch.Tensor, LossStats]:
    """All inputs are flat per-token tensors of equal length."""
    if not (logp_new.shape == logp_old.shape == advantages.shape == mask.shape):
        raise ValueError("ppo_clip_loss: inputs must have one entry per token")
    mask = mask.to(logp_new.dtype)
    n = mask.sum().clamp(min=1.0)
    log_ratio = logp_new - logp_old
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    loss = (per_token * mask).sum() / n
    with torch.no_grad():
        was_clipped = (unclipped != clipped).to(mask.dtype)
        stats = LossStats(
            loss=float(loss),
            clip_frac=float((was_clipped * mask).sum() / n),
            ratio_mean=float((ratio * mask).sum() / n),
            approx_kl=float(((ratio - 1 - log_ratio) * mask).sum() / n),
            tokens=int(mask.sum()),
        )
    return loss, stats


def completion_logprobs(
    model: torch.nn.Module, prompts: list[list[int]], completions: list[list[int]], pad_id: int
) -> torch.Tensor:
    """Logprob of every completion token under `model`, flattened row by row.

    Sequences are right-padded, so positions start at 0 for every row exactly as
    in the rollout engine's left-padded decode with explicit position ids.
    """
    lengths = [len(p) + len(c) for p, c in zip(prompts, completions, strict=True)]
    width = max(lengths)
    n = len(prompts)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    target_mask = torch.zeros((n, width - 1), dtype=torch.bool)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[i, : len(p) + len(c)] = torch.tensor(p + c, dtype=torch.long)
        attn[i, : len(p) + len(c)] = 1
        # logits at position j predict token j+1; completion tokens are p..p+c-1
        target_mask[i, len(p) - 1 : len(p) + len(c) - 1] = True
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1, :]
    logp = torch.log_softmax(logits.float(), dim=-1)
    taken = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    return taken[target_mask]
