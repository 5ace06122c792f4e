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
             "stop": {**FLOW["stop"], "max_steps": 30, "max_minutes": 6}}


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


def wait_until(cond, timeout: float, what: str, run: Path | None = None) -> None:
    """Poll `cond`; on timeout fail with the tail of each of `run`'s component logs,
    so a CI failure says where the run stood, not only that it was late."""
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}" + log_tails(run))
        time.sleep(0.2)


def log_tails(run: Path | None, lines: int = 15) -> str:
    if run is None or not (run / "logs").is_dir():
        return ""
    out = []
    for log in sorted((run / "logs").glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        out.append(f"\n--- {log.name} (last {len(tail)} lines)\n" + "\n".join(tail))
    return "".join(out)


def start_run(tmp_path: Path, flow_dict: dict,
              env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
    """`astraflow run` of `flow_dict` in its own session; returns the launcher and run dir."""
    flow = tmp_path / f"{flow_dict['name']}.yaml"
    flow.write_text(yaml.safe_dump(flow_dict))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "astraflow", "run", str(flow), "--runs", str(tmp_path / "runs")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, **(env or {})})
    return launcher, tmp_path / "runs" / flow_dict["name"]


def paused_trainer(gate: Path, policy: str, step: int, timeout: float) -> int:
    """The pid of the trainer that stopped after `step` at the test hook (astraflow.testing)."""
    marker = gate / f"paused-{policy}-{step}"
    run = next(gate.parent.glob("runs/*"), None)
    wait_until(marker.exists, timeout, f"the {policy} trainer to pause after step {step}", run)
    return int(marker.read_text())


#: Trainer kills land where the test hook holds the trainer: after these steps, each
#: mid-interval (checkpoints follow steps 3, 7, 11, ...: every 4th), so each loses steps
#: the successor must roll back and train again -- exactly one rollback per kill.
TRAINER_KILLS = (6, 13, 21)


@pytest.mark.slow
def test_sigkill_trainer_and_workers_mid_run(tmp_path):
    assert all((s + 1) % KILL_FLOW["trainer"]["checkpoint_every"] for s in TRAINER_KILLS)
    gate = tmp_path / "gate"
    launcher, run = start_run(tmp_path, KILL_FLOW, {
        "ASTRAFLOW_TEST_PAUSE_AT_STEP": ",".join(map(str, TRAINER_KILLS)),
        "ASTRAFLOW_TEST_GATE": str(gate)})
    killed: list[str] = []
    try:
        for victim, at_step in [("trainer-solver", 6), ("rollout-w0", 10), ("trainer-solver", 13),
                                ("rollout-w1", 17), ("trainer-solver", 21)]:
            if victim == "trainer-solver":  # held at the hook: killed at exactly this step
                pid = paused_trainer(gate, "solver", at_step, 240)
                assert pid == pid_of(run, victim) and progress_step(run) == at_step
            else:
                wait_until(lambda s=at_step: progress_step(run) >= s, 240, f"step {at_step}")
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
    assert summary["restarts"] == {"trainer-solver": 3, "rollout-w0": 1, "rollout-w1": 1}
    audit = subprocess.run([sys.executable, "-m", "astraflow", "audit", str(run), "--json"],
                           capture_output=True, text=True, timeout=120)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    counts = json.loads(audit.stdout)["policies"]["solver"]
    assert counts["steps"] == 30 and counts["duplicate_rows"] == 0 and counts["violations"] == 0
    # Each kill voided the steps since the newest checkpoint: 6-4+1, 13-12+1, 21-20+1.
    assert counts["rollbacks"] == 3 and counts["voided_steps"] == 3 + 2 + 2
    assert counts["rows_up_to_final_cursor"] == (counts["rows_trained"] + counts["rows_dropped_stale"]
                                                 + counts["rows_dropped_filtered"])


def test_pause_hook_is_inert_and_pauses_once(tmp_path, monkeypatch):
    """The hook does nothing without its variables; with them it holds a step once."""
    import threading

    from astraflow import testing

    monkeypatch.delenv(testing.PAUSE_ENV, raising=False)
    testing.pause_at("solver", 6)  # returns at once
    monkeypatch.setenv(testing.PAUSE_ENV, "6")
    monkeypatch.setenv(testing.GATE_ENV, str(tmp_path))
    testing.pause_at("solver", 5)  # not a named step
    monkeypatch.setenv(testing.PAUSE_ENV, "verifier:6, 7")
    testing.pause_at("solver", 6)  # another policy's step
    assert not list(tmp_path.iterdir())
    monkeypatch.setenv(testing.PAUSE_ENV, "solver:6")
    t = threading.Thread(target=testing.pause_at, args=("solver", 6))
    t.start()
    wait_until((tmp_path / "paused-solver-6").exists, 30, "the pause")
    assert int((tmp_path / "paused-solver-6").read_text()) == os.getpid() and t.is_alive()
    (tmp_path / "release-solver-6").touch()
    t.join(10)
    assert not t.is_alive()
    testing.pause_at("solver", 6)  # the redone step after a restart: no second pause


@pytest.mark.slow
def test_sigkill_the_launcher_then_run_again(tmp_path):
    """The launcher is a component too: SIGKILL it mid-run. Its components notice and
    stop (no orphans left to race a second trainer); running the flow again resumes the
    run folder and finishes it with a clean audit."""
    flow_d = {**KILL_FLOW, "name": "relaunch", "stop": {**KILL_FLOW["stop"], "max_steps": 14}}
    flow = tmp_path / "relaunch.yaml"
    flow.write_text(yaml.safe_dump(flow_d))
    run = tmp_path / "runs" / "relaunch"
    argv = [sys.executable, "-m", "astraflow", "run", str(flow), "--runs", str(tmp_path / "runs")]
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        wait_until(lambda: progress_step(run) >= 4, 240, "step 4")
        pids = [pid_of(run, n) for n in ("trainer-solver", "rollout-w0", "rollout-w1")]
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
        assert stalled_at < 13
    finally:
        stop_run(first, run)
    second = subprocess.run(argv, capture_output=True, text=True, timeout=400)
    assert second.returncode == 0, second.stdout + second.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "max_steps" and summary["ledger"]["steps"] == 14
    audit = subprocess.run([sys.executable, "-m", "astraflow", "audit", str(run), "--json"],
                           capture_output=True, text=True, timeout=120)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    counts = json.loads(audit.stdout)["policies"]["solver"]
    assert counts["steps"] == 14 and counts["duplicate_rows"] == 0 and counts["violations"] == 0
