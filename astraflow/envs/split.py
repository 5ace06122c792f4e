"""A finite task space split into training and held-out tasks by a hash of each task's
key, as math's held-out split is: no list is shared between processes, every process
computes the same split, and training never draws a held-out task.

Keys come in groups (a code task family, a database): training draws a group first,
then a key in it, and the evaluation set takes groups in turn, so a group with many
parameter values (650 letter replacements) does not drown one with four."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence

from astraflow.envs.base import Task


def is_heldout(key: str, fraction: float, salt: str = "") -> bool:
    h = hashlib.blake2b(f"{salt}|{key}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64 < fraction


class Split:
    def __init__(self, groups: Mapping[str, Sequence[str]], fraction: float, salt: str = ""):
        if not 0 < fraction < 1:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {fraction}")
        keys = [k for ks in groups.values() for k in ks]
        if len(set(keys)) != len(keys):
            raise ValueError("task keys must be distinct")
        self.fraction, self.salt = fraction, salt
        self.train = {g: [k for k in ks if not is_heldout(k, fraction, salt)]
                      for g, ks in groups.items()}
        self.train = {g: ks for g, ks in self.train.items() if ks}
        held = {g: [k for k in ks if is_heldout(k, fraction, salt)] for g, ks in groups.items()}
        for g, ks in held.items():
            random.Random(f"eval|{salt}|{g}").shuffle(ks)
        # Round robin over groups: the first n held-out keys cover the groups evenly.
        self.heldout: list[str] = []
        for i in range(max((len(ks) for ks in held.values()), default=0)):
            self.heldout += [ks[i] for ks in held.values() if i < len(ks)]
        if not self.train or not self.heldout:
            raise ValueError(f"{len(keys)} tasks split at {fraction} leave "
                             f"{sum(map(len, self.train.values()))} training and "
                             f"{len(self.heldout)} held-out tasks; change heldout_fraction")
        self._groups = sorted(self.train)

    def sample(self, rng: random.Random) -> str:
        return rng.choice(self.train[rng.choice(self._groups)])

    def eval_keys(self, n: int) -> list[str]:
        if n > len(self.heldout):
            raise ValueError(f"only {len(self.heldout)} held-out tasks exist; lower "
                             "env.eval_size or raise env.heldout_fraction")
        return self.heldout[:n]

    def contains_heldout(self, key: str) -> bool:
        return is_heldout(key, self.fraction, self.salt)


class SplitTasks:
    """`sample`, `eval_tasks` and `is_heldout` of an Env whose tasks are keyed by a
    `Split` (`self.split`) and built by `self.task(key)`: the code and SQL envs."""

    split: Split

    def task(self, key: str) -> Task:
        raise NotImplementedError

    def sample(self, rng: random.Random) -> Task:
        return self.task(self.split.sample(rng))

    def eval_tasks(self, n: int) -> list[Task]:
        return [self.task(k) for k in self.split.eval_keys(n)]

    def is_heldout(self, task: Task) -> bool:
        return self.split.contains_heldout(task.task_id)
