"""Flow-spec errors: a bad file fails before anything starts and says how to fix it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from astraflow.config.loader import FlowError, load_flow

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "math.yaml"


def write(tmp_path, data) -> Path:
    p = tmp_path / "flow.yaml"
    p.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return p


def base() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def test_example_is_valid():
    spec = load_flow(EXAMPLE)
    assert spec.policy.name == "solver" and spec.batch_rows() == 256


@pytest.mark.parametrize("path", sorted(EXAMPLE.parent.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_is_valid(path):
    spec = load_flow(path)
    assert spec.policy_names() and all(spec.batch_rows(p) > 0 for p in spec.policy_names())


def test_two_policy_example_casts_both_roles():
    spec = load_flow(EXAMPLE.parent / "math-solver-verifier.yaml")
    assert spec.role_map() == {"solver": "solver", "verifier": "verifier"}
    assert spec.policy_spec("verifier").warm_start.init_from == "solver"


def test_typo_names_the_field_and_suggests(tmp_path):
    d = base()
    d["policies"][0]["algorithm"]["lerning_rate"] = 1e-4
    with pytest.raises(FlowError) as e:
        load_flow(write(tmp_path, d))
    msg = str(e.value)
    assert "policies.0.algorithm.lerning_rate" in msg
    assert "unknown field" in msg


def test_wrong_value_names_the_path(tmp_path):
    d = base()
    d["rollout"]["samples_per_prompt"] = 1
    with pytest.raises(FlowError, match=r"rollout\.samples_per_prompt.*greater than or equal to 2"):
        load_flow(write(tmp_path, d))


def test_missing_required(tmp_path):
    d = base()
    del d["policies"]
    with pytest.raises(FlowError, match="policies: required field is missing"):
        load_flow(write(tmp_path, d))


def test_model_shape_hint(tmp_path):
    d = base()
    d["policies"][0]["model"]["hidden_size"] = 100
    d["policies"][0]["model"]["heads"] = 3
    with pytest.raises(FlowError, match="divisible by heads"):
        load_flow(write(tmp_path, d))


def test_unknown_stage(tmp_path):
    d = base()
    d["stages"] = [{"name": "grpo"}]
    with pytest.raises(FlowError, match="unknown stage 'grpo'"):
        load_flow(write(tmp_path, d))


def test_not_yaml_and_missing_file(tmp_path):
    with pytest.raises(FlowError, match="not valid YAML"):
        load_flow(write(tmp_path, "name: [unclosed"))
    with pytest.raises(FlowError, match="no such flow file"):
        load_flow(tmp_path / "nope.yaml")
    with pytest.raises(FlowError, match="YAML mapping"):
        load_flow(write(tmp_path, "- a\n- b\n"))


def test_overrides(tmp_path):
    spec = load_flow(EXAMPLE, {"stop.max_steps": 7, "mode": "sync"})
    assert spec.stop.max_steps == 7 and spec.mode == "sync"


def test_cli_refuses_bad_flow_and_starts_nothing(tmp_path):
    d = base()
    d["rollout"]["workers"] = 0
    p = write(tmp_path, d)
    r = subprocess.run([sys.executable, "-m", "astraflow", "run", str(p), "--runs",
                        str(tmp_path / "runs")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "rollout.workers" in r.stderr
    assert not (tmp_path / "runs").exists()


def test_pretrained_policies_bound_each_update_unless_told_otherwise():
    """`hf` policies get algorithm.max_update_kl (and no warm start) where the flow left
    them unset; a flow's own value, `null` included, wins; tiny policies get neither."""
    from astraflow.config.flow import HF_MAX_UPDATE_KL

    hf = load_flow(EXAMPLE.with_name("smollm2-math.yaml")).policies[0]
    assert hf.algorithm.max_update_kl == HF_MAX_UPDATE_KL and hf.warm_start.max_steps == 0
    off = load_flow(EXAMPLE.with_name("smollm2-math.yaml"),
                    {"policies.0.algorithm.max_update_kl": None}).policies[0]
    assert off.algorithm.max_update_kl is None
    own = load_flow(EXAMPLE.with_name("smollm2-math.yaml"),
                    {"policies.0.algorithm.max_update_kl": 0.1}).policies[0]
    assert own.algorithm.max_update_kl == 0.1
    tiny = load_flow(EXAMPLE).policies[0]
    assert tiny.algorithm.max_update_kl is None and tiny.warm_start.max_steps > 0


def test_pretrained_policies_decay_over_the_budget_with_an_entropy_floor():
    """`hf` policies decay their rate over the run's budget and keep an entropy floor, a
    share of version 0's entropy, unless the flow sets a floor of its own (`null`: none);
    tiny policies keep a constant rate and no floor."""
    from astraflow.config.flow import HF_ENTROPY_FLOOR_OF_V0

    math = EXAMPLE.with_name("smollm2-math.yaml")
    hf = load_flow(math).policies[0].algorithm
    assert (hf.lr_schedule, hf.lr_decay_steps, hf.entropy_floor, hf.entropy_floor_of_v0) == (
        "cosine", None, None, HF_ENTROPY_FLOOR_OF_V0)
    own = load_flow(math, {"policies.0.algorithm.lr_schedule": "constant",
                           "policies.0.algorithm.entropy_floor": None}).policies[0].algorithm
    assert (own.lr_schedule, own.entropy_floor, own.entropy_floor_of_v0) == ("constant", None, None)
    fixed = load_flow(math, {"policies.0.algorithm.entropy_floor": 0.3}).policies[0].algorithm
    assert (fixed.entropy_floor, fixed.entropy_floor_of_v0) == (0.3, None)
    share = load_flow(math, {"policies.0.algorithm.entropy_floor_of_v0": 0.5}).policies[0].algorithm
    assert (share.entropy_floor, share.entropy_floor_of_v0) == (None, 0.5)
    with pytest.raises(ValueError, match="not both"):
        load_flow(math, {"policies.0.algorithm.entropy_floor": 0.3,
                         "policies.0.algorithm.entropy_floor_of_v0": 0.5})
    tiny = load_flow(EXAMPLE).policies[0].algorithm
    assert (tiny.lr_schedule, tiny.entropy_floor, tiny.entropy_floor_of_v0) == ("constant", None, None)
