"""The batch fill (`algorithm.min_signal_rows`): a trainer step waits for further rollout
batches until its rows carry enough signal, on a real store and a real trainer."""

from __future__ import annotations

import pytest

from astraflow.config.loader import parse_flow
from astraflow.data.stages import signal_rows, solved_share
from astraflow.observe.audit import audit_policy
from astraflow.stores import replay
from astraflow.train.trainer import Trainer
from tests.runs import seeded_run
from tests.test_stores import make_rows

BATCH = 8  # 2 prompts x 4 samples


def _flow(**algorithm) -> dict:
    return {
        "name": "f", "policies": [{"name": "solver", "model": {
            "hidden_size": 64, "layers": 2, "heads": 2, "intermediate_size": 128},
            "algorithm": {"lr": 0.01, **algorithm}}],
        "env": {"digits": 2, "eval_size": 20},
        "rollout": {"prompts_per_batch": 2, "samples_per_prompt": 4, "max_backlog_batches": 3},
    }


def _batch(varied_groups: int, tag: str) -> list[dict]:
    """Two groups of 4; the first `varied_groups` have rewards 0,1,0,1, the rest all 1."""
    rows = make_rows("solver", BATCH, tag)
    for i, r in enumerate(rows):
        r["group_id"] = f"{tag}-g{i // 4}"
        if i // 4 >= varied_groups:
            r["reward"] = 1.0
    return rows


def test_signal_rows_counts_rows_of_groups_whose_rewards_differ():
    import pyarrow as pa
    rows = pa.Table.from_pylist([{k: r[k] for k in ("group_id", "reward")}
                                 for r in _batch(1, "a") + _batch(0, "b") + _batch(2, "c")])
    assert signal_rows(rows) == 12 and signal_rows(rows.slice(0, 0)) == 0


def test_solved_share_counts_groups_whose_every_sample_earns_the_reward():
    import pyarrow as pa
    rows = [{k: r[k] for k in ("group_id", "reward")}
            for r in _batch(1, "a") + _batch(0, "b")]  # varied, solved, solved, solved
    rows[8:12] = [{"group_id": "b-g0", "reward": 0.0}] * 4  # one of them all failed
    rows.append({"group_id": "lone", "reward": 1.0})  # a group of one is not counted
    table = pa.Table.from_pylist(rows)
    assert solved_share(table, 1.0) == pytest.approx(2 / 4)
    assert solved_share(table, 0.0) == 3 / 4  # every group, but one counts as unsolved
    assert solved_share(table.slice(0, 0), 1.0) == 0.0


def test_a_step_bounds_its_updates_by_the_share_of_groups_still_unsolved(tmp_path,
                                                                      tiny_policy_dir):
    """`update_kl_solved_at`: a step whose batch holds one varied group and one solved
    one (dropped by the stages, counted before) bounds its update at a quarter of
    `max_update_kl`, (1 - 1/2)^2, and logs the share; without it the bound is whole."""
    bounds = {}
    for name, algo in {"scaled": {"update_kl_solved_at": 1.0}, "whole": {}}.items():
        ctx = seeded_run(tmp_path / name, _flow(max_update_kl=0.02, **algo), tiny_policy_dir)
        ctx.trajectories().append("solver", _batch(1, "a"))
        tr = Trainer(ctx)
        res = tr.train_on(tr.poll())
        assert res.rows_read == BATCH and res.rows_used == 4
        bounds[name] = res.metrics["update_kl_bound"]
        assert res.metrics.get("solved_share") == (0.5 if name == "scaled" else None)
    assert bounds == {"scaled": pytest.approx(0.005), "whole": pytest.approx(0.02)}


