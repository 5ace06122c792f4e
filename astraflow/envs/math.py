"""Synthetic arithmetic: fixed-width prompts, parsed exact-match reward.

Tasks are `a+b=` with zero-padded operands (`042+917=`), so every prompt has
the same length and a batch needs no padding. A fixed slice of the task space
is held out for evaluation by a hash of the task, so training never draws an
evaluation task and no list needs to be shared between processes.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

_ANSWER = re.compile(r"^\s*(-?\d+)\s*$")


@dataclass(frozen=True)
class Task:
    task_id: str
    prompt: str
    answer: str


def _heldout(a: int, b: int, fraction: float) -> bool:
    h = hashlib.blake2b(f"{a},{b}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64 < fraction


class MathEnv:
    """a op b with `digits`-digit operands; reward 1.0 for the exact answer."""

    name = "math"

    def __init__(self, digits: int = 3, op: str = "+", heldout_fraction: float = 0.05):
        if op not in "+-*":
            raise ValueError(f"op must be one of + - *, got {op!r}")
        self.digits, self.op, self.heldout_fraction = digits, op, heldout_fraction
        self.hi = 10**digits

    def _task(self, a: int, b: int) -> Task:
        w = self.digits
        value = {"+": a + b, "-": a - b, "*": a * b}[self.op]
        return Task(task_id=f"{a:0{w}d}{self.op}{b:0{w}d}", prompt=f"{a:0{w}d}{self.op}{b:0{w}d}=",
                    answer=str(value))

    def sample(self, rng: random.Random) -> Task:
        """A training task (never one of the held-out ones)."""
        while True:
            a, b = rng.randrange(self.hi), rng.randrange(self.hi)
            if not _heldout(a, b, self.heldout_fraction):
                return self._task(a, b)

    def eval_tasks(self, n: int = 500, seed: int = 1234) -> list[Task]:
        """`n` distinct held-out tasks, the same for every process and run."""
        rng = random.Random(seed)
        seen: set[tuple[int, int]] = set()
        out: list[Task] = []
        attempts = 0
        while len(out) < n:
            attempts += 1
            if attempts > 400 * n + 10_000:
                raise ValueError(
                    f"only {len(out)} held-out tasks exist for {self.digits}-digit operands; "
                    f"lower env.eval_size or raise env.digits"
                )
            a, b = rng.randrange(self.hi), rng.randrange(self.hi)
            if (a, b) not in seen and _heldout(a, b, self.heldout_fraction):
                seen.add((a, b))
                out.append(self._task(a, b))
        return out

    def is_heldout(self, task: Task) -> bool:
        a, b = int(task.task_id[: self.digits]), int(task.task_id[self.digits + 1 :])
        return _heldout(a, b, self.heldout_fraction)

    @staticmethod
    def reward(task: Task, completion: str) -> float:
        """1.0 iff the completion parses as an integer equal to the answer."""
        m = _ANSWER.match(completion)
        return 1.0 if m is not None and int(m.group(1)) == int(task.answer) else 0.0

    def max_new_tokens(self) -> int:
        # Longest answer plus EOS (and one spare for a sign).
        return len(str((self.hi - 1) * (self.hi - 1) if self.op == "*" else 2 * (self.hi - 1))) + 2
