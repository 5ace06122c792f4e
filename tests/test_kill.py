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


def start_run(tmp_path: Path, flow_dict: dict) -> tuple[subprocess.Popen, Path]:
    """`astraflow run` of `flow_dict` in its own session; returns the launcher and run dir."""
    flow = tmp_path / f"{flow_dict['name']}.yaml"
    flow.write_text(yaml.safe_dump(flow_dict))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "astraflow.cli", "run", str(flow), "--runs", str(tmp_path / "runs")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return launcher, tmp_path / "runs" / flow_dict["name"]


@pytest.mark.slow
def test_sigkill_trainer_and_workers_mid_run(tmp_path):
    launcher, run = start_run(tmp_path, KILL_FLOW)
    killed: list[str] = []
    try:
        for victim, at_step in [("trainer-solver", 6), ("rollout-0", 15), ("trainer-solver", 25),
                                ("rollout-1", 35), ("trainer-solver", 45)]:
            # Trainer kills land mid-interval (checkpoints follow every 4th step), so
            # they lose steps the successor must roll back and train again.
            wait_until(lambda s=at_step, v=victim: progress_step(run) >= s and (
                v != "trainer-solver" or progress_step(run) % 4 in (0, 1)), 240, f"step {at_step}")
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
    assert summary["restarts"] == {"trainer-solver": 3, "rollout-0": 1, "rollout-1": 1}
    audit = subprocess.run([sys.executable, "-m", "astraflow.cli", "audit", str(run), "--json"],
                           capture_output=True, text=True, timeout=120)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    counts = json.loads(audit.stdout)["solver"]
    assert counts["steps"] == 70 and counts["duplicate_rows"] == 0 and counts["violations"] == 0
    assert counts["rollbacks"] == 3 and counts["voided_steps"] >= 3
    assert counts["rows_up_to_final_cursor"] == (counts["rows_trained"] + counts["rows_dropped_stale"]
                                                 + counts["rows_dropped_filtered"])


@pytest.mark.slow
def test_sigkill_the_launcher_then_run_again(tmp_path):
    """The launcher is a component too: SIGKILL it mid-run. Its components notice and
    stop (no orphans left to race a second trainer); running the flow again resumes the
    run folder and finishes it with a clean audit."""
    flow_d = {**KILL_FLOW, "name": "relaunch", "stop": {**KILL_FLOW["stop"], "max_steps": 40}}
    flow = tmp_path / "relaunch.yaml"
    flow.write_text(yaml.safe_dump(flow_d))
    run = tmp_path / "runs" / "relaunch"
    argv = [sys.executable, "-m", "astraflow.cli", "run", str(flow), "--runs", str(tmp_path / "runs")]
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        wait_until(lambda: progress_step(run) >= 10, 240, "step 10")
        pids = [pid_of(run, n) for n in ("trainer-solver", "rollout-0", "rollout-1")]
        assert all(pids)
        os.killpg(first.pid, signal.SIGKILL)  # the launcher alone: components have their own sessions
        first.wait()

        def gone() -> bool:
            alive = []
            for p in pids:
                try:
                    os.kill(p, 0)
                    alive.append(p)
                except ProcessLookupError:
                    pass
            return not alive

        wait_until(gone, 30, "the orphaned components to stop by themselves")
        stalled_at = progress_step(run)
        assert stalled_at < 39
    finally:
        stop_run(first, run)
    second = subprocess.run(argv, capture_output=True, text=True, timeout=400)
    assert second.returncode == 0, second.stdout + second.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "max_steps" and summary["ledger"]["steps"] == 40
    audit = subprocess.run([sys.executable, "-m", "astraflow.cli", "audit", str(run), "--json"],
                           capture_output=True, text=True, timeout=120)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    counts = json.loads(audit.stdout)["solver"]
    assert counts["steps"] == 40 and counts["duplicate_rows"] == 0 and counts["violations"] == 0
