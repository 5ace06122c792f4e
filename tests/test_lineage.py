"""Staleness by lineage: a rollback's republished version does not make fresh rows stale."""

from __future__ import annotations

import pytest

from astraflow.context import RunContext
from astraflow.stores.weights import Manifest, WeightError
from astraflow.train.lineage import Lineage
from astraflow.train.trainer import Trainer
from tests.runs import seeded_run
from tests.test_stores import make_rows

BATCH = 8


def make_ctx(run, tiny_policy_dir, keep_last: int = 8, rollout: dict | None = None) -> RunContext:
    flow = {
        "name": "lin", "policies": [{"name": "solver", "model": {
            "hidden_size": 64, "layers": 2, "heads": 2, "intermediate_size": 128},
            "algorithm": {"lr": 0.01}}],
        "env": {"digits": 2, "eval_size": 20},
        "rollout": {"prompts_per_batch": 2, "samples_per_prompt": 4, **(rollout or {})},
        "trainer": {"checkpoint_every": 3},
        "stages": [{"name": "staleness", "params": {"max_versions": 1}},
                   {"name": "group_advantages"}],
        "store": {"keep_last": keep_last, "keep_every": 0},
    }
    return seeded_run(run, flow, tiny_policy_dir)


def append(ctx: RunContext, behavior_version: int) -> None:
    rows = make_rows("solver", BATCH)
    for r in rows:
        r["behavior_version"] = behavior_version
    ctx.trajectories().append("solver", rows)


def test_rollback_does_not_turn_fresh_rows_stale(tmp_path, tiny_policy_dir):
    ctx = make_ctx(tmp_path / "run", tiny_policy_dir)
    lost = Trainer(ctx)
    for _ in range(5):  # each batch sampled by the newest version: all fresh
        append(ctx, lost.version)
        res = lost.train_on(lost.poll())
        assert res.rows_used == BATCH and res.metrics["staleness_mean"] == 0
    assert lost.version == 5 and ctx.checkpoints().steps("solver") == [3]  # after v3
    del lost  # killed: steps 3 and 4 (v4, v5) are lost; their rows are trained again

    resumed = Trainer(ctx)
    assert resumed.version == 6  # v3's weights, republished
    ws = ctx.weights()
    man = ws.manifest("solver", 6)
    assert (man.parent, man.lineage) == (3, 3)  # same weights as v3: same depth
    # v3 and v6 hold the restored weights; v4 is one trained version off the fork (v3)
    assert resumed.lineage.staleness_of(6, [3, 4, 5, 6]) == {3: 0, 4: 1, 5: 2, 6: 0}

    res = resumed.train_on(resumed.poll())  # the rows v3 sampled (lost step 3 trained them)
    assert res.rows_used == BATCH, "v3's rows were called stale after the rollback"
    assert res.metrics["staleness_mean"] == 0  # by version number it would read 6 - 3 = 3
    assert resumed.version == 7 and ws.manifest("solver", 7).lineage == 4
    res = resumed.train_on(resumed.poll())  # v4's rows: a dead branch, 1 + 1 from v7
    assert res.metrics["staleness_mean"] == 2 and res.rows_used == 0
    entry = ctx.ledger().entries("solver")[-1]
    assert entry.rows_stale == BATCH


def test_lineage_survives_a_restart_and_pruned_versions_count_as_stale(tmp_path,
                                                                     tiny_policy_dir):
    ctx = make_ctx(tmp_path / "run", tiny_policy_dir, keep_last=2)
    tr = Trainer(ctx)
    for _ in range(5):
        append(ctx, tr.version)
        tr.train_on(tr.poll())
    del tr  # checkpoint after 3 steps; v4, v5 lost
    resumed = Trainer(ctx)
    ws = ctx.weights()
    assert ws.versions("solver") == [0, 5, 6]  # keep_last 2 pruned v3's and v4's manifests
    # v3 comes from the checkpoint's lineage record; v4 is gone, and v5 (whose manifest
    # is there) descends from it, so neither can be placed: both count as stale
    assert resumed.lineage.staleness_of(6, [0, 3, 4, 5]) == {0: 3, 3: 0, 4: None, 5: None}
    res = resumed.train_on(resumed.poll())  # v3's rows: fresh
    assert res.rows_used == BATCH and res.metrics["staleness_mean"] == 0
    res = resumed.train_on(resumed.poll())  # v4's rows: lineage unknown → stale
    assert res.rows_used == 0 and res.metrics["rows_lineage_unknown"] == BATCH
    assert "staleness_mean" not in res.metrics
    assert ctx.ledger().entries("solver")[-1].rows_stale == BATCH


def _man(version: int, parent: int | None, lineage: int | None) -> Manifest:
    return Manifest(policy="p", version=version, step=0, parent=parent, time=0.0, files={},
                    lineage=lineage)


def test_tree_distance_and_legacy_manifests():
    # 0 ─ 1 ─ 2 ─ 3 ─ 4 (dead)      legacy manifests (no lineage): depth = version
    #               └─ 5 (republish of 2's weights plus one update: depth 3)
    mans = {0: _man(0, None, None), 1: _man(1, 0, None), 2: _man(2, 1, None),
            3: _man(3, 2, 3), 4: _man(4, 3, 4), 5: _man(5, 2, 3)}

    def read(v: int) -> Manifest:
        if v not in mans:
            raise WeightError(f"v{v} gone")
        return mans[v]

    lin = Lineage(read)
    assert lin.staleness_of(5, [0, 1, 2, 3, 4, 5, 9]) == {0: 3, 1: 2, 2: 1, 3: 2, 4: 3, 5: 0,
                                                            9: None}
    # restored from a checkpoint's record, the same answers
    again = Lineage.from_json(read, lin.to_json())
    assert again.staleness(5, 4) == 3
    with pytest.raises(WeightError, match="not resolvable"):
        Lineage(read).staleness(9, 1)
