"""The `skyrl_gym` env: gymnasium-style text environments through skyrl-gym's own
interface (`skyrl_gym.make`, `init`, `step`, `get_metrics`, `close`), with skyrl-gym
installed from the registry. Its `gsm8k_multi_turn` env plays SkyRL-format rows in a
real rollout worker with a tiny model; a user's `BaseTextEnv` subclass named
`module:attr` (defined here) shows the multi-turn protocol exactly, with a scripted
model; a library error ends only its own episode.
"""

from __future__ import annotations

import json
import random

import pytest

skyrl_gym = pytest.importorskip("skyrl_gym", reason="the `skyrl-gym` extra is not installed")

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput  # noqa: E402

from astraflow.envs import build_env  # noqa: E402
from astraflow.models.tokenizer import CharCodec  # noqa: E402
from astraflow.rollout.generation import Generation  # noqa: E402
from astraflow.workflows.tool_agent import ToolAgent  # noqa: E402
from tests.runs import seeded_run  # noqa: E402

CODEC = CharCodec.default("ascii")


class CountdownEnv(BaseTextEnv):
    """A user's skyrl-gym env: say the numbers from `start` down to 1, one per turn;
    0.5 per right number, done at 1 (or at the first wrong one, which raises on `boom`)."""

    def __init__(self, env_config=None, extras=None):
        super().__init__()
        self.next = int(extras["reward_spec"]["ground_truth"])
        if self.next == 40:
            raise ValueError("no such countdown")
        self.said: list[str] = []

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        if "boom" in action:
            raise RuntimeError("the env broke")
        self.said.append(action)
        if action.strip() != str(self.next):
            return BaseTextEnvStepOutput(observations=[], reward=0.0, done=True, metadata={})
        self.next -= 1
        obs = [] if self.next == 0 else [{"role": "user", "content": f"next? ({self.next} left)"}]
        return BaseTextEnvStepOutput(observations=obs, reward=0.5, done=self.next == 0,
                                     metadata={})

    def get_metrics(self):
        return {"said": len(self.said)}


def countdown_rows():
    return [{"prompt": f"Count down from {n}.", "reward_spec": {"ground_truth": str(n)},
             "extra_info": {"index": n}} for n in range(1, 41)]


def scripted(fn):
    def generate(prompts, samples, max_new):
        comps = [CODEC.encode(fn(CODEC.decode(p)))[1:] for p in prompts for _ in range(samples)]
        return Generation(comps, [[-0.5] * len(c) for c in comps], ["stop"] * len(comps))
    return generate


def test_a_user_base_text_env_by_module_attr_plays_its_protocol_exactly():
    env = build_env("skyrl_gym", {"dataset": "tests.test_env_gym:countdown_rows",
                                  "env": "tests.test_env_gym:CountdownEnv", "max_turns": 5})
    assert not (set(env.split.heldout) & {t.task_id for t in
                                          (env.sample(random.Random(i)) for i in range(50))})
    wf = ToolAgent(env, CODEC, samples_per_prompt=1)
    tasks = [env.task("3"), env.task("2"), env.task("7"), env.task("4")]

    def model(context: str) -> str:  # counts right, but stops after 2 numbers on task 7,
        if "from 4" in context:      # and breaks the env on task 4
            return "boom"
        start = int(context.split("from ")[1].split(".")[0])
        left = context.count("left)")
        return "x" if start == 7 and left == 2 else str(start - left)

    eps = wf.play(tasks, 1, scripted(model), 8)
    by = {e.task.task_id: e for e in eps}
    assert by["3"].finish == "done" and by["3"].reward == 1.5 and by["3"].turns == 3
    assert by["2"].finish == "done" and by["2"].reward == 1.0
    assert by["7"].finish == "done" and by["7"].reward == 1.0 and by["7"].turns == 3
    assert by["4"].finish == "env_error" and "the env broke" in by["4"].info["env_error"]
    assert by["3"].info["env_metrics"] == {"said": 3}
    # the env's observations are read, not trained: "<tool>next? (2 left)</tool>"
    text = CODEC.decode(by["3"].context())
    assert "next? (2 left)" in text and "next? (1 left)" in text
    assert [lp is None for _, lp in by["3"].segments] == [False, True, False, True, False]
    assert wf.solved(by["2"].reward) and not wf.solved(0.5)
    # a session that cannot open has no prompt: the batch fails, naming why
    with pytest.raises(RuntimeError, match="could not open a session: no such countdown"):
        wf.play([env.task("2"), env.task("40")], 1, scripted(model), 8)


