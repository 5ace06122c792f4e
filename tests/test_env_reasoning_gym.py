"""The reasoning-gym env against the real library: generators by name with their config,
the library's own scorer as the reward, a held-out split from its own seed that training
never draws, math-verify as a reward option, and the error a flow gets when an extra is
not installed."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import reasoning_gym

from astraflow.config.loader import FlowError, load_flow
from astraflow.envs import build_env
from astraflow.envs.base import Env
from astraflow.envs.mathcheck import equivalent
from astraflow.envs.rgym import ReasoningGymEnv

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
LEGS = {"min_animals": 1, "max_animals": 2, "max_instances": 5}


def test_tasks_deterministic_heldout_disjoint_and_scored_by_the_library():
    a = build_env("reasoning_gym", {"dataset": "leg_counting", "config": LEGS,
                                     "heldout_size": 100})
    b = ReasoningGymEnv("leg_counting", LEGS, heldout_size=100)
    assert isinstance(a, Env) and isinstance(a, ReasoningGymEnv)
    assert a.eval_tasks(100) == b.eval_tasks(100)
    held = a.eval_tasks(100)
    assert len({t.data["entry"]["question"] for t in held}) == 100  # distinct
    assert all(a.is_heldout(t) for t in held)
    rng = random.Random(0)
    train = [a.sample(rng) for _ in range(2000)]
    assert not {t.data["entry"]["question"] for t in train} & {
        t.data["entry"]["question"] for t in held}
    assert not any(a.is_heldout(t) for t in train)
    # The task is the library's item for that seed: its question, its oracle answer.
    item = reasoning_gym.create_dataset("leg_counting", **LEGS, seed=a.eval_seed, size=400)[0]
    assert held[0].prompt.startswith(item["question"]) and held[0].answer == item["answer"]
    t = train[0]
    assert a.reward(t, f"I count.\n<answer>{t.answer}</answer>") == 1.0
    assert a.reward(t, f"<answer>{int(t.answer) + 1}</answer>") == 0.0
    assert a.reward(t, t.answer) == 0.0  # the tag format asks for tags
    assert a.reward(t, None) == 0.0
    demo = a.demonstration(t, rng)
    assert a.reward(t, demo[0].text) == 1.0
    # Another seed: other training items.
    c = ReasoningGymEnv("leg_counting", LEGS, seed=7, heldout_size=100)
    assert [c.sample(random.Random(0)).task_id for _ in range(3)] != [x.task_id for x in train[:3]]


def test_partial_credit_is_the_library_scorer_s():
    env = ReasoningGymEnv("word_sequence_reversal", {"min_words": 3, "max_words": 4},
                          answer_format="text", heldout_size=20)
    t = env.eval_tasks(1)[0]
    entry = t.data["entry"]
    for answer in (t.answer, t.answer + " extra", "no", ""):
        want = env.heldout.score_answer(answer.strip() or None, entry)
        assert env.reward(t, answer) == want
    assert env.reward(t, t.answer) == 1.0 and 0 < env.reward(t, t.answer + " extra") < 1


def test_math_verify_reward():
    assert equivalent("0.5", "\\frac{1}{2}") and equivalent("28080", "28,080")
    assert equivalent("3", "x = 3") and not equivalent("3", "4")
    env = ReasoningGymEnv("gsm_symbolic", reward="math_verify", answer_format="tag",
                          heldout_size=20)
    t = env.sample(random.Random(0))
    assert env.reward(t, f"<answer>{t.answer}.0</answer>") == 1.0
    assert env.reward(t, f"<answer>{int(t.answer) + 1}</answer>") == 0.0
    assert env.reward(t, f"{t.answer}") == 0.0  # no tags: no answer


def test_bad_params_say_what_to_change():
    with pytest.raises(ValueError, match="no dataset 'leg_count'"):
        ReasoningGymEnv("leg_count")
    with pytest.raises(ValueError, match="env's own params"):
        ReasoningGymEnv("leg_counting", {"seed": 3})
    with pytest.raises(ValueError, match="overlaps the training items"):
        ReasoningGymEnv("leg_counting", seed=0, train_size=1000, eval_seed=500)
    with pytest.raises(ValueError, match="distinct held-out questions"):  # a tiny task space
        ReasoningGymEnv("leg_counting", {"min_animals": 1, "max_animals": 1, "max_instances": 1},
                        heldout_size=100).eval_tasks(10)
    with pytest.raises(ValueError, match="raise env.params.heldout_size"):
        ReasoningGymEnv("leg_counting", heldout_size=10).eval_tasks(20)


def test_a_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch):
    flow = EXAMPLES / "smollm2-rg-leg-counting.yaml"
    assert load_flow(flow).env.name == "reasoning_gym"
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # Python's "not installed"
    with pytest.raises(FlowError, match=r"pip install 'astraflow\[reasoning-gym\]'"):
        load_flow(flow)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'astraflow\[reasoning-gym\]'"):
        ReasoningGymEnv("leg_counting")
    monkeypatch.setitem(sys.modules, "math_verify", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'astraflow\[math-verify\]'"):
        equivalent("1", "1")


def test_the_math_verify_example_pays_a_stated_solution_the_library_pays_in_part():
    """examples/smollm2-rg-equations-math-verify.yaml: its env pays "h = 1" (how a model
    states a solution) as solved, where the generator's own scorer pays it in part."""
    flow = load_flow(EXAMPLES / "smollm2-rg-equations-math-verify.yaml")
    env = build_env(flow.env.name, flow.env.params)
    assert isinstance(env, ReasoningGymEnv) and env.reward_kind == "math_verify"
    for t in env.eval_tasks(10):
        entry = t.data["entry"]
        var = entry["metadata"]["variable"]
        stated = f"{var} = {t.answer}"
        assert env.reward(t, stated) == 1.0 and env.reward(t, t.answer) == 1.0
        assert env.reward(t, f"{var} = {int(t.answer) + 1}") == 0.0
        assert env.heldout.score_answer(stated, entry) < 1.0  # the library's own scorer
