"""Replay against a real trajectory table, the trainer's accounting of replayed rows,
and a stage defined in this file plugged into a flow through its YAML alone."""

from __future__ import annotations

from functools import partial

import numpy as np
import pyarrow as pa
import pytest
import yaml

from astraflow.data.stages import REPLAYED, StageContext, StageResult, drop_rows, run_stages
from astraflow.stores import TrajectoryStore, check_ledger
from astraflow.train.trainer import COLUMNS
from tests.runs import seeded_run
from tests.test_stores import make_rows


def rows(specs, version=3, policy="p"):
    """specs: (group, task, prompt, completion, reward) per row."""
    out = make_rows(policy, len(specs))
    for r, (g, task, prompt, comp, reward) in zip(out, specs, strict=True):
        r.update(group_id=g, task_id=task, prompt_ids=prompt, completion_ids=comp,
                 behavior_logprobs=[-1.0] * len(comp), loss_mask=[1] * len(comp),
                 reward=float(reward), behavior_version=version)
    return out


def test_replay_gives_a_failed_group_an_earlier_success(tmp_path):
    store = TrajectoryStore(tmp_path / "store")
    store.append("p", rows([("old1", "t1", [1, 2], [5], 1), ("old1", "t1", [1, 2], [6], 0),
                            ("old2", "t2", [3, 4], [7], 1)], version=1))
    store.append("p", rows([("old3", "t1", [1, 2], [8], 1)], version=2))  # newer: preferred
    store.append("p", rows([("old4", "t1", [1, 2], [9], 1)], version=0))  # too old
    start = store.latest_version("p")
    store.append("p", rows([("g1", "t1", [1, 2], [0], 0)] * 4            # all failed
                           + [("g2", "t2", [3, 4], [0], 1)] * 2          # all solved
                           + [("g3", "t3", [5, 6], [0], 0)] * 2))        # never solved
    sl = store.read_after("p", start, columns=COLUMNS)
    ctx = StageContext(policy="p", version=3, step=7,
                       history=partial(store.read_range, "p", 0, sl.start))
    chain = [("replay", {"ratio": 0.5, "max_versions": 2}), ("zero_variance_filter", {}),
             ("group_advantages", {})]
    res = run_stages(sl.rows, ctx, chain)
    out = res.rows.to_pylist()
    assert [r["group_id"] for r in out] == ["g1"] * 5
    replayed = [r for r in out if r[REPLAYED]]
    assert len(replayed) == 1 and replayed[0]["completion_ids"] == [8]  # newest success of t1
    assert replayed[0]["behavior_version"] == 2 and replayed[0]["reward"] == 1
    # The group now carries a signal: 4 failures at −0.5 std, the success at +2.
    adv = [r["advantage"] for r in out]
    np.testing.assert_allclose(adv, [-0.5] * 4 + [2.0], atol=1e-4)
    assert res.dropped == {"zero_variance": 4}  # g2, g3: consumed rows, filtered
    assert res.ledger_counts() == (4, 0, 4)     # 8 consumed: 4 used + 4 filtered
    assert res.metrics["rows_replayed"] == 1
    # Without replay the same step has nothing to learn from.
    bare = run_stages(sl.rows, ctx, chain[1:])
    assert bare.rows.num_rows == 0 and bare.ledger_counts() == (0, 0, 8)
    # The history is what was committed before the step's range: from the first commit
    # on, nothing earlier exists and nothing is replayed.
    first = StageContext(policy="p", version=3, step=0, history=partial(store.read_range, "p", 0, 0))
    assert run_stages(sl.rows, first, chain[:1]).metrics == {"replay_candidates": 0.0}


def test_replay_budget_and_preconditions(tmp_path):
    store = TrajectoryStore(tmp_path / "store")
    store.append("p", rows([(f"o{i}", f"t{i}", [i, 9], [5], 1) for i in range(4)]
                           + [("o0b", "t0", [0, 9], [6], 1)]))
    start = store.latest_version("p")
    store.append("p", rows([(f"g{i}", f"t{i}", [i, 9], [0], 0.1 * i) for i in range(4) for _ in (0, 1)]))
    sl = store.read_after("p", start, columns=COLUMNS)
    ctx = StageContext(policy="p", version=3, step=1, history=partial(store.read_range, "p", 0, start))
    # ratio 0.25 of 8 rows → 2 rows, to the two lowest-reward groups first
    res = run_stages(sl.rows, ctx, [("replay", {"ratio": 0.25})])
    got = [(r["group_id"], r["completion_ids"]) for r in res.rows.to_pylist() if r[REPLAYED]]
    assert sorted(got) == [("g0", [5]), ("g1", [5])] or sorted(got) == [("g0", [6]), ("g1", [5])]
    assert res.added == 2 and res.ledger_counts() == (8, 0, 0)
    # two per group where the history has them
    res = run_stages(sl.rows, ctx, [("replay", {"ratio": 1.0, "max_per_group": 2})])
    per = [r["group_id"] for r in res.rows.to_pylist() if r[REPLAYED]]
    assert sorted(per) == ["g0", "g0", "g1", "g2", "g3"]
    with pytest.raises(ValueError, match="history"):
        run_stages(sl.rows, StageContext(policy="p", version=3, step=1), [("replay", {})])
    with pytest.raises(ValueError, match="before the stages"):
        run_stages(sl.rows, ctx, [("group_advantages", {}), ("replay", {})])


