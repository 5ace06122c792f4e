"""Data stages: pure functions whose every dropped row is accounted for."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from astraflow import registry
from astraflow.data.stages import StageContext, run_stages

CTX = StageContext(policy="p", version=10, step=3)


def table(groups, rewards, versions=None):
    versions = versions or [10] * len(rewards)
    return pa.table({"group_id": groups, "reward": pa.array(rewards, pa.float32()),
                     "behavior_version": pa.array(versions, pa.int64())})


def test_group_advantages_normalised_per_group():
    t = table(["a", "a", "b", "b", "b", "b"], [1, 0, 1, 1, 0, 0])
    res = registry.resolve("stage", "group_advantages")(t, CTX)
    adv = res.rows.column("advantage").to_numpy()
    np.testing.assert_allclose(adv, [1, -1, 1, 1, -1, -1], atol=1e-4)


def test_zero_variance_groups_filtered_and_counted():
    t = table(["a", "a", "b", "b", "c"], [1, 1, 0, 1, 1])
    res = registry.resolve("stage", "zero_variance_filter")(t, CTX)
    assert res.rows.column("group_id").to_pylist() == ["b", "b"]
    assert res.dropped == {"zero_variance": 3}


def test_solved_groups_kept_for_the_anchor_failed_ones_dropped():
    """`keep_solved_at`: all-solved groups reach the loss with advantage 0 (they carry
    the KL anchor and dilute the update); all-failed and lone rows are still dropped."""
    t = table(["a", "a", "b", "b", "c", "d", "d", "e", "e"], [1, 1, 0, 1, 1, 0, 0, 0.5, 0.5])
    res = run_stages(t, CTX, [("zero_variance_filter", {"keep_solved_at": 1.0}),
                              ("group_advantages", {})])
    assert res.rows.column("group_id").to_pylist() == ["a", "a", "b", "b"]
    assert res.dropped == {"zero_variance": 5}
    np.testing.assert_allclose(res.rows.column("advantage").to_numpy(), [0, 0, -1, 1],
                               atol=1e-4)
    lower = registry.resolve("stage", "zero_variance_filter")(t, CTX, keep_solved_at=0.5)
    assert lower.rows.column("group_id").to_pylist() == ["a", "a", "b", "b", "e", "e"]


def test_staleness_bound():
    t = table(["a", "a", "b", "b"], [1, 0, 1, 0], versions=[10, 10, 1, 1])
    res = registry.resolve("stage", "staleness")(t, CTX, max_versions=8)
    assert res.rows.num_rows == 2 and res.dropped == {"stale": 2}


def test_chain_and_user_stage():
    t = table(["a", "a", "b", "b"], [1, 0, 1, 1])
    res = run_stages(t, CTX, [("zero_variance_filter", {}), ("group_advantages", {}),
                              ("tests.test_stages:drop_first", {})])
    assert res.rows.num_rows == 1
    assert res.dropped == {"zero_variance": 2, "user": 1}


def drop_first(rows, ctx):
    from astraflow.data.stages import StageResult

    return StageResult(rows.slice(1), {"user": 1})


def lying_stage(rows, ctx):
    from astraflow.data.stages import StageResult

    return StageResult(rows.slice(1), {})


def test_a_stage_that_hides_drops_is_refused():
    with pytest.raises(RuntimeError, match="account for every row"):
        run_stages(table(["a", "a"], [1, 0]), CTX, [("tests.test_stages:lying_stage", {})])


def test_unknown_stage_names_the_choices():
    with pytest.raises(ValueError, match="group_advantages"):
        registry.resolve("stage", "grpo")


def test_staleness_by_lineage():
    """The stage reads the trainer's lineage staleness, not version numbers: rows of
    v3 are fresh when v10 republished v3's weights; unknown lineage counts as stale."""
    ctx = StageContext(policy="p", version=10, step=3,
                       lineage_staleness={3: 0, 10: 0, 9: 2, 5: None})
    t = table(["a"] * 4, [1, 0, 1, 0], versions=[3, 10, 9, 5])
    res = registry.resolve("stage", "staleness")(t, ctx, max_versions=1)
    assert res.rows.column("behavior_version").to_pylist() == [3, 10]
    assert res.dropped == {"stale": 2}
    lag = ctx.row_staleness(t.column("behavior_version"))
    assert lag[:3].tolist() == [0, 0, 2] and np.isnan(lag[3])
    with pytest.raises(KeyError, match="no entry"):
        StageContext(policy="p", version=10, step=3, lineage_staleness={}).row_staleness(
            t.column("behavior_version"))


def test_staleness_without_lineage_is_the_version_difference():
    lag = CTX.row_staleness(pa.array([10, 7, 2]))
    assert lag.tolist() == [0, 3, 8]
