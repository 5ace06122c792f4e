"""Synthetic arithmetic in three styles, one held-out split.

  * `compact` (the tiny character model): `a+b=` with zero-padded operands
    (`042+917=`), so a batch needs no padding; reward 1 for the exact answer.
  * `question` (chat models): "What is 59 + 7? Reply with only the number."
  * `word` (chat models): a short word problem, its template picked by a hash of
    the task. The reward parses the answer from free text: the last `\\boxed{…}`,
    else the last integer.

A fixed slice of the task space is held out for evaluation by a hash of the task, so
training never draws an evaluation task and no list is shared between processes.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass

from astraflow.envs.base import DemoTurn, Limits, Tool

_ANSWER = re.compile(r"^\s*(-?\d+)\s*$")
_BOXED = re.compile(r"\\boxed\{\s*(-?[\d,]+)\s*\}")
_INTEGER = re.compile(r"-?\d[\d,]*")
STYLES = ("compact", "question", "word")
_SYMBOL = {"+": "+", "-": "-", "*": "×"}
#: Word-problem templates per operation: {a}, {b}; the answer is a op b.
_WORD = {
    "+": ["Sam has {a} marbles and finds {b} more. How many marbles does Sam have now?",
          "A shelf holds {a} books. Someone adds {b} books. How many books are on the shelf?",
          "A bus carries {a} people. At the next stop {b} more get on. How many people are on the bus?",
          "Mia walked {a} steps, then {b} steps more. How many steps did she walk in all?"],
    "-": ["Sam has {a} marbles and loses {b}. How many marbles does Sam have left?",
          "A shelf holds {a} books. Someone takes {b} away. How many books are left?",
          "A bus carries {a} people. At the next stop {b} get off. How many people are still on the bus?",
          "A jar holds {a} cookies and {b} are eaten. How many cookies are left?"],
    "*": ["There are {a} boxes with {b} pens in each. How many pens are there?",
          "A farmer plants {a} rows of {b} trees. How many trees did he plant?",
          "Each of {a} children has {b} stickers. How many stickers do they have together?",
          "A book has {a} pages with {b} pictures on each. How many pictures are in the book?"],
}
SUFFIX = " Reply with only the number."


def parse_answer(text: str) -> int | None:
    """The answer in free text: the last `\\boxed{N}`, else the last integer
    (thousands separators allowed); None when there is no number at all."""
    boxed = _BOXED.findall(text)
    found = boxed[-1] if boxed else (_INTEGER.findall(text) or [None])[-1]
    if found is None:
        return None
    try:
        return int(found.replace(",", ""))
    except ValueError:
        return None


@dataclass(frozen=True)
class Task:
    task_id: str
    prompt: str
    answer: str


def _heldout(a: int, b: int, fraction: float) -> bool:
    h = hashlib.blake2b(f"{a},{b}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64 < fraction


class MathEnv:
    """a op b; `compact` operands have up to `digits` digits (zero-padded), `question`
    and `word` operands exactly `digits` (a) and `digits_b` (b) digits.

    An `Env` (astraflow.envs.base) with no tools and one turn: the model answers at
    once, in plain text (no `<answer>` tags), as the `single` workflow expects."""

    name = "math"
    tools: Mapping[str, Tool] = {}
    limits = Limits()

    def __init__(self, digits: int = 3, op: str = "+", heldout_fraction: float = 0.05, *,
                 style: str = "compact", digits_b: int | None = None):
        if op not in "+-*":
            raise ValueError(f"op must be one of + - *, got {op!r}")
        if style not in STYLES:
            raise ValueError(f"style must be one of {STYLES}, got {style!r}")
        if not 0 < heldout_fraction < 1:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        if style == "compact" and digits_b not in (None, digits):
            raise ValueError("style 'compact' uses `digits` for both operands (fixed width)")
        self.digits, self.op, self.heldout_fraction = digits, op, heldout_fraction
        self.style, self.digits_b = style, digits_b or digits
        self.hi = 10**digits
        if style == "compact":
            self.range_a = self.range_b = (0, self.hi)
        else:  # exactly that many digits: "59 + 7", never "05 + 7"
            self.range_a = (10 ** (digits - 1) if digits > 1 else 0, 10**digits)
            self.range_b = (10 ** (self.digits_b - 1) if self.digits_b > 1 else 0,
                            10**self.digits_b)

    def _task(self, a: int, b: int) -> Task:
        value = {"+": a + b, "-": a - b, "*": a * b}[self.op]
        if self.style == "compact":
            w = self.digits
            return Task(task_id=f"{a:0{w}d}{self.op}{b:0{w}d}",
                        prompt=f"{a:0{w}d}{self.op}{b:0{w}d}=", answer=str(value))
        if self.style == "question":
            prompt = f"What is {a} {_SYMBOL[self.op]} {b}?{SUFFIX}"
        else:
            templates = _WORD[self.op]
            h = hashlib.blake2b(f"t{a},{b}".encode(), digest_size=4).digest()
            prompt = templates[int.from_bytes(h, "big") % len(templates)].format(a=a, b=b) + SUFFIX
        return Task(task_id=f"{a}{self.op}{b}", prompt=prompt, answer=str(value))

    def _draw(self, rng: random.Random) -> tuple[int, int]:
        return rng.randrange(*self.range_a), rng.randrange(*self.range_b)

    def sample(self, rng: random.Random) -> Task:
        """A training task (never one of the held-out ones)."""
        while True:
            a, b = self._draw(rng)
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
                    f"only {len(out)} held-out tasks exist for these operands (digits "
                    f"{self.digits}/{self.digits_b}, heldout_fraction {self.heldout_fraction}); "
                    f"lower env.eval_size or raise env.digits or env.heldout_fraction"
                )
            a, b = self._draw(rng)
            if (a, b) not in seen and _heldout(a, b, self.heldout_fraction):
                seen.add((a, b))
                out.append(self._task(a, b))
        return out

    def is_heldout(self, task: Task) -> bool:
        a, b = (int(x) for x in task.task_id.split(self.op, 1))
        return _heldout(a, b, self.heldout_fraction)

    def instructions(self) -> str:
        """None: the task's prompt says it all."""
        return ""

    def demonstration(self, task: Task, rng: random.Random) -> list[DemoTurn]:
        """The answer, as one model turn."""
        return [DemoTurn("model", task.answer)]

    def reward(self, task: Task, completion: str | None) -> float:
        """`compact`: 1.0 iff the completion is exactly an integer equal to the answer.
        `question` / `word`: 1.0 iff the answer parsed from free text (`parse_answer`) is.
        None (an episode that ended without an answer) scores 0."""
        if completion is None:
            return 0.0
        if self.style == "compact":
            m = _ANSWER.match(completion)
            return 1.0 if m is not None and int(m.group(1)) == int(task.answer) else 0.0
        return 1.0 if parse_answer(completion) == int(task.answer) else 0.0

    def max_new_tokens(self) -> int:
        """`compact`: the longest answer plus EOS (and one spare for a sign). Chat styles:
        room for a short sentence around the number; flows usually set
        `rollout.max_new_tokens` for their model."""
        if self.style != "compact":
            return 32
        return len(str((self.hi - 1) * (self.hi - 1) if self.op == "*" else 2 * (self.hi - 1))) + 2
