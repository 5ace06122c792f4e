"""Cross-region weight replicas against two real S3-protocol servers on 127.0.0.1.

Server A holds the run's store (trajectories, ledger, main weights); server B
stands for another region or cloud and holds a weight replica, reached through
its own endpoint and its own `EU_AWS_*` keys. Both are moto processes started
and stopped here by pid.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from astraflow.config.loader import FlowError, parse_flow
from astraflow.context import RunContext, publish_flow, replica_store
from astraflow.stores import TamperedWeights, TrajectoryStore, WeightStore, check_ledger
from astraflow.stores.mirror import Mirror, sync_replica
from astraflow.stores.uri import S3Settings, redact
from tests.s3server import TEST_ACCESS_KEY_ID, TEST_SECRET_KEY, MotoServer
from tests.test_integration import FLOW

EU_SECRET = "eu-secret-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[tuple[MotoServer, MotoServer]]:
    a = MotoServer(tmp_path_factory.mktemp("moto-a")).start()
    try:
        b = MotoServer(tmp_path_factory.mktemp("moto-b")).start()
        try:
            yield a, b
        finally:
            b.stop()
    finally:
        a.stop()


@pytest.fixture
def two_stores(servers, monkeypatch, tmp_path):
    """Main store env on A; `EU_` keys and a fresh bucket for the replica on B."""
    a, b = servers
    for k, v in a.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("EU_AWS_ACCESS_KEY_ID", TEST_ACCESS_KEY_ID)
    monkeypatch.setenv("EU_AWS_SECRET_ACCESS_KEY", EU_SECRET)
    monkeypatch.setenv("ASTRAFLOW_CACHE", str(tmp_path / "cache"))
    bucket_a = a.create_bucket(f"main-{uuid.uuid4().hex[:10]}")
    bucket_b = b.create_bucket(f"eu-{uuid.uuid4().hex[:10]}")
    src = WeightStore(f"s3://{bucket_a}/run/weights", retry_budget_s=10)
    dst = WeightStore(f"s3://{bucket_b}/weights", retry_budget_s=10,
                      settings=S3Settings.from_env("EU_", endpoint=b.endpoint))
    return src, dst, bucket_a, bucket_b


def publish_n(ws: WeightStore, policy_dir: Path, n: int, tmp_path: Path) -> None:
    for i in range(n):
        staged = tmp_path / f"stage{i}"
        shutil.copytree(policy_dir, staged)
        (staged / "note.txt").write_text(f"version {i}")  # distinct bytes per version
        ws.publish("solver", staged, step=10 * i)


def test_replica_gets_the_newest_versions_verified(two_stores, tiny_policy_dir, tmp_path):
    src, dst, _, _ = two_stores
    publish_n(src, tiny_policy_dir, 6, tmp_path)
    assert sync_replica(src, dst, "solver", keep_last=2) == [5, 4, 0]
    assert dst.versions("solver") == [0, 4, 5]
    for v in (0, 4, 5):
        a, b = src.manifest("solver", v), dst.manifest("solver", v)
        assert (a.files, a.step, a.parent, a.time) == (b.files, b.step, b.parent, b.time)
        assert (dst.load("solver", v, refresh=True) / "note.txt").read_text() == f"version {v}"
    # the replica is on another endpoint: A does not hold its bucket
    assert not WeightStore(dst.objects.uri, retry_budget_s=2).objects.exists("solver")
    publish_n(src, tiny_policy_dir, 1, tmp_path / "more")  # v6
    assert sync_replica(src, dst, "solver", keep_last=2) == [6]
    assert dst.versions("solver") == [0, 5, 6]  # v4 pruned on the replica too
    assert sync_replica(src, dst, "solver", keep_last=2) == []


def test_a_half_copied_version_stays_invisible_until_finished(two_stores, tiny_policy_dir,
                                                                tmp_path):
    src, dst, _, _ = two_stores
    publish_n(src, tiny_policy_dir, 2, tmp_path)
    # A mirror killed mid-copy: some files of v1 uploaded, no manifest.
    d1 = src.load("solver", 1)
    dst.objects.put_file(d1 / "config.json", "solver/v00000001/config.json")
    assert dst.versions("solver") == []
    assert sync_replica(src, dst, "solver", keep_last=4) == [1, 0]
    assert dst.versions("solver") == [0, 1]
    dst.load("solver", 1, refresh=True)


def test_tampered_source_is_not_mirrored(two_stores, tiny_policy_dir, tmp_path):
    _, dst, _, _ = two_stores
    src = WeightStore(tmp_path / "local-weights")
    publish_n(src, tiny_policy_dir, 1, tmp_path)
    f = src.dir("solver", 0) / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match="sha256") as err:
        sync_replica(src, dst, "solver", keep_last=2)
    assert isinstance(err.value.__cause__, TamperedWeights)
    assert dst.versions("solver") == []
    with pytest.raises(TamperedWeights):  # and the mirror's own guard, directly
        dst.publish("solver", src.dir("solver", 0), step=0, version=0, keep_src=True,
                    expect=src.manifest("solver", 0))


def test_mirror_thread_catches_up_and_survives_an_unreachable_replica(two_stores, tiny_policy_dir,
                                                                       tmp_path):
    src, dst, _, _ = two_stores
    publish_n(src, tiny_policy_dir, 2, tmp_path)
    dead = WeightStore("s3://nowhere/w", retry_budget_s=1,
                       settings=S3Settings.from_env("EU_", endpoint="http://127.0.0.1:9"))
    m = Mirror(src, [("gone", dead), ("eu", dst)], "solver", keep_last=4).start()
    m.stop()
    assert dst.versions("solver") == [0, 1]  # caught up on start despite the dead replica
    assert m.errors == 1


def test_replica_keys_come_from_a_prefixed_env_and_are_redacted(two_stores, servers):
    _, b = servers
    s = S3Settings.from_env("EU_", endpoint=b.endpoint)
    assert (s.endpoint, s.access_key, s.secret_key) == (b.endpoint, TEST_ACCESS_KEY_ID, EU_SECRET)
    assert EU_SECRET not in repr(s)
    assert redact(f"boom {EU_SECRET} {TEST_SECRET_KEY}") == "boom *** ***"


@pytest.mark.parametrize("replica, needle", [
    ({"region": "eu", "weights": "s3://b/w?secret=x"}, "credentials do not belong"),
    ({"region": "eu", "weights": "s3://b/w", "endpoint": "ftp://x"}, "http(s)://"),
    ({"region": "eu", "weights": "s3://b/w", "endpoint": "http://k:s@x"}, "credentials_env"),
    ({"region": "eu", "weights": "s3://b/w", "credentials_env": "eu lower"}, "credentials_env"),
    ({"region": "e u", "weights": "s3://b/w"}, "region"),
])
def test_bad_replica_specs_are_refused(replica, needle):
    with pytest.raises(FlowError, match="store.replicas") as err:
        parse_flow({**FLOW, "store": {"replicas": [replica]}})
    assert needle in str(err.value) or "pattern" in str(err.value)
    assert "secret=x" not in str(err.value) and "k:s@" not in str(err.value)


def test_two_replicas_in_one_region_are_refused():
    r = {"region": "eu", "weights": "s3://b/w"}
    with pytest.raises(FlowError, match="same region"):
        parse_flow({**FLOW, "store": {"replicas": [r, {**r, "weights": "s3://c/w"}]}})


def test_a_run_is_opened_by_its_store_uri(two_stores, tmp_path):
    _, _, bucket_a, _ = two_stores
    uri = f"s3://{bucket_a}/run"
    with pytest.raises(FlowError, match="publish the run"):
        RunContext.open(uri, runs_root=tmp_path)
    flow = parse_flow({**FLOW, "store": {"uri": uri}})
    assert publish_flow(flow) == uri
    ctx = RunContext.open(uri + "/", runs_root=tmp_path)
    assert ctx.flow == flow and ctx.run_dir == tmp_path / "it" and ctx.run_dir.is_dir()
    assert publish_flow(flow) == uri  # the same flow again is fine
    other = parse_flow({**FLOW, "store": {"uri": uri}, "seed": 7})
    with pytest.raises(FlowError, match="different flow"):
        publish_flow(other)
    publish_flow(other, overwrite=True)
    assert RunContext.open(uri, runs_root=tmp_path).flow.seed == 7
    with pytest.raises(FlowError, match="shared store"):
        publish_flow(parse_flow(FLOW))


@pytest.mark.slow
def test_cloud_style_run_with_a_worker_reading_a_replica(two_stores, servers, tmp_path):
    """What `sky`/Modal start, on one machine: components that share only the bucket.

    `astraflow train s3://…` makes version 0 itself and mirrors every version to
    the replica on server B; `astraflow rollout s3://… --region eu` reads its
    weights from B only. The ledger must stay consistent and the worker must
    have followed newer versions through the replica.
    """
    a, b = servers
    _, dst, bucket_a, bucket_b = two_stores
    uri = f"s3://{bucket_a}/run"
    flow = parse_flow({
        **FLOW, "rollout": {**FLOW["rollout"], "workers": 1},
        "stop": {**FLOW["stop"], "max_steps": 6},
        "store": {"uri": uri, "retry_budget_s": 30, "replicas": [{
            "region": "eu", "weights": f"s3://{bucket_b}/weights", "endpoint": b.endpoint,
            "credentials_env": "EU_"}]},
    })
    publish_flow(flow)
    env = {**os.environ, "ASTRAFLOW_THREADS": "1"}
    cmd = [sys.executable, "-m", "astraflow"]
    logs = tmp_path / "logs"
    logs.mkdir()
    procs = {
        "train": subprocess.Popen([*cmd, "train", uri], cwd=tmp_path, env=env,
                                  stdout=(logs / "train.log").open("w"), stderr=subprocess.STDOUT),
        "rollout": subprocess.Popen([*cmd, "rollout", uri, "--worker-id", "eu0", "--region", "eu",
                                     "--minutes", "5"], cwd=tmp_path, env=env,
                                    stdout=(logs / "rollout.log").open("w"),
                                    stderr=subprocess.STDOUT),
    }
    try:
        rc = procs["train"].wait(timeout=300)
        assert rc == 0, (logs / "train.log").read_text()[-3000:]
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.kill(p.pid, signal.SIGKILL)
                    p.wait()
    assert procs["rollout"].returncode == 0, (logs / "rollout.log").read_text()[-3000:]
    st = subprocess.run([*cmd, "status", uri, "--json"], cwd=tmp_path, env=env, capture_output=True,
                        text=True, timeout=120)
    assert st.returncode == 0 and json.loads(st.stdout)["steps"] == 6, st.stdout + st.stderr
    ctx = RunContext.open(uri, runs_root=tmp_path / "check")
    main = ctx.weights()
    replica = replica_store(ctx.flow.store.replicas[0], 10)
    assert main.latest("solver") >= 3  # 6 steps, publish_every 2
    assert replica.latest("solver") == main.latest("solver")  # the trainer waited for its mirror
    assert EU_SECRET not in (logs / "train.log").read_text() + (logs / "rollout.log").read_text()
    entries = ctx.ledger().entries("solver")
    assert [e.step for e in entries] == list(range(6)) and check_ledger(entries) == []
    rows = TrajectoryStore(uri).read_range(
        "solver", 0, 1 << 40, columns=["worker", "region", "behavior_version"]).to_pylist()
    assert {r["worker"] for r in rows} == {"eu0"} and {r["region"] for r in rows} == {"eu"}
    assert max(r["behavior_version"] for r in rows) >= 1  # it followed the replica forward
    # ...and it read those versions from B: only the worker downloads from the replica
    # (the trainer's mirror reads A and uploads to B), into B's own cache folder.
    from_b = [v for v in range(1, main.latest("solver") + 1)
              if (replica.dir("solver", v) / "model.safetensors").is_file()]
    assert from_b, "the eu worker never loaded a version from its replica"


def test_download_cache_keeps_only_recent_versions(two_stores, tiny_policy_dir, tmp_path):
    src, _, _, _ = two_stores
    publish_n(src, tiny_policy_dir, 8, tmp_path)
    reader = WeightStore(src.objects.uri, retry_budget_s=10)
    for v in range(8):
        reader.load("solver", v)
    cached = sorted(p.name for p in reader.dir("solver", 7).parent.iterdir())
    assert cached == [f"v{v:08d}" for v in (0, 4, 5, 6, 7)]
    reader.load("solver", 2)  # an old version can still be fetched again
    assert (reader.dir("solver", 2) / "note.txt").read_text() == "version 2"
