"""Stop ids, stop strings, finish reasons and length limits: engine, workflow, worker rows,
and the chat-style math workload's free-text reward."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import pytest
import torch

from astraflow.config.loader import FlowError, parse_flow
from astraflow.envs.math import MathEnv, parse_answer
from astraflow.models.codec import HFCodec
from astraflow.models.hf import load_policy
from astraflow.models.tokenizer import CharCodec
from astraflow.rollout.engine import HFEngine
from astraflow.rollout.generation import PromptTooLong
from astraflow.rollout.worker import RolloutWorker
from tests.runs import seeded_run


@dataclass
class _ExtraStops:
    """A CharCodec whose stop set also holds the given characters (as a chat template's
    end-of-turn tokens are stop ids beside EOS)."""

    base: CharCodec
    extra: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    is_chat: bool = False

    def __post_init__(self) -> None:
        self.pad_id, self.eos_id = self.base.pad_id, self.base.eos_id
        self.stop_ids = (self.base.eos_id, *self.extra)

    def encode(self, text):
        return self.base.encode(text)

    def encode_chat(self, messages, *, add_generation_prompt=True):
        return self.base.encode_chat(messages, add_generation_prompt=add_generation_prompt)

    def decode(self, ids):
        return self.base.decode(ids)

    def hits_stop_string(self, ids):
        return any(s in self.base.decode(ids) for s in self.stop_strings)


def _engine(tiny_policy_dir, codec=None) -> HFEngine:
    eng = HFEngine.from_dir(tiny_policy_dir)
    if codec is not None:
        eng = HFEngine(eng.model, codec)
    return eng


def _sample(eng, n=8, max_new=12, seed=0):
    prompts = [CharCodec.default().encode(f"{i:02d}+{i + 3:02d}=") for i in range(n)]
    return eng.generate(prompts, max_new_tokens=max_new, samples_per_prompt=4, temperature=1.5,
                        generator=torch.Generator().manual_seed(seed))


def test_every_stop_id_ends_a_completion_and_reasons_are_reported(tiny_policy_dir):
    base = CharCodec.default()
    plain = _sample(_engine(tiny_policy_dir))
    # The random tiny model emits digits freely: make '5' an end-of-turn token too.
    five = base.vocab["5"]
    assert any(five in c[:-1] for c in plain.completions), "the check needs a '5' mid-completion"
    gen = _sample(_engine(tiny_policy_dir, _ExtraStops(base, (five,))))
    assert len(gen.finish_reasons) == len(gen.completions) == 32
    for comp, why in zip(gen.completions, gen.finish_reasons, strict=True):
        stops_inside = [t for t in comp[:-1] if t in (five, base.eos_id)]
        assert not stops_inside, "generation went on past a stop id"
        if why == "stop":
            assert comp[-1] in (five, base.eos_id)
        else:
            assert why == "length" and len(comp) == 12 and comp[-1] not in (five, base.eos_id)
    assert "stop" in gen.finish_reasons


def test_length_limit_marks_truncation(tiny_policy_dir):
    gen = _sample(_engine(tiny_policy_dir), max_new=1)
    assert all(len(c) == 1 for c in gen.completions)
    assert {r for c, r in zip(gen.completions, gen.finish_reasons, strict=True)
            if c[-1] != CharCodec.default().eos_id} <= {"length"}


def test_stop_strings_end_a_completion(tiny_policy_dir):
    base = CharCodec.default()
    gen = _sample(_engine(tiny_policy_dir, _ExtraStops(base, stop_strings=("1",))))
    cut = [c for c, r in zip(gen.completions, gen.finish_reasons, strict=True)
           if r == "stop" and c[-1] != base.eos_id]
    assert cut, "no completion was ended by the stop string"
    for c in cut:
        assert base.decode(c).endswith("1") and "1" not in base.decode(c[:-1])


def test_stop_strings_of_a_real_tokenizer_end_a_completion(bpe_model_dir):
    """HFCodec.decode cuts stop strings away, so the engine must ask the codec whether
    one was written (it once looked for them in the cut text and never stopped)."""
    codec = HFCodec.from_pretrained(bpe_model_dir, stop_strings=("e",))
    eng = HFEngine(load_policy(bpe_model_dir), codec)
    prompts = [codec.encode(f"What is {i} + 7?") for i in range(8)]
    gen = eng.generate(prompts, max_new_tokens=12, samples_per_prompt=4, temperature=2.0,
                       generator=torch.Generator().manual_seed(0))
    cut = [c for c, r in zip(gen.completions, gen.finish_reasons, strict=True)
           if r == "stop" and c[-1] not in codec.stop_ids]
    assert cut, "no completion was ended by the stop string"
    for c in cut:
        assert codec.hits_stop_string(c) and not codec.hits_stop_string(c[:-1])
        assert "e" not in codec.decode(c)


def test_overlong_prompt_is_refused_before_any_compute(tiny_policy_dir):
    eng = _engine(tiny_policy_dir)
    with pytest.raises(PromptTooLong, match="max_prompt_tokens=5.*longest: 9"):
        eng.generate([CharCodec.default().encode("12+34=")] * 2 + [[1] * 9], max_new_tokens=3,
                     max_prompt_tokens=5)


def test_free_text_answers_are_parsed():
    assert parse_answer("59 + 7 = 66") == 66
    assert parse_answer("The answer is \\boxed{66}. Check: 60 + 6") == 66
    assert parse_answer("It is 1,234.") == 1234
    assert parse_answer("I do not know") is None
    env = MathEnv(2, "+", 0.2, style="question", digits_b=1)
    t = env.sample(random.Random(0))
    a, b = (int(x) for x in t.task_id.split("+"))
    assert 10 <= a <= 99 and 0 <= b <= 9 and t.prompt == f"What is {a} + {b}? Reply with only the number."
    assert env.reward(t, f"{a} + {b} = {a + b}") == 1.0
    assert env.reward(t, f"{a + b + 1}") == 0.0
    words = MathEnv(2, "-", 0.2, style="word", digits_b=1)
    held = words.eval_tasks(60)
    assert all(words.is_heldout(x) for x in held) and len({x.prompt for x in held}) == 60
    assert words.eval_tasks(60) == held  # the same template per task, in every process


def test_bad_env_and_limits_are_refused():
    with pytest.raises(FlowError, match="style"):
        parse_flow({"name": "x", "policies": [{"name": "solver"}], "env": {"style": "essay"}})
    with pytest.raises(FlowError, match="max_new_tokens"):
        parse_flow({"name": "x", "policies": [{"name": "solver"}], "rollout": {"max_new_tokens": 0}})
    with pytest.raises(ValueError, match="compact"):
        MathEnv(2, "+", style="compact", digits_b=1)


@pytest.fixture
def ctx(tmp_path, tiny_policy_dir):
    return seeded_run(tmp_path / "run", {
        "name": "lim", "policies": [{"name": "solver", "model": {"hidden_size": 64, "layers": 2,
                                                                 "heads": 2, "intermediate_size": 128}}],
        "env": {"digits": 2, "eval_size": 20},
        "rollout": {"prompts_per_batch": 4, "samples_per_prompt": 2, "max_new_tokens": 2},
    }, tiny_policy_dir)


def test_worker_honours_flow_limits_and_marks_rows(ctx):
    w = RolloutWorker(ctx, "wA")
    w.refresh_weights()
    assert w.workflow.max_new_tokens("solver") == 2
    assert w.produce_batch() == 8
    rows = ctx.trajectories().read_range("solver", 0, 10**9).to_pylist()
    eos = CharCodec.default().eos_id
    for r in rows:
        why = json.loads(r["extras"])["finish_reason"]
        assert len(r["completion_ids"]) <= 2
        assert why == ("stop" if r["completion_ids"][-1] == eos else "length")
    metrics = ctx.ledger().read_metrics().to_pylist()
    frac = [m["value"] for m in metrics if m["name"] == "truncated_frac"]
    assert frac == [sum(json.loads(r["extras"])["finish_reason"] == "length" for r in rows) / 8]


def test_worker_stops_on_an_overlong_prompt(ctx):
    ctx.flow.rollout.max_prompt_tokens = 3  # "12+34=" is 7 tokens with BOS
    w = RolloutWorker(ctx, "wA")
    w.refresh_weights()
    with pytest.raises(PromptTooLong):
        w.produce_batch()
    assert ctx.trajectories().count("solver") == 0