FLOW = {
    "name": "rp", "policies": [{"name": "solver", "model": {"hidden_size": 64, "layers": 2,
                                                          "heads": 2, "intermediate_size": 128}}],
    "env": {"digits": 2, "eval_size": 20},
    "rollout": {"prompts_per_batch": 2, "samples_per_prompt": 4},
    "stages": [{"name": "replay", "params": {"ratio": 1.0, "max_versions": None}},
               {"name": "dr_grpo_advantages"},
               {"name": "length_norm", "params": {"mode": "sequence_mean"}}],
}


def test_trainer_replays_without_counting_replays_in_the_ledger(tmp_path, tiny_policy_dir):
    """Step 0 consumes successes; step 1's failed groups of the same prompts get them
    back. The ledger counts each consumed row once; the replays are a metric."""
    from astraflow.train.trainer import Trainer

    ctx = seeded_run(tmp_path / "run", FLOW, tiny_policy_dir)
    traj = ctx.trajectories()
    traj.append("solver", rows([("a", "t1", [1, 2], [5, 6], r) for r in (1, 0, 0, 0)]
                               + [("b", "t2", [3, 4], [7], r) for r in (1, 1, 0, 0)], 0, "solver"))
    traj.append("solver", rows([("c", "t1", [1, 2], [6, 6, 6], 0)] * 4
                               + [("d", "t2", [3, 4], [8], 0)] * 4, 0, "solver"))
    tr = Trainer(ctx)
    first = tr.train_on(tr.poll())
    second = tr.train_on(tr.poll())
    assert "rows_replayed" not in first.metrics and first.rows_used == 8
    assert second.metrics["rows_replayed"] == 2 and second.rows_used == 8
    assert second.metrics["loss"] != 0 and second.metrics["tokens"] == 12 + 4 + 2 + 1
    entries = ctx.ledger().entries("solver")
    assert [(e.rows_read, e.rows_used, e.rows_filtered) for e in entries] == [(8, 8, 0), (8, 8, 0)]
    assert check_ledger(entries) == []


# ---------------------------------------------------------------- a user's own stage
def drop_longest(rows: pa.Table, ctx: StageContext, *, keep_fraction: float = 0.5) -> StageResult:
    """A user's stage: keep the shorter `keep_fraction` of the answers; count the rest
    as filtered, and say so in the metrics."""
    n = np.array([len(c) for c in rows.column("completion_ids").to_pylist()])
    keep = np.zeros(len(n), dtype=bool)
    keep[np.argsort(n, kind="stable")[: int(len(n) * keep_fraction)]] = True
    res = drop_rows(rows, {"too_long": ~keep})
    res.metrics = {"user_stage_step": float(ctx.step)}
    return res


USER_FLOW = """
name: user-stage
policies:
  - name: solver
    model: {hidden_size: 64, layers: 2, heads: 2, intermediate_size: 128}
    stages:
      - {name: overlength_penalty, params: {penalty: 0.5}}
      - name: tests.test_stages_replay:drop_longest
        params: {keep_fraction: 0.25}
      - name: solved_filter
      - name: dr_grpo_advantages
env: {digits: 2, eval_size: 20}
rollout: {prompts_per_batch: 2, samples_per_prompt: 4}
"""


def test_a_stage_from_the_flow_yaml_runs_in_the_trainer(tmp_path, tiny_policy_dir):
    """The stage above, named only in the flow's YAML, runs on real rollouts: the
    ledger counts what it dropped as filtered and the metrics carry its own number."""
    from astraflow.rollout.worker import RolloutWorker
    from astraflow.train.trainer import Trainer

    ctx = seeded_run(tmp_path / "run", yaml.safe_load(USER_FLOW), tiny_policy_dir)
    assert [s.name for s in ctx.flow.stages_for("solver")][1] == "tests.test_stages_replay:drop_longest"
    worker = RolloutWorker(ctx, "w0")
    worker.refresh_weights()
    tr = Trainer(ctx)
    for _ in range(2):
        assert worker.produce_batch() == 8
        tr.train_on(tr.poll())
    entries = ctx.ledger().entries("solver")
    assert [(e.rows_read, e.rows_used, e.rows_filtered) for e in entries] == [(8, 2, 6)] * 2
    assert all(e.optimizer_step for e in entries)
    m = ctx.ledger().read_metrics(names=["user_stage_step", "rows_dropped_too_long"]).to_pylist()
    got = sorted((r["step"], r["name"], r["value"]) for r in m)
    assert got == [(0, "rows_dropped_too_long", 6.0), (0, "user_stage_step", 0.0),
                   (1, "rows_dropped_too_long", 6.0), (1, "user_stage_step", 1.0)]
    # The built-ins around it read the worker's rows: finish reasons from their extras.
    cut = ctx.trajectories().read_range("solver", 0, 10**9, ["extras"])
    truncated = sum('"length"' in e for e in cut.column("extras").to_pylist())
    m = ctx.ledger().read_metrics(names=["rows_overlong"]).column("value").to_pylist()
    assert sum(m) == truncated
