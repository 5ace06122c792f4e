"""Held-out evaluation: greedy exact match on tasks no trainer ever draws."""

from __future__ import annotations

from astraflow.envs.math import MathEnv, Task
from astraflow.rollout.engine import HFEngine


def accuracy(engine: HFEngine, env: MathEnv, tasks: list[Task], batch: int = 500) -> float:
    correct = 0
    for i in range(0, len(tasks), batch):
        chunk = tasks[i : i + batch]
        gen = engine.generate([engine.codec.encode(t.prompt) for t in chunk],
                              max_new_tokens=env.max_new_tokens(), greedy=True)
        correct += sum(env.reward(t, engine.codec.decode(c)) for t, c in zip(chunk, gen.completions,
                                                                              strict=True))
    return correct / max(len(tasks), 1)