def test_a_step_whose_every_group_is_solved_keeps_one_groups_share(tmp_path, tiny_policy_dir):
    """Solved groups kept in the loss (`keep_solved_at`, as for a KL anchor), and every
    group solved: the step still runs, its bound one group's share, (1/2)^2."""
    flow = _flow(max_update_kl=0.02, update_kl_solved_at=1.0)
    flow["stages"] = [{"name": "zero_variance_filter", "params": {"keep_solved_at": 1.0}},
                      {"name": "group_advantages"}]
    ctx = seeded_run(tmp_path / "r", flow, tiny_policy_dir)
    ctx.trajectories().append("solver", _batch(0, "a"))
    tr = Trainer(ctx)
    res = tr.train_on(tr.poll())
    assert res.rows_used == BATCH and res.metrics["solved_share"] == 0.5
    assert res.metrics["update_kl_bound"] == pytest.approx(0.02 / 4)


def test_a_step_waits_for_signal_then_consumes_every_row_once(tmp_path, tiny_policy_dir):
    """need 8 signal rows: a batch with 4 waits; the next batch (4 more) completes the
    step over both; at the backlog bound (3 batches) a step goes ahead with what it has;
    the ledger covers each row exactly once and the audit is clean."""
    ctx = seeded_run(tmp_path / "r", _flow(min_signal_rows=8), tiny_policy_dir)
    traj = ctx.trajectories()
    tr = Trainer(ctx)
    traj.append("solver", _batch(1, "a"))
    assert tr.poll() is None and tr.fill.want == 2 * BATCH  # waits for one batch more
    assert tr.poll() is None  # still: the rows are not there yet
    traj.append("solver", _batch(1, "b"))
    sl = tr.poll()
    assert sl is not None and sl.num_rows == 2 * BATCH and signal_rows(sl.rows) == 8
    res = tr.train_on(sl)
    assert res.rows_read == 16 and res.rows_used == 8 and tr.fill.want == BATCH
    for tag in "cde":  # all-correct groups: no signal at all
        traj.append("solver", _batch(0, tag))
    assert tr.poll() is None and tr.poll() is None
    sl = tr.poll()  # the backlog bound (3 batches): no more rows could come
    assert sl is not None and sl.num_rows == 3 * BATCH
    res = tr.train_on(sl)
    assert res.rows_read == 24 and res.rows_used == 0
    effective = replay(ctx.ledger().history("solver")).effective
    assert [e.rows_read for e in effective] == [16, 24]
    report = audit_policy(ctx, "solver")
    assert report.ok, report


def test_without_the_fill_each_batch_is_a_step(tmp_path, tiny_policy_dir):
    ctx = seeded_run(tmp_path / "r", _flow(), tiny_policy_dir)
    ctx.trajectories().append("solver", _batch(0, "a"))
    sl = Trainer(ctx).poll()
    assert sl is not None and sl.num_rows == BATCH


def test_the_fill_is_refused_in_sync_mode():
    flow = {**_flow(min_signal_rows=8), "mode": "sync"}
    with pytest.raises(ValueError, match="min_signal_rows"):
        parse_flow(flow)


def test_the_worker_keeps_generating_while_a_filling_trainer_may_need_rows(tmp_path,
                                                                          tiny_policy_dir):
    """A trainer with 1 step left holds 1 batch of rows: without the fill that step is
    covered (the policy is done), with it the step may take up to the backlog bound, so
    the worker must not stop (a trainer waiting on rows that never come would hang)."""
    from astraflow.rollout.worker import RolloutWorker
    from tests.runs import worker_flow

    def state(**algorithm):
        flow = worker_flow(max_backlog_batches=3)
        flow["policies"][0]["algorithm"] = algorithm
        flow["stop"] = {"max_steps": 1}
        ctx = seeded_run(tmp_path / str(len(algorithm)), flow, tiny_policy_dir)
        w = RolloutWorker(ctx, "wA")
        w.refresh_weights()
        w.produce_batch()
        return w.policy_state("solver")

    assert state().done
    filling = state(min_signal_rows=4)
    assert not filling.done and filling.open
