"""The `verifiers` env, against verifiers 0.4 itself. verifiers cannot share the main
env with `launch` (uvicorn pins), so it lives in `.venv-verifiers`
(scripts/setup-verifiers-env.sh, run by scripts/setup-test-env.sh): the verifiers side
(a rollout worker, a scripted episode) runs as a subprocess of that venv's python on a
run folder this process seeded, and this process's trainer trains on the rows it wrote.
The environment is examples/verifiers_arith.py, loaded by module through
`vf.load_environment`: its tasks, its calculator toolset, its rubric.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runs import seeded_run

ROOT = Path(__file__).resolve().parent.parent
VENV_PY = ROOT / ".venv-verifiers" / "bin" / "python"
needs_venv = pytest.mark.skipif(
    not VENV_PY.exists(), reason="no .venv-verifiers (verifiers needs its own venv): run "
    "bash scripts/setup-verifiers-env.sh (scripts/setup-test-env.sh runs it)")
PARAMS = {"taskset": "verifiers_arith", "import_path": "examples"}

SIDE = r'''
import json, sys
from astraflow.context import RunContext
from astraflow.models.tokenizer import CharCodec
from astraflow.rollout.generation import Generation
from astraflow.rollout.worker import RolloutWorker
from astraflow.workflows.tool_agent import ToolAgent

ctx = RunContext.open(sys.argv[1])
w = RolloutWorker(ctx, "wV")
assert w.refresh_weights()
rows = w.produce_batch()

# A scripted model on the same env: a calculator call, then the answer.
env, codec = w.workflow.env, CharCodec.default("ascii")
wf = ToolAgent(env, codec, samples_per_prompt=1)
task = env.eval_tasks(1)[0]
a, b = [int(x) for x in task.prompt.split() if x.isdigit()]

def generate(prompts, samples, max_new):
    text = codec.decode(prompts[0])
    if "<tool>" not in text:
        turn = 'sum: <tool_call>{"name": "add", "arguments": {"a": %d, "b": %d}}</tool_call>' % (a, b)
    else:
        turn = text.rsplit("<tool>", 1)[1].split("</tool>")[0]
    ids = codec.encode(turn)[1:]
    return Generation([ids], [[-0.1] * len(ids)], ["stop"])

ep = wf.play([task], 1, generate, 200)[0]
print(json.dumps({"rows": rows, "finish": ep.finish, "reward": ep.reward, "turns": ep.turns,
                  "info": ep.info, "answer": task.answer, "context": codec.decode(ep.context()),
                  "read": [lp is None for _, lp in ep.segments]}))
'''


def test_without_the_extra_the_error_names_it():
    if importlib.util.find_spec("verifiers") is not None:
        pytest.skip("verifiers is installed in this env")
    from astraflow.envs import build_env

    with pytest.raises(ValueError, match="setup-verifiers-env.sh"):
        build_env("verifiers", dict(PARAMS))


@needs_venv
def test_verifiers_env_in_its_venv_rows_rubric_and_training(tmp_path):
    from astraflow.models.factory import save_policy, tiny_llama
    from astraflow.models.tokenizer import build_char_tokenizer
    from astraflow.train.trainer import Trainer

    policy = tmp_path / "policy"
    policy.mkdir()
    save_policy(tiny_llama(hidden_size=64, layers=2, heads=2, intermediate_size=128,
                           alphabet="ascii", max_positions=1024),
                build_char_tokenizer("ascii"), policy)
    ctx = seeded_run(tmp_path / "run", {
        "name": "v", "policies": [{"name": "agent", "model": {
            "hidden_size": 64, "layers": 2, "heads": 2, "intermediate_size": 128,
            "alphabet": "ascii", "max_positions": 1024}}],
        "env": {"name": "verifiers", "params": PARAMS, "eval_size": 10},
        "rollout": {"prompts_per_batch": 2, "samples_per_prompt": 2, "max_new_tokens": 8},
        "stages": [{"name": "group_advantages"}],
    }, policy)
    out = subprocess.run([str(VENV_PY), "-c", SIDE, str(ctx.run_dir)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    side = json.loads(out.stdout.strip().splitlines()[-1])

    # The scripted episode: a call to the toolset's `add`, its result read (mask 0), the
    # answer; the rubric's components, weights and metric, and their weighted sum.
    assert side["finish"] == "done" and side["turns"] == 2
    assert side["read"] == [False, True, False]
    assert f"<tool>{side['answer']}</tool>" in side["context"]
    assert side["info"]["rubric"] == {"correct": 1.0, "brief": 1.0}
    assert side["info"]["rubric_weights"] == {"correct": 1.0, "brief": 0.2}
    assert side["info"]["rubric_metrics"] == {"turns": 2.0}
    assert side["reward"] == pytest.approx(1.2)

    # The worker's rows (a random tiny model): every row has the rubric, and its reward
    # is the rubric's weighted sum.
    assert side["rows"] == 4
    rows = ctx.trajectories().read_range("agent", 0, 10**9).to_pylist()
    assert len(rows) == 4
    for r in rows:
        x = json.loads(r["extras"])
        assert set(x["rubric"]) == {"correct", "brief"}
        assert r["reward"] == pytest.approx(sum(x["rubric"][k] * x["rubric_weights"][k]
                                                for k in x["rubric"]))
    tr = Trainer(ctx)  # the trainer side needs no verifiers
    sl = tr.poll()
    assert sl is not None and sl.num_rows == 4
    tr.train_on(sl)
    assert tr.version == 1 and "verifiers" not in sys.modules
