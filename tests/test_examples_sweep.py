"""benchmarks/examples.py: each flow run with `astraflow run`, its summary read back.

A real run of the tiny math flow (a few steps), then `--resume`, which must read the
finished run and not run it again; and the verdict per policy (final against v0).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.examples import rows_of

ROOT = Path(__file__).resolve().parent.parent


def test_a_policy_holds_when_its_final_is_no_lower_than_version_0():
    summary = {"stop_reason": "max_minutes", "rl_seconds": 90.0, "policies": {
        p: {"metric": "accuracy", "heldout_items": 50, "accuracy_v0": 0.5,
            "final_version": 7, "accuracy_final": acc, "improvement_points": 100 * (acc - 0.5),
            "ledger": {"steps": 8}} for p, acc in (("solver", 0.5), ("verifier", 0.48))}}
    rows = {r["policy"]: r for r in rows_of(Path("f.yaml"), summary)}
    assert rows["solver"]["held"] and not rows["verifier"]["held"]
    assert rows["verifier"]["points"] == pytest.approx(-2.0) and rows["solver"]["rl_minutes"] == 1.5


@pytest.mark.slow
def test_the_sweep_runs_a_flow_and_resume_reads_it_back(tmp_path):
    cmd = [sys.executable, "benchmarks/examples.py", "--flows", "examples/math.yaml",
           "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out"),
           "--tag", "t", "--set", "stop.max_steps=3", "--set", "env.eval_size=20"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    summary = json.loads((tmp_path / "runs/examples-math-t/summary.json").read_text())
    [row] = json.loads((tmp_path / "out/results.json").read_text())
    assert row["steps"] == summary["ledger"]["steps"] == 3
    assert row["accuracy_v0"] == summary["accuracy_v0"]
    assert row["held"] == (summary["accuracy_final"] >= summary["accuracy_v0"])
    assert r.returncode == (0 if row["held"] else 1)
    assert (tmp_path / "out/examples-math-t.log").read_text().strip()
    again = subprocess.run([*cmd, "--resume"], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
    assert "reading the finished run" in again.stdout and ": running (" not in again.stdout
    assert json.loads((tmp_path / "out/results.json").read_text()) == [row]
