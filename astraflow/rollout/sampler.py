"""Which tasks a rollout batch runs: the workload's own draw, optionally skipping tasks
this worker has just seen solved.

A GRPO group whose every sample succeeds has zero advantage and is dropped by the
`zero_variance_filter` stage after the worker paid for its whole episode; on a
warm-started policy most groups are like that. Rather than over-sample and filter
(DAPO), a worker on a revisited task pool remembers what it saw solved, keyed by
`task_id`, and skips it for `skip_versions` versions of the primary policy. The
memory is the worker's own (a restarted worker starts empty). A slot gets at most
`max_draws` draws, then takes the last, so an all-solved pool still yields batches.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Protocol

from astraflow.envs.base import Task


class _Sampling(Protocol):
    def sample(self, rng: random.Random) -> Task: ...


class _Scored(Protocol):
    task_id: str
    group: str
    reward: float


class TaskSampler:
    """Draws `n` tasks per batch from `env`; remembers groups solved by every sample."""

    def __init__(self, env: _Sampling, rng: random.Random, *, skip_versions: int = 0,
                 success: float = 1.0, max_draws: int = 20, max_remembered: int = 100_000):
        if skip_versions < 0:
            raise ValueError(f"skip_versions must be >= 0, got {skip_versions}")
        self.env, self.rng = env, rng
        self.skip_versions, self.success = skip_versions, success
        self.max_draws, self.max_remembered = max(1, max_draws), max_remembered
        self.solved_at: dict[str, int] = {}
        """task_id → the policy version at which a group of it was last solved here."""
        self.skipped = 0
        """Draws skipped in the last `draw` (reported per batch)."""

    def _fresh_solved(self, task_id: str, version: int) -> bool:
        at = self.solved_at.get(task_id)
        return at is not None and version - at < self.skip_versions

    def draw(self, n: int, version: int | None) -> list[Task]:
        """`n` tasks; with skipping on, each slot redraws (up to `max_draws` times) a
        task solved here within the last `skip_versions` versions."""
        self.skipped = 0
        if not self.skip_versions or version is None:
            return [self.env.sample(self.rng) for _ in range(n)]
        tasks = []
        for _ in range(n):
            for attempt in range(self.max_draws):
                task = self.env.sample(self.rng)
                if not self._fresh_solved(task.task_id, version) or attempt == self.max_draws - 1:
                    break
                self.skipped += 1
            tasks.append(task)
        return tasks

    def record(self, parts: Iterable[_Scored], version: int | None) -> int:
        """Remember the tasks whose groups all scored at least `success`, as solved at
        `version` (the version the batch ran with); a task with any failing group is
        forgotten. Returns the number of solved tasks recorded."""
        if not self.skip_versions or version is None:
            return 0
        groups: dict[str, tuple[str, bool]] = {}
        for p in parts:
            _, ok = groups.get(p.group, (p.task_id, True))
            groups[p.group] = (p.task_id, ok and p.reward >= self.success)
        solved: dict[str, bool] = {}
        for task_id, ok in groups.values():
            solved[task_id] = solved.get(task_id, True) and ok
        for task_id, ok in solved.items():
            if ok:
                self.solved_at[task_id] = version
            else:
                self.solved_at.pop(task_id, None)
        if len(self.solved_at) > self.max_remembered:
            self.solved_at = {t: v for t, v in self.solved_at.items()
                              if version - v < self.skip_versions}
        return sum(solved.values())
