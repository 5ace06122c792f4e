"""Both stores on s3:// against a real S3-protocol server (moto) on 127.0.0.1.

The server is started and stopped by these tests (tests/s3server.py), paused
with SIGSTOP to make the store unreachable, and stopped outright to exhaust
the retry budget. Credentials come only from the environment and must never
show up in a log, a resolved config, a summary or an error.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from astraflow.context import RunContext
from astraflow.stores import (
    CheckpointStore,
    Ledger,
    LedgerEntry,
    ObjectStore,
    Progress,
    StoreUnavailable,
    TamperedWeights,
    TrajectoryStore,
    WeightStore,
)
from tests.s3server import TEST_SECRET_KEY, MotoServer
from tests.test_integration import FLOW
from tests.test_kill import stop_run
from tests.test_stores import make_rows


def test_all_stores_round_trip_on_s3(s3_env, tmp_path, tiny_policy_dir, monkeypatch):
    monkeypatch.setenv("ASTRAFLOW_CACHE", str(tmp_path / "cache"))
    root = f"s3://{s3_env}/run"
    traj = TrajectoryStore(f"{root}/store")
    v1 = traj.append("p", make_rows("p", 8))
    v2 = traj.append("p", make_rows("p", 4))
    sl = traj.read_after("p", 0, min_rows=8, max_rows=8)
    assert sl is not None and sl.num_rows == 8 and sl.end == v1 < v2
    assert traj.count_after("p", sl.end) == 4

    ledger = Ledger(f"{root}/store")
    ledger.record(LedgerEntry(policy="p", step=0, cursor_start=0, cursor_end=v1, rows_read=8,
                              rows_used=8, rows_stale=0, rows_filtered=0, optimizer_step=True,
                              weight_version=0))
    ledger.write_progress(Progress("p", 0, v1, 8, 0, time.time()))
    assert ledger.progress("p").cursor == v1 and ledger.entries("p")[0].cursor_end == v1

    ws = WeightStore(f"{root}/weights")
    for _ in range(3):
        st = ws.staging_dir("p")
        for f in tiny_policy_dir.iterdir():
            shutil.copy(f, st)
        ws.publish("p", st, step=0)
    assert ws.versions("p") == [0, 1, 2]
    local = ws.load("p", 2)
    assert (local / "model.safetensors").is_file() and str(local).startswith(str(tmp_path / "cache"))
    # Tamper with the object in the bucket: the cached copy must not hide it.
    obj = ObjectStore(f"{root}/weights")
    data = bytearray(obj.get_bytes("p/v00000002/model.safetensors"))
    data[-1] ^= 0xFF
    obj.put_bytes("p/v00000002/model.safetensors", bytes(data))
    assert ws.load("p", 2) == local  # the verified cached copy is what loads
    with pytest.raises(TamperedWeights, match="sha256"):
        ws.load("p", 2, refresh=True)  # a fresh machine (or the audit) sees the tampering
    (local / "model.safetensors").write_bytes(b"\0" * (local / "model.safetensors").stat().st_size)
    with pytest.raises(TamperedWeights, match="sha256"):
        ws.load("p", 2)  # a damaged cache is fetched again, and the store is still tampered
    assert ws.prune("p", keep_last=1) == [1]
    assert ws.versions("p") == [0, 2]

    cs = CheckpointStore(f"{root}/checkpoints")
    cs.save("p", 5, {"state.safetensors": b"x" * 100}, {"steps_done": 5})
    assert cs.latest("p").meta == {"steps_done": 5}


def test_unreachable_store_stops_with_a_clear_error(s3_env, tmp_path):
    """Past the retry budget a writer stops, naming the store; the batch is not dropped silently."""
    server = MotoServer(tmp_path / "moto2").start()
    try:
        os.environ["AWS_ENDPOINT_URL"] = server.endpoint
        server.create_bucket("gone")
        traj = TrajectoryStore("s3://gone/store", retry_budget_s=4)
        traj.append("p", make_rows("p", 4))
        server.stop()
        t0 = time.time()
        with pytest.raises(StoreUnavailable) as err:
            traj.append("p", make_rows("p", 4))
        msg = str(err.value)
        assert "traj_p" in msg and "s3://gone/store" in msg and "retry_budget_s=4" in msg
        assert TEST_SECRET_KEY not in msg
        assert time.time() - t0 < 60
        with pytest.raises(StoreUnavailable, match="s3://gone/w"):
            WeightStore("s3://gone/w", retry_budget_s=2).versions("p")
    finally:
        server.stop()


@pytest.mark.slow
def test_run_survives_a_15s_store_outage(s3_env, moto_server, tmp_path):
    """The whole flow on s3://, the S3 server paused for 15 s mid-run: the run completes,
    the audit is clean, and the secret key appears nowhere."""
    flow = {**FLOW, "name": "s3run", "store": {"uri": f"s3://{s3_env}/runs/s3run"},
            "trainer": {"checkpoint_every": 5},
            "stop": {**FLOW["stop"], "max_steps": 16, "max_minutes": 6}}
    path = tmp_path / "s3run.yaml"
    path.write_text(yaml.safe_dump(flow))
    env = {**os.environ, "ASTRAFLOW_CACHE": str(tmp_path / "cache")}
    runs = tmp_path / "runs"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "astraflow", "run", str(path), "--runs", str(runs)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True)
    progress = Ledger(f"s3://{s3_env}/runs/s3run")
    try:
        deadline = time.time() + 240
        while (p := progress.progress("solver")) is None or p.step < 4:
            assert launcher.poll() is None and time.time() < deadline, "run never reached step 4"
            time.sleep(0.5)
        paused_at_step = p.step
        moto_server.pause()
        time.sleep(15)
        moto_server.resume()
        out, _ = launcher.communicate(timeout=400)
    finally:
        moto_server.resume()
        stop_run(launcher, runs / "s3run")
    assert launcher.returncode == 0, out
    run = runs / "s3run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "max_steps" and summary["ledger"]["steps"] == 16
    assert paused_at_step < 12  # the outage really hit the middle of the run
    audit = subprocess.run([sys.executable, "-m", "astraflow", "audit", str(run), "--json"],
                           capture_output=True, text=True, timeout=300, env=env)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    counts = json.loads(audit.stdout)["policies"]["solver"]
    assert counts["steps"] == 16 and counts["duplicate_rows"] == 0 and counts["violations"] == 0
    # The outage was felt: the trainer's steps stalled while the store was away.
    times = sorted(e.time for e in RunContext.open(run).ledger().history("solver"))
    assert max(b - a for a, b in zip(times, times[1:], strict=False)) >= 10
    # Nothing was written locally but logs and the summary: the store is the bucket.
    assert not (run / "store").exists() and not (run / "weights").exists()
    texts = [out, audit.stdout, audit.stderr] + [f.read_text(errors="replace")
                                                 for f in Path(run).rglob("*")
                                                 if f.is_file() and f.suffix in (".log", ".json", ".yaml")]
    assert not any(TEST_SECRET_KEY in t for t in texts)


def test_writers_retry_while_the_store_is_down_and_carry_on(s3_env, moto_server, monkeypatch,
                                                           caplog):
    """Connections refused for 6 s (the store is down, not slow): appends, object writes and
    reads retry with backoff, succeed when it returns, and nothing is committed twice."""
    import threading

    from tests.s3server import Gate

    port = int(moto_server.endpoint.rsplit(":", 1)[1])
    gate = Gate(port)
    monkeypatch.setenv("AWS_ENDPOINT_URL", gate.endpoint)
    try:
        traj = TrajectoryStore(f"s3://{s3_env}/down", retry_budget_s=60)
        obj = ObjectStore(f"s3://{s3_env}/down/files", retry_budget_s=60)
        traj.append("p", make_rows("p", 4))
        gate.close()
        threading.Timer(6.0, gate.open).start()
        t0 = time.time()
        rows = make_rows("p", 4)
        traj.append("p", rows)
        obj.put_bytes("a.json", b"{}")
        assert time.time() - t0 >= 5.5  # it really waited for the store
        assert obj.get_bytes("a.json") == b"{}"
        ids = traj.read_range("p", 0, 2**62, columns=["traj_id"]).column("traj_id").to_pylist()
        assert len(ids) == 8 == len(set(ids)) and rows[0]["traj_id"] in ids
        retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
        assert retries and not any(TEST_SECRET_KEY in m for m in retries)
    finally:
        gate.close()


def test_a_flow_on_s3_stages_by_default_a_local_one_commits(s3_env, tmp_path, tiny_policy_dir):
    """`store.write_mode` unset: a flow on s3:// stages every batch, and its trainer's
    read commits them (a lone `auto` writer's commit is four sequential requests there,
    and many writers' own commits starve the trainer's); a local flow keeps `auto`, and
    a mode the flow names wins over both."""
    from astraflow.config.loader import parse_flow
    from tests.runs import check_staged_until_read, seeded_run, worker_flow

    uri = f"s3://{s3_env}/runs/staged-default"
    ctx = seeded_run(tmp_path / "s3run", {**worker_flow(), "store": {"uri": uri}},
                     tiny_policy_dir)
    assert ctx.write_mode == "staged"
    check_staged_until_read(ctx, "wS3")

    local = RunContext(parse_flow(worker_flow()), tmp_path / "local")
    assert local.write_mode == local.trajectories().write_mode == "auto"
    named = {**worker_flow(), "store": {"uri": uri, "write_mode": "auto"}}
    assert RunContext(parse_flow(named), tmp_path / "named").write_mode == "auto"
