"""The local supervisor: a failing component is retried with backoff, then the run stops."""

from __future__ import annotations

import json
import time

import pytest

from astraflow.local.supervise import Component, Supervisor


def test_crash_loop_backs_off_then_stops_the_run(tmp_path):
    bad = Component("bad", ["rollout", str(tmp_path / "not-a-run")], 1, tmp_path / "bad.log")
    sup = Supervisor([bad], max_quick_crashes=2, state_path=tmp_path / "components.json")
    sup.start_all()
    t0 = time.time()
    with pytest.raises(RuntimeError, match=r"bad exited with code 2 .*3 crashes in a row"):
        while time.time() - t0 < 60:
            sup.check()
            time.sleep(0.05)
    assert bad.restarts == 2 and bad.exit_codes == [2, 2, 2]
    assert time.time() - t0 >= 1.5  # waited 0.5 s, then 1 s, between tries
    state = json.loads((tmp_path / "components.json").read_text())
    assert state["bad"]["restarts"] == 2 and state["bad"]["exit_codes"][-1] == 2
    assert "not a run folder" in bad.log_path.read_text()


def test_components_wait_passively_unless_the_user_chose(tmp_path, monkeypatch):
    """OpenMP threads of local components sleep at barriers instead of spinning on cores
    the other components need; libgomp reads the policy when torch loads, so the zygote
    (whose forks inherit its OpenMP state) must start with it in its environment."""
    from astraflow.local.supervise import Zygote

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert Component("c", ["x"], 2, tmp_path / "c.log").env()["OMP_WAIT_POLICY"] == "PASSIVE"
    z = Zygote(tmp_path / "zygote.log", str(tmp_path))
    try:
        environ = f"/proc/{z.proc.pid}/environ"
        assert b"OMP_WAIT_POLICY=PASSIVE\0" in open(environ, "rb").read()
    finally:
        z.stop()
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert Component("c", ["x"], 2, tmp_path / "c.log").env()["OMP_WAIT_POLICY"] == "ACTIVE"
