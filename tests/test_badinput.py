"""Bad input is refused loudly, names what is wrong, and leaves nothing lost or corrupted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from astraflow.stores import CheckpointError, CheckpointStore, SchemaMismatch, TrajectoryStore
from astraflow.stores.uri import redact
from tests.test_integration import FLOW
from tests.test_stores import make_rows

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"


def run_flow(tmp_path, flow: dict) -> subprocess.CompletedProcess:
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(flow))
    return subprocess.run([sys.executable, "-m", "astraflow", "run", str(p), "--runs",
                           str(tmp_path / "runs")], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("uri,expect", [
    (f"s3://AKIAEXAMPLE:{SECRET}@bucket/run", "environment"),
    (f"s3://bucket/run?secret={SECRET}", "environment"),
    ("gs://bucket/run", "not supported"),
    ("s3:///no-bucket", "names no bucket"),
])
def test_bad_store_uri_refused_without_echoing_it(tmp_path, uri, expect):
    r = run_flow(tmp_path, {**FLOW, "store": {"uri": uri}})
    assert r.returncode == 2
    assert "store.uri" in r.stderr and expect in r.stderr
    assert SECRET not in r.stdout + r.stderr
    assert not (tmp_path / "runs").exists()  # nothing started, nothing written


def test_malformed_yaml_names_the_problem(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("name: x\npolicies: [\n  - {name: a\n")
    r = subprocess.run([sys.executable, "-m", "astraflow", "run", str(p), "--runs",
                        str(tmp_path / "runs")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not valid YAML" in r.stderr and "line" in r.stderr
    assert not (tmp_path / "runs").exists()


def test_wrong_schema_refused_and_table_untouched(tmp_path):
    store = TrajectoryStore(tmp_path / "s")
    good = make_rows("p", 4)
    v = store.append("p", good)
    bad = make_rows("p", 4)
    bad[2]["completion_ids"] = ["seven", "two"]
    with pytest.raises(SchemaMismatch, match="'completion_ids'"):
        store.append("p", bad)
    extra = make_rows("p", 2)
    extra[0]["secret_column"] = 1
    with pytest.raises(SchemaMismatch, match="secret_column"):
        store.append("p", extra)
    assert store.latest_version("p") == v  # no commit was made
    back = store.read_range("p", 0, v, columns=["traj_id", "reward"])
    assert sorted(back.column("traj_id").to_pylist()) == sorted(r["traj_id"] for r in good)


def test_checkpoints_never_hold_or_load_pickle(tmp_path):
    cs = CheckpointStore(tmp_path / "c")
    with pytest.raises(CheckpointError, match="only .safetensors"):
        cs.save("p", 1, {"optimizer.pt": b"\x80\x04pickle"}, {})
    cs.save("p", 2, {"state.safetensors": b"ok"}, {"steps_done": 2})
    # Someone swaps a pickle into a complete checkpoint's manifest.
    man_path = tmp_path / "c" / "p" / "c00000002" / "CHECKPOINT.json"
    man = json.loads(man_path.read_text())
    man["files"]["optimizer.pt"] = {"size": 8, "sha256": "0" * 64}
    man_path.write_text(json.dumps(man))
    (man_path.parent / "optimizer.pt").write_bytes(b"\x80\x04pickle")
    with pytest.raises(CheckpointError, match="refusing 'optimizer.pt'"):
        cs.load("p", 2)
    assert cs.latest("p") is None  # the damaged one is skipped, never unpickled


def test_redact_scrubs_credentials(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    text = (f"GET https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIAEXAMPLE%2F2026&"
            f"X-Amz-Signature=abc123 failed: bad key {SECRET}; Authorization: AWS4-HMAC-SHA256 Cred")
    out = redact(text)
    assert SECRET not in out and "AKIAEXAMPLE" not in out and "abc123" not in out
    assert "failed: bad key ***" in out
