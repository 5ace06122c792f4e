"""The code workload: deterministic tasks, a held-out split training never draws,
rewards graded in the real sandbox, the run tool's error paths, demonstrations that
solve their tasks when replayed through the tool, concurrent calls."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

from astraflow.envs.base import Answer, Env, ToolCall, parse_action
from astraflow.envs.code import CodeEnv


def test_tasks_deterministic_and_heldout_disjoint():
    a, b = CodeEnv(), CodeEnv()
    assert isinstance(a, Env)
    assert [t.task_id for t in a.eval_tasks(40)] == [t.task_id for t in b.eval_tasks(40)]
    assert a.eval_tasks(5) == b.eval_tasks(5)  # hidden tests included
    rng = random.Random(0)
    train = {a.sample(rng).task_id for _ in range(3000)}
    held = {t.task_id for t in a.eval_tasks(len(a.split.heldout))}
    assert len(train) > 500 and len(held) > 50 and not train & held
    assert all(a.is_heldout(t) for t in a.eval_tasks(20))
    # Another seed: other hidden tests, another split.
    c = CodeEnv(seed=1)
    assert [t.task_id for t in c.eval_tasks(20)] != [t.task_id for t in a.eval_tasks(20)]
    assert a.task("sumdiv:3").data != c.task("sumdiv:3").data


def test_reward_correct_partial_wrong():
    env = CodeEnv(run_timeout_s=2.0)
    task = env.task("countgt:4")
    assert env.reward(task, task.answer) == 1.0
    assert env.reward(task, "def f(xs):\n    return len([x for x in xs if x > 4])") == 1.0
    # Right only on inputs of at most three numbers.
    partial = "f=lambda xs:sum(x>4 for x in xs) if len(xs)<=3 else -1"
    short = sum(len(x) <= 3 for x in task.data["inputs"])
    assert 0 < short < len(task.data["inputs"])
    assert env.reward(task, partial) == short / len(task.data["inputs"])
    assert env.reward(task, "f=lambda xs:sum(x>=4 for x in xs)") < 1.0
    assert env.reward(task, "f=lambda xs:[]") == 0.0
    assert env.reward(task, "f=lambda xs:") == 0.0  # syntax error
    assert env.reward(task, "g=lambda xs:0") == 0.0  # no f
    assert env.reward(task, "while True: pass") == 0.0  # timeout
    assert env.reward(task, None) == 0.0
    # A program cannot print its way to a score: the expected values are not in the sandbox.
    # (the harness's line is tagged with a fresh nonce; a program's own prints are ignored)
    assert env.reward(task, "print('[[\"ok\", 1]]' * 5);f=lambda xs:-99") == 0.0


def test_run_tool_output_and_errors():
    env = CodeEnv(run_timeout_s=1.5)
    run, task = env.tools["run"], env.task("add:3")
    ok = run(task, "f=lambda xs:[x+3 for x in xs];print(f([1,2]))")
    assert (ok.output, ok.error) == ("[4, 5]", None)
    crash = run(task, "print('before');f=lambda xs:xs[9];f([1])")
    assert crash.error == "IndexError: list index out of range"
    assert crash.output == "before\nIndexError: list index out of range"
    slow = run(task, "while True: pass")
    assert slow.error is not None and slow.error.startswith("timeout")
    assert slow.seconds < run.timeout_s
    flood = run(task, "print('x'*10**6)")
    assert flood.error == "output too long" and len(flood.output) <= 200


def test_demonstrations_solve_their_tasks_through_the_tool():
    env = CodeEnv()
    rng = random.Random(3)
    tasks = [env.task(f"{name}:{p}") for name, p in
             [("sumdiv", 3), ("countgt", -2), ("add", -4), ("mul", 7), ("maxplus", 0),
              ("last", 2), ("revwords", ","), ("count", "e"), ("countin", "ab"),
              ("replace", "a,z"), ("first", 3), ("repeat", 2)]]
    used_tool = 0
    for task in tasks:
        turns = env.demonstration(task, rng)
        assert turns[-1].who == "model"
        for i, turn in enumerate(turns):
            if turn.who != "model":
                continue
            action = parse_action(turn.text)
            if isinstance(action, ToolCall):
                used_tool += 1
                replay = env.tools[action.tool](task, action.argument)
                assert replay.error is None and replay.output == turns[i + 1].text
            else:
                assert isinstance(action, Answer) and env.reward(task, action.text) == 1.0
    assert 0 < used_tool < len(tasks)


def test_instructions_list_the_tool_and_format():
    text = CodeEnv().instructions()
    assert "<call>run ARG</call>" in text and "<answer>" in text


def test_concurrent_grading():
    env = CodeEnv()
    tasks = env.eval_tasks(6)
    answers = [t.answer if i % 2 == 0 else "f=lambda x:None" for i, t in enumerate(tasks)]
    with ThreadPoolExecutor(6) as pool:
        rewards = list(pool.map(env.reward, tasks, answers))
    assert rewards == [1.0 if i % 2 == 0 else 0.0 for i in range(6)]
