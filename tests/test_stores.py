"""Trajectory store, weight store and ledger, on real LanceDB and real files."""

from __future__ import annotations

import json
import multiprocessing as mp
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from astraflow.stores import (
    Ledger,
    LedgerEntry,
    SchemaMismatch,
    TamperedWeights,
    TrajectoryStore,
    WeightError,
    WeightStore,
    check_ledger,
)


def make_rows(policy: str, n: int, tag: str = "w") -> list[dict]:
    now = datetime.now(UTC)
    return [
        {
            "traj_id": f"{tag}-{uuid.uuid4().hex}", "group_id": f"g{i // 4}", "policy": policy,
            "behavior_version": 0, "prompt_ids": [1, 5, 6], "completion_ids": [7, 2],
            "behavior_logprobs": [-0.5, -0.1], "loss_mask": [1, 1], "reward": float(i % 2),
            "env": "math", "task_id": f"t{i}", "worker": tag, "region": "local",
            "created_at": now, "extras": "{}",
        }
        for i in range(n)
    ]


def _writer(uri: str, tag: str, batches: int, rows: int) -> None:
    store = TrajectoryStore(uri)
    for _ in range(batches):
        store.append("p", make_rows("p", rows, tag))


def test_cursor_exact_under_concurrent_writers(tmp_path):
    """4 writer processes append while a reader follows its cursor: every row once."""
    uri = str(tmp_path / "store")
    store = TrajectoryStore(uri)
    store.table("p")  # create before the writers race
    writers, batches, rows = 4, 25, 8
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(uri, f"w{i}", batches, rows)) for i in range(writers)]
    for p in procs:
        p.start()
    seen: list[str] = []
    cursor, slices = 0, 0
    deadline = time.time() + 900  # a hang guard: the loop ends when every row is read
    while time.time() < deadline:
        alive = any(p.is_alive() for p in procs)
        sl = store.read_after("p", cursor, min_rows=1, max_rows=3 * rows, columns=["traj_id"])
        if sl is not None:
            assert sl.start == cursor and sl.end > cursor
            seen += sl.rows.column("traj_id").to_pylist()
            cursor, slices = sl.end, slices + 1
        elif not alive:
            break
    for p in procs:
        p.join()
        assert p.exitcode == 0
    total = writers * batches * rows
    assert len(seen) == total, f"read {len(seen)} rows, {total} were written"
    assert len(set(seen)) == total, "a row was read twice"
    assert store.count("p") == total
    assert slices > 1  # the reader really interleaved with the writers


def test_read_after_cuts_on_commit_boundaries(tmp_path):
    store = TrajectoryStore(tmp_path / "s")
    versions = [store.append("p", make_rows("p", 8)) for _ in range(3)]
    sl = store.read_after("p", 0, min_rows=8, max_rows=8)
    assert sl.num_rows == 8 and sl.end == versions[0]
    sl2 = store.read_after("p", sl.end, min_rows=8, max_rows=8)
    assert sl2.end == versions[1]
    assert store.read_after("p", versions[2], min_rows=1) is None
    assert store.read_after("p", versions[1], min_rows=9) is None  # only 8 new rows
    assert store.count_after("p", versions[0]) == 16


def test_cursor_survives_compaction(tmp_path):
    store = TrajectoryStore(tmp_path / "s")
    for _ in range(5):
        v = store.append("p", make_rows("p", 4))
    before = store.read_after("p", 2, columns=["traj_id"]).rows.column("traj_id").to_pylist()
    store.maintain("p")
    after = store.read_after("p", 2, columns=["traj_id"])
    assert sorted(after.rows.column("traj_id").to_pylist()) == sorted(before)
    assert store.read_after("p", v) is None or store.read_after("p", v).num_rows == 0


