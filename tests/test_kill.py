"""SIGKILL the trainer and the rollout workers of a real run; the audit must stay clean."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.test_integration import FLOW

KILL_FLOW = {**FLOW, "name": "kill",
             "trainer": {"checkpoint_every": 4},
             "stop": {**FLOW["stop"], "max_steps": 70, "max_minutes": 6}}


def progress_step(run: Path) -> int:
    try:
        return json.loads((run / "store" / "_progress" / "solver.json").read_text())["step"]
    except (FileNotFoundError, json.JSONDecodeError):
        return -1


def pid_of(run: Path, name: str) -> int | None:
    try:
        return json.loads((run / "components.json").read_text())[name]["pid"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return None


def stop_run(launcher: subprocess.Popen, run: Path) -> None:
    """Kill a launcher that is still running and every component it started, by pid."""
    if launcher.poll() is None:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
    try:
        state = json.loads((run / "components.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return
    for c in state.values():
        if c["pid"] is not None:
            try:
                os.killpg(c["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass


def wait_until(cond, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.mark.slow
def test_sigkill_trainer_and_workers_mid_run(tmp_path):
    flow = tmp_path / "kill.yaml"
    flow.write_text(yaml.safe_dump(KILL_FLOW))
    run = tmp_path / "runs" / "kill"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "astraflow.cli", "run", str(flow), "--runs", str(tmp_path / "runs")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    killed: list[str] = []
    try:
        for victim, at_step in [("trainer", 6), ("rollout-0", 15), ("trainer", 25),
                                ("rollout-1", 35), ("trainer", 45)]:
            # Trainer kills land mid-interval (checkpoints follow every 4th step), so
            # they lose steps the successor must roll back and train again.
            wait_until(lambda s=at_step, v=victim: progress_step(run) >= s and (
                v != "trainer" or progress_step(run) % 4 in (0, 1)), 240, f"step {at_step}")
            pid = pid_of(run, victim)
            assert pid is not None, f"{victim} has no live pid"
            os.kill(pid, signal.SIGKILL)
            killed.append(victim)
            wait_until(lambda v=victim, p=pid: pid_of(run, v) not in (None, p), 60,
                       f"{victim} restarted")
        out, _ = launcher.communicate(timeout=400)
    finally:
        stop_run(launcher, run)
    assert launcher.returncode == 0, out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "max_steps"
    assert summary["restarts"] == {"trainer": 3, "rollout-0": 1, "rollout-1": 1}
    audit = subprocess.run([sys.executable, "-m", "astraflow.cli", "audit", str(run), "--json"],
                           capture_output=True, text=True, timeout=120)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    counts = json.loads(audit.stdout)["solver"]
    assert counts["steps"] == 70 and counts["duplicate_rows"] == 0 and counts["violations"] == 0
    assert counts["rollbacks"] == 3 and counts["voided_steps"] >= 3
    assert counts["rows_up_to_final_cursor"] == (counts["rows_trained"] + counts["rows_dropped_stale"]
                                                 + counts["rows_dropped_filtered"])
