"""Held-out evaluation: greedy completions scored against checks no trainer ever sees."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from astraflow.envs.math import MathEnv, Task
from astraflow.rollout.engine import HFEngine
from astraflow.workflows import Workflow


def score_items(engine: HFEngine, items: Sequence[tuple[str, Callable[[str], bool]]],
                max_new_tokens: int, batch: int = 500) -> float:
    """Fraction of (prompt, check) pairs whose greedy completion passes its check."""
    correct = 0
    for i in range(0, len(items), batch):
        chunk = items[i : i + batch]
        gen = engine.generate([engine.codec.encode(p) for p, _ in chunk],
                              max_new_tokens=max_new_tokens, greedy=True)
        correct += sum(bool(check(engine.codec.decode(c)))
                       for (_, check), c in zip(chunk, gen.completions, strict=True))
    return correct / max(len(items), 1)


def role_accuracy(engine: HFEngine, workflow: Workflow, role: str, n: int) -> float:
    """The role's held-out metric (solver accuracy, verifier judgement accuracy, …)."""
    items = [(it.prompt, it.check) for it in workflow.eval_items(role, n)]
    return score_items(engine, items, workflow.max_new_tokens(role))


def accuracy(engine: HFEngine, env: MathEnv, tasks: list[Task], batch: int = 500) -> float:
    """Greedy exact-match accuracy of answering `tasks`."""
    return score_items(engine, [(t.prompt, lambda text, t=t: env.reward(t, text) == 1.0)
                                for t in tasks], env.max_new_tokens(), batch)