def test_next_batch_parses_only_new_fragments(tmp_path, monkeypatch):
    """Reading the next batch does no more work on a long-lived table than on a new one:
    a compacted fragment's creation versions (one run per commit it took in, parsed in
    Python) are parsed once per process, not on every read. Issue 14's soak: read p50
    grew 172 -> 601 ms over 76k commits while fragments stayed bounded, because every
    read parsed every fragment's runs. Counts runs parsed, not time."""
    from astraflow.stores import _lance

    parsed: list[int] = []
    real = _lance.row_runs

    def counting(meta):
        runs = real(meta)
        parsed.append(len(runs or ()))
        return runs

    monkeypatch.setattr(_lance, "row_runs", counting)
    store = TrajectoryStore(tmp_path / "s")

    def steady_reads(history: int) -> list[int]:
        """Append `history` more commits, compact them into one fragment, then the
        runs parsed by each of three reads of one new commit."""
        for _ in range(history):
            store.append("p", make_rows("p", 2))
        assert store.maintain("p", retain=timedelta(0))["fragments"] == 1
        cursor = store.latest_version("p")
        out = []
        for i in range(4):
            v = store.append("p", make_rows("p", 2, tag=f"n{i}"))
            parsed.clear()
            sl = store.read_after("p", cursor, columns=["traj_id"])
            assert sl.end == v and sl.num_rows == 2  # exactly the new commit
            assert store.count_after("p", cursor) == 2
            cursor = v
            out.append(sum(parsed))
        return out[1:]  # the first read after a compaction parses its new fragment once

    assert steady_reads(20) == [1, 1, 1]  # the new commit's one run
    assert steady_reads(60) == [1, 1, 1]  # the same with 4x the history


