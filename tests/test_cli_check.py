"""`astraflow check FLOW`: validate without running, print the resolved flow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from astraflow.cli.app import app
from astraflow.config.loader import load_flow, parse_flow

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.yaml"))


@pytest.mark.parametrize("flow", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_checks_and_prints_its_resolved_flow(flow):
    r = CliRunner().invoke(app, ["check", str(flow)])
    assert r.exit_code == 0, r.output
    printed = parse_flow(yaml.safe_load(r.stdout))  # the output is a flow, every default filled in
    assert printed == load_flow(flow)
    assert "stages:" in r.stdout and "algorithm:" in r.stdout


def test_overrides_are_applied():
    r = CliRunner().invoke(app, ["check", str(EXAMPLES[0]), "--set", "stop.max_steps=7",
                                 "--set", "rollout.temperature=0.5"])
    assert r.exit_code == 0, r.output
    data = yaml.safe_load(r.stdout)
    assert data["stop"]["max_steps"] == 7 and data["rollout"]["temperature"] == 0.5


def test_a_broken_flow_exits_2_naming_each_field_path(tmp_path):
    """Through the real command line: exit status 2, nothing on stdout, every field path."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: b\n"
                   "policies: [{name: solver, algorithm: {lr: -1}}]\n"
                   "rollout: {samples_per_prompt: 1}\n"
                   "stages: [{name: length_norm, params: {mdoe: sequence_mean}}]\n")
    r = subprocess.run([sys.executable, "-m", "astraflow", "check", str(bad)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    for path in ("policies.0.algorithm.lr", "rollout.samples_per_prompt", "stages.0"):
        assert path in r.stderr, r.stderr
    assert "'mdoe'" in r.stderr
    typo = CliRunner().invoke(app, ["check", str(EXAMPLES[0]), "--set", "stop.max_stepz=3"])
    assert typo.exit_code == 2 and "stop.max_stepz" in typo.output and "max_steps" in typo.output
    missing = CliRunner().invoke(app, ["check", str(tmp_path / "nope.yaml")])
    assert missing.exit_code == 2 and "no such flow file" in missing.output
