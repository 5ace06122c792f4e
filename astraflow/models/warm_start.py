"""Warm start: a short supervised pass so version 0 is sometimes right.

RL from a random model on exact-match arithmetic sees reward 0 everywhere and
never learns. A few hundred supervised steps on the workload's own synthetic
tasks bring greedy accuracy off the floor; we stop as soon as a validation
check reaches the target (the 20–50% window lasts only ~40 steps, so checks are
frequent), leaving the rest of the climb to RL.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from astraflow.evaluate import score_items
from astraflow.flow import WarmStartSpec
from astraflow.models.tokenizer import CharCodec
from astraflow.rollout.engine import HFEngine
from astraflow.workflows import Workflow

log = logging.getLogger("astraflow.warm_start")


@dataclass
class WarmStartResult:
    steps: int
    accuracy: float
    seconds: float


def warm_start(model: torch.nn.Module, codec: CharCodec, workflow: Workflow, role: str,
               spec: WarmStartSpec, seed: int = 0,
               progress: Callable[[int, float], None] | None = None) -> WarmStartResult:
    """Supervised steps on the workflow's (prompt, target) pairs for `role` until the
    validation check reaches `spec.target_accuracy` (or `spec.max_steps`)."""
    t0 = time.time()
    rng = random.Random(seed)
    val_rng = random.Random(seed + 1_000_003)
    # Validation draws come from the training distribution, never the held-out set.
    val = [workflow.sft_example(role, val_rng) for _ in range(spec.check_size)]
    engine = HFEngine(model, codec)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr)
    max_new = workflow.max_new_tokens(role)

    def check() -> float:
        return score_items(engine, [(p, lambda text, y=y: text == y) for p, y in val], max_new)

    acc = check()
    step = 0
    while step < spec.max_steps and acc < spec.target_accuracy:
        model.train()
        pairs = [workflow.sft_example(role, rng) for _ in range(spec.batch_size)]
        prompts = [codec.encode(p) for p, _ in pairs]
        seqs = [pr + codec.encode(y)[1:] + [codec.eos_id] for pr, (_, y) in zip(prompts, pairs,
                                                                                strict=True)]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), codec.pad_id, dtype=torch.long)
        labels = torch.full((len(seqs), width), -100, dtype=torch.long)
        attn = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            attn[i, : len(s)] = 1
            plen = len(prompts[i])
            labels[i, plen : len(s)] = torch.tensor(s[plen:])  # target + EOS only
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % spec.check_every == 0:
            model.eval()
            acc = check()
            if progress:
                progress(step, acc)
    model.eval()
    return WarmStartResult(steps=step, accuracy=acc, seconds=time.time() - t0)