def test_unknown_env_ids_are_refused_with_the_registered_ones():
    with pytest.raises(ValueError, match="gsm8k_multi_turn"):
        build_env("skyrl_gym", {"dataset": "tests.test_env_gym:countdown_rows",
                                "env": "gsm8k_multi_tunr"})


@pytest.fixture
def ascii_policy_dir(tmp_path):
    from astraflow.models.factory import save_policy, tiny_llama
    from astraflow.models.tokenizer import build_char_tokenizer

    d = tmp_path / "policy"
    d.mkdir()
    save_policy(tiny_llama(hidden_size=64, layers=2, heads=2, intermediate_size=128,
                           alphabet="ascii", max_positions=512), build_char_tokenizer("ascii"), d)
    return d


def test_skyrl_gsm8k_multi_turn_in_a_worker_and_a_training_step(tmp_path, ascii_policy_dir):
    from astraflow.rollout.worker import RolloutWorker
    from astraflow.train.trainer import Trainer

    ctx = seeded_run(tmp_path / "run", {
        "name": "g", "policies": [{"name": "agent", "model": {
            "hidden_size": 64, "layers": 2, "heads": 2, "intermediate_size": 128,
            "alphabet": "ascii", "max_positions": 512}}],
        "env": {"name": "skyrl_gym", "params": {"dataset": "examples.skyrl_gym_rows:rows",
                                                "env": "gsm8k_multi_turn"}, "eval_size": 10},
        "rollout": {"prompts_per_batch": 2, "samples_per_prompt": 2, "max_new_tokens": 8},
        "stages": [{"name": "group_advantages"}],
    }, ascii_policy_dir)
    w = RolloutWorker(ctx, "wA")
    assert w.refresh_weights()
    assert w.produce_batch() == 4
    rows = ctx.trajectories().read_range("agent", 0, 10**9).to_pylist()
    extras = [json.loads(r["extras"]) for r in rows]
    # a random model never writes `#### N`: gsm8k_multi_turn asks again, then ends the
    # episode at its own max_turns (2, from the rows' extra_info) with reward 0
    assert all(x["finish_reason"] == "done" and x["turns"] == 2 for x in extras), extras
    assert all(r["reward"] == 0.0 and x["env_metrics"] == {"steps": 2}
               for r, x in zip(rows, extras, strict=True))
    codec = w.workflow.codec
    r = rows[0]
    read = [t for t, m in zip(r["completion_ids"], r["loss_mask"], strict=True) if m == 0]
    assert "Now provide only the final numeric answer" in codec.decode(read)
    wf = w.workflow  # held-out evaluation plays the env's sessions greedily
    assert wf.score("agent", w.engines["agent"], wf.eval_items("agent", 3)) == 0.0
    assert [e.finish for e in wf.last_episodes] == ["done"] * 3
    tr = Trainer(ctx)
    sl = tr.poll()
    assert sl is not None and sl.num_rows == 4
    tr.train_on(sl)
    assert tr.version == 1


def test_a_chat_model_turn_that_ends_at_its_end_of_turn_token_is_closed_once(smollm2_dir):
    """A stepped env's turn ends at the chat template's end-of-turn token (no action
    string), which the env's reply, rendered as the template's next user message,
    would otherwise close a second time."""
    from astraflow.models.codec import load_codec

    codec = load_codec(smollm2_dir)
    env = build_env("skyrl_gym", {"dataset": "tests.test_env_gym:countdown_rows",
                                  "env": "tests.test_env_gym:CountdownEnv"})
    wf = ToolAgent(env, codec, samples_per_prompt=1)

    def generate(prompts, samples, max_new):
        left = codec.tokenizer.decode(prompts[0]).count("left)")
        ids = codec.tokenizer.encode(str(2 - left), add_special_tokens=False) + [codec.eos_id]
        return Generation([ids], [[-0.1] * len(ids)], ["stop"])

    ep = wf.play([env.task("2")], 1, generate, 8)[0]
    assert ep.finish == "done" and ep.reward == 1.0
    text = codec.tokenizer.decode(ep.context())
    assert text.endswith("<|im_start|>assistant\n2<|im_end|>\n<|im_start|>user\n<tool>next? (1 "
                         "left)</tool><|im_end|>\n<|im_start|>assistant\n1<|im_end|>"), text[-300:]
    assert "<|im_end|><|im_end|>" not in text
