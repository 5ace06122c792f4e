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

from astraflow.envs.math import MathEnv
from astraflow.evaluate import accuracy
from astraflow.flow import WarmStartSpec
from astraflow.models.tokenizer import CharCodec
from astraflow.rollout.engine import HFEngine

log = logging.getLogger("astraflow.warm_start")


@dataclass
class WarmStartResult:
    steps: int
    accuracy: float
    seconds: float


def warm_start(model: torch.nn.Module, codec: CharCodec, env: MathEnv, spec: WarmStartSpec,
               seed: int = 0, progress: Callable[[int, float], None] | None = None) -> WarmStartResult:
    t0 = time.time()
    rng = random.Random(seed)
    val_rng = random.Random(seed + 1_000_003)
    val = [env.sample(val_rng) for _ in range(spec.check_size)]  # training distribution
    engine = HFEngine(model, codec)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr)
    acc = accuracy(engine, env, val)
    step = 0
    while step < spec.max_steps and acc < spec.target_accuracy:
        model.train()
        tasks = [env.sample(rng) for _ in range(spec.batch_size)]
        seqs = [codec.encode(t.prompt) + codec.encode(t.answer)[1:] + [codec.eos_id] for t in tasks]
        plen = [len(codec.encode(t.prompt)) for t in tasks]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), codec.pad_id, dtype=torch.long)
        labels = torch.full((len(seqs), width), -100, dtype=torch.long)
        attn = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            attn[i, : len(s)] = 1
            labels[i, plen[i] : len(s)] = torch.tensor(s[plen[i] :])  # answer + EOS only
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % spec.check_every == 0:
            model.eval()
            acc = accuracy(engine, env, val)
            if progress:
                progress(step, acc)
    model.eval()
    return WarmStartResult(steps=step, accuracy=acc, seconds=time.time() - t0)
