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
