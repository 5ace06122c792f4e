"""reasoning-gym as an env: any of its procedural generators by name, with its config;
the generator's own scorer (`score_answer`) is the reward.

Why seeds and not a hash split: a reasoning-gym item is a pure function of `seed + index`
(`Random(seed + idx)` in nearly every generator), so training draws indices of the
dataset built with `seed` and the held-out tasks are the first items of the dataset built
with `eval_seed`, a seed outside the training range. Two seeds can still produce the same
question in a small task space, so training also skips any question of the held-out pool.
The library is the `reasoning-gym` extra, imported when the env is built; `reward:
math_verify` checks the answer against the oracle with math-verify instead (free-form math).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from astraflow import registry
from astraflow.envs.base import ANSWER_CLOSE, ANSWER_OPEN, DemoTurn, Limits, Task, Tool
from astraflow.envs.mathcheck import equivalent

FORMATS = ("tag", "text")
REWARDS = ("score", "math_verify")
_SUFFIX = {"tag": f"\nGive only your final answer, between {ANSWER_OPEN} and {ANSWER_CLOSE}.",
           "text": "\nReply with only the answer."}
_MAX_SKIPS = 1000


class ReasoningGymEnv:
    """One reasoning-gym generator (`dataset`, e.g. `leg_counting`) built with `config`
    (its config dataclass's fields, e.g. `max_animals: 3`). One turn, no tools, as the
    `single` workflow expects. `answer_format`: `tag` (the answer is what the completion's
    last `<answer>…</answer>` holds, reasoning-gym's own `extract_answer`) or `text` (the
    whole completion, stripped). A task counts as solved in evaluation at reward 1.0."""

    name = "reasoning_gym"
    tools: Mapping[str, Tool] = {}
    limits = Limits()

    def __init__(self, dataset: str, config: Mapping[str, Any] | None = None, *, seed: int = 0,
                 train_size: int = 100_000, eval_seed: int | None = None,
                 heldout_size: int = 500, answer_format: str = "tag", reward: str = "score",
                 prompt_suffix: str | None = None, max_new_tokens: int = 256):
        rg = registry.require("reasoning_gym", "reasoning-gym", "env 'reasoning_gym'")
        if answer_format not in FORMATS:
            raise ValueError(f"answer_format must be one of {FORMATS}, got {answer_format!r}")
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
        if reward == "math_verify":  # fail at build time, not at the first reward
            registry.require("math_verify", "math-verify", "reward 'math_verify'")
        config = dict(config or {})
        if {"seed", "size"} & set(config):
            raise ValueError("set the seeds and sizes with the env's own params (seed, "
                             "train_size, eval_seed, heldout_size), not in `config`")
        from reasoning_gym.factory import DATASETS
        if dataset not in DATASETS:
            raise ValueError(f"reasoning-gym has no dataset {dataset!r}; it has {sorted(DATASETS)}")
        eval_seed = seed + train_size if eval_seed is None else eval_seed
        pool = 4 * heldout_size  # indices the held-out pool may use (duplicates skipped)
        if eval_seed < seed + train_size and seed < eval_seed + pool:
            raise ValueError(f"eval_seed {eval_seed} overlaps the training items (seeds {seed} "
                             f"to {seed + train_size - 1}); leave it unset or move it out")
        self.dataset_name, self.seed, self.eval_seed = dataset, seed, eval_seed
        self.answer_format, self.reward_kind = answer_format, reward
        self.suffix = _SUFFIX[answer_format] if prompt_suffix is None else prompt_suffix
        self._max_new_tokens, self.heldout_size = max_new_tokens, heldout_size
        self.train = rg.create_dataset(dataset, **config, seed=seed, size=train_size)
        self.heldout = rg.create_dataset(dataset, **config, seed=eval_seed, size=pool)
        self._extract = rg.utils.extract_answer
        self._pool: list[Task] | None = None
        self._pool_questions: frozenset[str] = frozenset()

    def _task(self, split: str, idx: int) -> Task:
        ds = self.train if split == "train" else self.heldout
        entry = ds[idx]
        answer = entry.get("answer")
        return Task(task_id=f"{self.dataset_name}:{split}:{ds.seed + idx}",
                    prompt=entry["question"] + self.suffix,
                    answer="" if answer is None else str(answer),
                    data={"entry": entry, "split": split})

    def heldout_pool(self) -> list[Task]:
        """The held-out tasks: the first `heldout_size` distinct questions of the
        `eval_seed` dataset, computed once per process."""
        if self._pool is None:
            seen: set[str] = set()
            pool: list[Task] = []
            for idx in range(len(self.heldout)):
                t = self._task("heldout", idx)
                q = t.data["entry"]["question"]
                if q not in seen:
                    seen.add(q)
                    pool.append(t)
                if len(pool) == self.heldout_size:
                    break
            if len(pool) < self.heldout_size:
                raise ValueError(f"only {len(pool)} distinct held-out questions in "
                                 f"{len(self.heldout)} items of {self.dataset_name!r}; lower "
                                 "env.params.heldout_size (and env.eval_size)")
            self._pool, self._pool_questions = pool, frozenset(seen)
        return self._pool

    def sample(self, rng: random.Random) -> Task:
        """A training item whose question is not one of the held-out pool's."""
        self.heldout_pool()
        held = self._pool_questions
        for _ in range(_MAX_SKIPS):
            t = self._task("train", rng.randrange(len(self.train)))
            if t.data["entry"]["question"] not in held:
                return t
        raise ValueError(f"{_MAX_SKIPS} training draws of {self.dataset_name!r} in a row were "
                         "held-out questions: its task space is too small for this split")

    def eval_tasks(self, n: int) -> list[Task]:
        if n > self.heldout_size:
            raise ValueError(f"{n} held-out tasks asked, the pool has {self.heldout_size}; "
                             "raise env.params.heldout_size or lower env.eval_size")
        return self.heldout_pool()[:n]

    def is_heldout(self, task: Task) -> bool:
        return task.data["split"] == "heldout"

    def instructions(self) -> str:
        """None: each prompt carries the question and the answer format."""
        return ""

    def answer_of(self, completion: str) -> str | None:
        """The answer a completion gives (None: it gave none in the asked format)."""
        if self.answer_format == "tag":
            return self._extract(completion)
        return completion.strip() or None

    def reward(self, task: Task, completion: str | None) -> float:
        """reasoning-gym's `score_answer` on the extracted answer (its generators give
        partial credit for some near misses), or 1.0/0.0 from math-verify."""
        answer = None if completion is None else self.answer_of(completion)
        entry = task.data["entry"]
        if self.reward_kind == "math_verify":
            return 1.0 if answer is not None and equivalent(task.answer, answer) else 0.0
        ds = self.train if task.data["split"] == "train" else self.heldout
        return float(ds.score_answer(answer, entry))

    def demonstration(self, task: Task, rng: random.Random) -> list[DemoTurn]:
        """The oracle answer in the asked format (generators without one cannot warm start)."""
        if task.data["entry"].get("answer") is None:
            raise ValueError(f"reasoning-gym's {self.dataset_name!r} has no single oracle "
                             "answer to demonstrate; train it without a warm start")
        text = task.answer
        return [DemoTurn("model", f"{ANSWER_OPEN}{text}{ANSWER_CLOSE}"
                         if self.answer_format == "tag" else text)]

    def max_new_tokens(self) -> int:
        return self._max_new_tokens
