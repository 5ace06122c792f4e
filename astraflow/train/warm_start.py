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
from typing import TYPE_CHECKING

import torch

from astraflow.models.codec import Codec
from astraflow.rollout.engine import HFEngine
from astraflow.workflows import Workflow

if TYPE_CHECKING:
    from astraflow.config.model import WarmStartSpec

log = logging.getLogger("astraflow.warm_start")


@dataclass
class WarmStartResult:
    steps: int
    accuracy: float
    seconds: float


def warm_start(model: torch.nn.Module, codec: Codec, workflow: Workflow, role: str,
               spec: WarmStartSpec, seed: int = 0,
               progress: Callable[[int, float], None] | None = None) -> WarmStartResult:
    """Supervised steps on the workflow's demonstrations for `role` until its validation
    check (greedy play scored like the held-out metric) reaches `spec.target_accuracy`."""
    t0 = time.time()
    rng = random.Random(seed)
    # Validation draws come from the training distribution, never the held-out set.
    val = workflow.validation_items(role, random.Random(seed + 1_000_003), spec.check_size)
    engine = HFEngine(model, codec)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr)
    acc = workflow.score(role, engine, val)
    step = 0
    while step < spec.max_steps and acc < spec.target_accuracy:
        model.train()
        demos = [workflow.demo(role, rng) for _ in range(spec.batch_size)]
        width = max(len(d.prompt_ids) + len(d.target_ids) for d in demos)
        ids = torch.full((len(demos), width), codec.pad_id, dtype=torch.long)
        labels = torch.full((len(demos), width), -100, dtype=torch.long)
        attn = torch.zeros((len(demos), width), dtype=torch.long)
        for i, d in enumerate(demos):
            seq = d.prompt_ids + d.target_ids
            ids[i, : len(seq)] = torch.tensor(seq)
            attn[i, : len(seq)] = 1
            own = torch.tensor(d.target_ids)
            own[torch.tensor(d.target_mask) == 0] = -100  # context the role only reads
            labels[i, len(d.prompt_ids) : len(seq)] = own
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % spec.check_every == 0:
            model.eval()
            acc = workflow.score(role, engine, val)
            if progress:
                progress(step, acc)
    model.eval()
    return WarmStartResult(steps=step, accuracy=acc, seconds=time.time() - t0)
