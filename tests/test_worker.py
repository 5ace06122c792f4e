"""The rollout worker against a real store: weights, tampering, backpressure, rows."""

from __future__ import annotations

import logging
import shutil
import time

import pytest

from astraflow.rollout.worker import RolloutWorker
from astraflow.stores import LedgerEntry, Progress
from tests.runs import check_staged_until_read, seeded_run, worker_flow


@pytest.fixture
def ctx(tmp_path, tiny_policy_dir):
    return seeded_run(tmp_path / "run", worker_flow(max_backlog_batches=1), tiny_policy_dir,
                      versions=2)


def republish(ws, *, step: int) -> int:
    """Publish version 1's files again as a new version; returns its number."""
    st = ws.staging_dir("solver")
    for f in ws.dir("solver", 1).iterdir():
        if f.name != "MANIFEST.json":
            shutil.copy(f, st)
    return ws.publish("solver", st, step=step)


def test_worker_writes_one_commit_per_batch_with_logprobs(ctx):
    w = RolloutWorker(ctx, "wA")
    assert w.refresh_weights() and w.version == 1
    v = ctx.trajectories().latest_version("solver")
    assert w.produce_batch() == 6
    assert ctx.trajectories().latest_version("solver") == v + 1  # exactly one commit
    rows = ctx.trajectories().read_range("solver", 0, 10**9).to_pylist()
    assert len(rows) == 6 and {r["behavior_version"] for r in rows} == {1}
    assert len({r["group_id"] for r in rows}) == 3  # 3 prompts × 2 samples
    for r in rows:
        assert len(r["completion_ids"]) == len(r["behavior_logprobs"]) == len(r["loss_mask"]) > 0
        assert r["worker"] == "wA" and r["policy"] == "solver"


def test_tampered_version_is_refused_and_previous_kept(ctx, caplog):
    w = RolloutWorker(ctx, "wA")
    w.refresh_weights()
    ws = ctx.weights()
    v2 = republish(ws, step=2)
    f = ws.dir("solver", v2) / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-10] ^= 0xFF
    f.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="astraflow.rollout"):
        assert not w.refresh_weights()
    assert w.version == 1
    assert "refusing solver v2" in caplog.text and "sha256" in caplog.text
    w.produce_batch()
    rows = ctx.trajectories().read_range("solver", 0, 10**9, columns=["behavior_version"])
    assert set(rows.column("behavior_version").to_pylist()) == {1}


def test_backpressure_waits_for_the_trainer(ctx):
    w = RolloutWorker(ctx, "wA")
    w.refresh_weights()
    w.produce_batch()  # backlog: 1 batch = the bound
    t0 = time.time()
    waited = w.wait_for_room(should_stop=lambda: time.time() - t0 > 1.0)
    assert waited >= 1.0  # blocked until told to stop
    end = ctx.trajectories().latest_version("solver")
    led = ctx.ledger()
    led.record(LedgerEntry("solver", 0, 0, end, 6, 6, 0, 0, True, 1))
    led.write_progress(Progress("solver", 0, end, 6, 1, time.time()))  # as the trainer does
    t0 = time.time()
    assert w.wait_for_room(should_stop=lambda: time.time() - t0 > 5.0) < 2.0


def test_a_version_pruned_while_the_engine_loads_it_is_skipped(ctx, monkeypatch):
    """transformers reports a folder that vanished mid-load as an OSError about a repo
    id, not FileNotFoundError: the worker keeps its weights and tries again later; an
    OSError while the folder is still there is a real failure and is raised."""
    w = RolloutWorker(ctx, "wA")
    w.refresh_weights()
    ws = ctx.weights()
    republish(ws, step=2)
    engine = w.engines["solver"]

    def vanish(path):
        shutil.rmtree(path)
        raise OSError("Repo id must be in the form 'repo_name' or 'namespace/repo_name'")

    monkeypatch.setattr(engine, "load_weights", vanish)
    assert not w.refresh_weights() and w.version == 1
    assert republish(ws, step=3) > 1   # a new version for the worker to load

    def broken(path):
        raise OSError("disk on fire")

    monkeypatch.setattr(engine, "load_weights", broken)
    with pytest.raises(OSError, match="disk on fire"):
        w.refresh_weights()


def test_the_worker_loop_batches_its_metrics_and_flushes_them_when_it_ends(ctx):
    """Inside `run`, metrics wait up to `store.metrics_every_s` after the last commit
    (one fragment for many batches); the loop's end commits them; a direct
    `produce_batch` is not held back."""
    ctx.flow.store.metrics_every_s = 3600.0
    w = RolloutWorker(ctx, "wA")
    w.refresh_weights()
    w.produce_batch()  # outside the loop: its metrics are committed at once
    n0 = ctx.ledger().read_metrics().num_rows
    assert n0 > 0
    end = ctx.trajectories().latest_version("solver")  # consumed, as a trainer would
    led = ctx.ledger()
    led.record(LedgerEntry("solver", 0, 0, end, 6, 6, 0, 0, True, 1))
    led.write_progress(Progress("solver", 0, end, 6, 1, time.time()))
    seen: list[int] = []

    def stop() -> bool:  # asked before each batch and while the full backlog blocks it
        if w.batches >= 2:
            seen.append(ctx.ledger().read_metrics().num_rows)
            return True
        return False

    assert w.run(should_stop=stop) == 2
    assert seen and seen[0] == n0  # the loop's batch: held, the last commit was < 1 h ago
    assert ctx.ledger().read_metrics().num_rows == 2 * n0  # committed when the loop ended
    assert w.ledger.metrics_every_s == 0.0


def test_staged_write_mode_leaves_batches_for_the_trainers_read(tmp_path, tiny_policy_dir):
    """`store.write_mode: staged`: a worker's batches are staged (data files and a
    marker, no commit), count as backlog, and the consumer's `read_after` (the trainer's
    read) commits them all in one table version and reads each row once."""
    flow = {**worker_flow(), "store": {"write_mode": "staged"}}
    check_staged_until_read(seeded_run(tmp_path / "run", flow, tiny_policy_dir), "wS")
