"""Dynamic sampling at the source (`rollout.skip_solved_versions`): the worker does not
draw again, for a while, a task whose every sample it saw succeed."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from astraflow.envs.base import Task
from astraflow.rollout.sampler import TaskSampler
from astraflow.rollout.worker import RolloutWorker
from tests.runs import seeded_run, worker_flow


class Pool:
    """An env whose draws come from a fixed list of task ids."""

    def __init__(self, ids):
        self.ids = list(ids)

    def sample(self, rng):
        return Task(task_id=rng.choice(self.ids), prompt="p", answer="a")


@dataclass
class P:
    task_id: str
    group: str
    reward: float


def parts(task_id, group, rewards):
    return [P(task_id, group, r) for r in rewards]


def test_a_task_solved_by_every_sample_is_skipped_for_the_window():
    s = TaskSampler(Pool(["a", "b"]), random.Random(0), skip_versions=3)
    assert s.record(parts("a", "g1", [1.0, 1.0]) + parts("b", "g2", [1.0, 0.0]), version=5) == 1
    for v in (5, 6, 7):  # solved at 5: skipped through version 7
        drawn = {t.task_id for t in s.draw(50, v)}
        assert drawn == {"b"}
        assert s.skipped > 0
    assert "a" in {t.task_id for t in s.draw(50, 8)}  # window over: drawn again


def test_a_failing_group_forgets_the_task_and_partial_credit_is_not_solved():
    s = TaskSampler(Pool(["a", "b"]), random.Random(0), skip_versions=10)
    s.record(parts("a", "g1", [1.0, 1.0]), version=1)
    assert s.solved_at == {"a": 1}
    s.record(parts("a", "g7", [1.0, 0.5]), version=2)  # 0.5: not a success
    assert s.solved_at == {}
    # Two groups of one task in one batch: solved only if both are.
    s.record(parts("b", "g1", [1.0, 1.0]) + parts("b", "g2", [0.0, 1.0]), version=3)
    assert s.solved_at == {}


def test_an_all_solved_pool_still_fills_the_batch_and_off_draws_plainly():
    s = TaskSampler(Pool(["a"]), random.Random(0), skip_versions=5, max_draws=4)
    s.record(parts("a", "g", [1.0, 1.0]), version=0)
    assert [t.task_id for t in s.draw(3, 1)] == ["a"] * 3
    assert s.skipped == 3 * 3  # each slot tried 4 times, kept its last draw
    off = TaskSampler(Pool(["a"]), random.Random(0), skip_versions=0)
    assert off.record(parts("a", "g", [1.0, 1.0]), version=0) == 0 and off.solved_at == {}
    with pytest.raises(ValueError):
        TaskSampler(Pool(["a"]), random.Random(0), skip_versions=-1)


def test_the_worker_draws_its_batch_through_the_sampler(tmp_path, tiny_policy_dir):
    ctx = seeded_run(tmp_path / "run", worker_flow(skip_solved_versions=4), tiny_policy_dir,
                     versions=2)
    w = RolloutWorker(ctx, "wA")
    assert w.refresh_weights() and w.version == 1
    rng = random.Random(1)
    pool = {}
    while len(pool) < 4:
        t = w.env.sample(rng)
        pool[t.task_id] = t
    ids = sorted(pool)
    w.env.sample = lambda r: pool[r.choice(ids)]
    w.sampler.solved_at = {i: 1 for i in ids[:3]}  # three of four seen solved at v1
    assert w.produce_batch() == 6
    rows = ctx.trajectories().read_range("solver", 0, 10**9).to_pylist()
    assert {r["task_id"] for r in rows} == {ids[3]}
    # The batch's groups are recorded: the fourth task counts as solved iff every one of
    # its samples succeeded.
    solved = all(r["reward"] >= 1.0 for r in rows)
    assert set(w.sampler.solved_at) == set(ids[:3]) | ({ids[3]} if solved else set())