def test_read_after_filters_only_fragments_with_old_rows(tmp_path, monkeypatch):
    """A plain append's fragment holds only rows of its own commit, so the next batch is
    read without the version filter (a third of a small read's CPU); a compacted fragment
    mixing read and unread commits is filtered, and both give exactly the new rows."""
    import lance

    filters: list[str | None] = []
    real = lance.LanceDataset.scanner

    def spy(self, *args, **kwargs):
        filters.append(kwargs.get("filter"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(lance.LanceDataset, "scanner", spy)
    store = TrajectoryStore(tmp_path / "s")
    vs = [store.append("p", make_rows("p", 3, tag=f"b{i}")) for i in range(4)]
    filters.clear()
    sl = store.read_after("p", vs[1], columns=["traj_id"])
    assert sl.num_rows == 6 and sl.end == vs[3] and filters == [None]
    assert store.count_after("p", vs[2]) == 3
    store.maintain("p", retain=timedelta(0))  # one fragment: commits read and unread
    filters.clear()
    sl = store.read_after("p", vs[1], columns=["traj_id"])
    assert sorted(sl.rows.column("traj_id").to_pylist()) == sorted(
        store.read_range("p", vs[1], vs[3], columns=["traj_id"]).column("traj_id").to_pylist())
    assert sl.num_rows == 6 and filters[0] is not None
    assert store.count_after("p", vs[2]) == 3


def test_schema_checked_on_write(tmp_path):
    store = TrajectoryStore(tmp_path / "s")
    rows = make_rows("p", 2)
    rows[1]["reward"] = "high"
    with pytest.raises(SchemaMismatch, match="'reward'"):
        store.append("p", rows)
    rows = make_rows("p", 2)
    rows[0]["behavior_logprobs"] = [-0.1]  # one logprob for two tokens
    with pytest.raises(SchemaMismatch, match="behavior_logprobs"):
        store.append("p", rows)
    rows = make_rows("p", 2)
    del rows[0]["loss_mask"]
    with pytest.raises(SchemaMismatch, match="loss_mask"):
        store.append("p", rows)
    with pytest.raises(SchemaMismatch, match="'policy'"):
        store.append("q", make_rows("p", 2))
    assert store.count("p") == 0  # nothing half-written


def _publish(ws: WeightStore, policy: str, payload: bytes, step: int = 0) -> int:
    d = ws.staging_dir(policy)
    (d / "model.safetensors").write_bytes(payload)
    (d / "config.json").write_text(json.dumps({"x": step}))
    return ws.publish(policy, d, step=step)


def test_weight_versions_need_a_manifest(tmp_path):
    ws = WeightStore(tmp_path / "w")
    assert ws.latest("p") is None
    assert _publish(ws, "p", b"a" * 100) == 0
    assert _publish(ws, "p", b"b" * 100, step=5) == 1
    # A half-written version: files but no manifest (a trainer killed mid-publish).
    half = ws.dir("p", 2)
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"c" * 100)
    assert ws.latest("p") == 1
    assert ws.versions("p") == [0, 1]
    with pytest.raises(WeightError, match="does not exist"):
        ws.load("p", 2)
    man = ws.manifest("p", 1)
    assert man.step == 5 and man.parent == 0 and man.total_bytes > 100
    assert ws.load("p", 1) == ws.dir("p", 1)


def test_tampered_weights_are_refused(tmp_path):
    ws = WeightStore(tmp_path / "w")
    v = _publish(ws, "p", b"a" * 100)
    f = ws.dir("p", v) / "model.safetensors"
    f.write_bytes(b"a" * 99 + b"b")  # same size, different bytes
    with pytest.raises(TamperedWeights, match="sha256"):
        ws.load("p", v)
    f.write_bytes(b"a" * 50)  # truncated
    with pytest.raises(TamperedWeights, match="bytes"):
        ws.load("p", v)


def test_pickle_weights_never_published_or_loaded(tmp_path):
    ws = WeightStore(tmp_path / "w")
    d = ws.staging_dir("p")
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    with pytest.raises(WeightError, match="refusing weight file"):
        ws.publish("p", d, step=0)
    v = _publish(ws, "p", b"a")
    (ws.dir("p", v) / "extra.pt").write_bytes(b"\x80\x04")
    with pytest.raises(TamperedWeights, match="unexpected file"):
        ws.load("p", v)


def test_prune_keeps_last_milestones_and_protected(tmp_path):
    ws = WeightStore(tmp_path / "w")
    for i in range(12):
        _publish(ws, "p", bytes([i]) * 10)
    removed = ws.prune("p", keep_last=3, keep_every=5, protect={7})
    assert ws.versions("p") == [0, 5, 7, 9, 10, 11]
    assert sorted(removed) == [1, 2, 3, 4, 6, 8]
    assert not ws.dir("p", 1).exists()


def test_ledger_adds_up_and_detects_gaps(tmp_path):
    led = Ledger(tmp_path / "s")
    led.record(LedgerEntry("p", 0, 0, 3, 10, 6, 2, 2, True, 1))
    led.record(LedgerEntry("p", 1, 3, 5, 8, 8, 0, 0, True, 2))
    entries = led.entries("p")
    assert [e.step for e in entries] == [0, 1]
    assert check_ledger(entries) == []
    assert led.last_entry("p").cursor_end == 5
    with pytest.raises(ValueError, match="does not add up"):
        led.record(LedgerEntry("p", 2, 5, 6, 8, 1, 0, 0, True, 2))
    bad = [*entries, LedgerEntry("p", 2, 7, 9, 1, 1, 0, 0, True, 3)]
    assert any("gap" in p for p in check_ledger(bad))
    bad = [*entries, LedgerEntry("p", 2, 4, 9, 1, 1, 0, 0, True, 3)]
    assert any("overlap" in p for p in check_ledger(bad))
    led.log("trainer", "p", 0, {"loss": 0.5})
    assert led.read_metrics(names=["loss"]).num_rows == 1


def test_metrics_batched_into_one_commit_keep_their_times(tmp_path):
    """`metrics_every_s` holds metrics rows back and commits them together (one fragment
    for readers to open, not one per step); each row keeps the time it was logged."""
    led = Ledger(tmp_path / "s")
    v0 = led.metrics.version
    led.metrics_every_s = 3600.0
    led.log("trainer", "p", 0, {"loss": 0.0})  # the first commits at once
    assert led.read_metrics().num_rows == 1 and led.metrics.version == v0 + 1
    for step in range(1, 4):
        time.sleep(0.01)
        led.log("trainer", "p", step, {"loss": float(step)})
    led.flush_due()  # not due: the last commit is 0.03 s old of 3600
    assert led.read_metrics().num_rows == 1 and led.metrics.version == v0 + 1
    led.flush_metrics()
    rows = sorted(led.read_metrics().to_pylist(), key=lambda r: r["step"])
    assert [r["value"] for r in rows] == [0.0, 1.0, 2.0, 3.0]
    assert rows[1]["time"] < rows[2]["time"] < rows[3]["time"]
    assert led.metrics.version == v0 + 2  # one commit for the three held back
    led.flush_metrics()  # nothing pending: no empty commit
    assert led.metrics.version == v0 + 2
    led.metrics_every_s = 0.0  # the default: every log commits
    led.log("trainer", "p", 4, {"loss": 4.0})
    assert led.read_metrics().num_rows == 5


def test_store_calls_retry_outages_but_not_bugs():
    """An I/O failure is retried until it passes; a programming error is raised at once
    (it once cost 120 s of "attempt N failed" lines before the real traceback)."""
    from astraflow.stores import retry

    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise OSError("connection reset")
        return "ok"

    assert retry.call(flaky, what="flaky", budget_s=30) == "ok" and len(calls) == 3
    for bug in (AttributeError("'NoneType' object has no attribute 'version'"),
                NameError("x"), AssertionError(), ValueError("bad")):
        t0 = time.monotonic()
        with pytest.raises(type(bug)):
            retry.call(lambda b=bug: (_ for _ in ()).throw(b), what="bug", budget_s=30)
        assert time.monotonic() - t0 < 5
