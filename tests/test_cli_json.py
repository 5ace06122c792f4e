"""Every command's `--json` output against its documented schema (astraflow/cli/schemas.py).

One seeded run (weights, rows, metrics as the components would leave them) serves all
of them; the commands run through the real CLI entry point."""

from __future__ import annotations

import json

import jsonschema
import pytest
from typer.testing import CliRunner

from astraflow.cli.app import app
from astraflow.cli.schemas import AUDIT, EPISODE, EVAL, STATUS
from astraflow.config.loader import parse_flow
from astraflow.context import RESOLVED, RunContext
from tests.test_integration import FLOW
from tests.test_observe import seed

runner = CliRunner()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from astraflow.models.factory import save_policy, tiny_llama
    from astraflow.models.tokenizer import build_char_tokenizer

    tiny_policy_dir = tmp_path_factory.mktemp("policy")
    save_policy(tiny_llama(hidden_size=64, layers=2, heads=2, intermediate_size=128),
                build_char_tokenizer(), tiny_policy_dir)
    spec = parse_flow({**FLOW, "name": "jsonshape", "env": {**FLOW.get("env", {}),
                                                              "eval_size": 20}})
    run = tmp_path_factory.mktemp("runs") / "jsonshape"
    run.mkdir()
    (run / RESOLVED).write_text(spec.dump())
    seed(RunContext(spec, run), tiny_policy_dir)
    return str(run)


def _json(args: list[str]):
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return res.stdout


def test_status_json(run_dir):
    jsonschema.validate(json.loads(_json(["status", run_dir, "--json"])), STATUS)


def test_eval_json(run_dir):
    doc = json.loads(_json(["eval", run_dir, "--json", "--version", "1"]))
    jsonschema.validate(doc, EVAL)
    assert doc["policies"]["solver"]["version"] == 1 and doc["policies"]["solver"]["tasks"] == 20


def test_eval_of_a_version_that_does_not_exist_is_one_line_and_exit_2(run_dir):
    res = runner.invoke(app, ["eval", run_dir, "--version", "99"])
    assert res.exit_code == 2 and "no weight version 99 of solver" in res.output


def test_audit_json(run_dir):
    doc = json.loads(_json(["audit", run_dir, "--json"]))
    jsonschema.validate(doc, AUDIT)
    assert doc["ok"] is True and doc["policies"]["solver"]["steps"] == 0


def test_inspect_json_lines(run_dir):
    lines = _json(["inspect", run_dir, "--limit", "3", "--json"]).splitlines()
    assert len(lines) == 3
    for line in lines:
        jsonschema.validate(json.loads(line), EPISODE)


def test_a_schema_rejects_a_changed_shape():
    """The schemas can fail: yesterday's `{policy: counts}` audit shape is refused."""
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"solver": {"steps": 1}}, AUDIT)


def test_eval_survives_the_newest_version_being_pruned_while_it_starts(run_dir, monkeypatch):
    """A live run prunes old versions: one listed a moment ago may be gone when the
    evaluator loads it. The evaluator builds on version 0, which prune always keeps."""
    from astraflow.local.evaluate import Evaluator
    from astraflow.stores import WeightStore

    listed = WeightStore.versions
    monkeypatch.setattr(WeightStore, "versions", lambda self, p: [*listed(self, p), 999])
    ev = Evaluator(RunContext.open(run_dir))
    assert 0.0 <= ev(1) <= 1.0
