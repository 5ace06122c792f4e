"""The database workload: deterministic databases and tasks, a held-out split training
never draws, rewards against the gold query's result, the sql tool's refusals (writes,
ATTACH, PRAGMA), timeout and truncation, demonstrations that solve their tasks when
replayed through the tool, concurrent calls."""

from __future__ import annotations

import hashlib
import random
import sqlite3
from concurrent.futures import ThreadPoolExecutor

import pytest

from astraflow.envs.base import Answer, Env, ToolCall, parse_action
from astraflow.envs.sql import SqlEnv


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("sqlcache"))


@pytest.fixture(scope="module")
def env(cache):
    return SqlEnv(cache_dir=cache, databases=6)


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_tasks_and_databases_deterministic_heldout_disjoint(env, tmp_path):
    assert isinstance(env, Env)
    other = SqlEnv(cache_dir=str(tmp_path), databases=6)  # built afresh elsewhere
    def seen(e):
        return [(t.task_id, t.prompt, t.answer, t.data["gold"]) for t in e.eval_tasks(30)]

    assert seen(env) == seen(other)
    with sqlite3.connect(env.path("shop3")) as a, sqlite3.connect(other.path("shop3")) as b:
        q = "SELECT * FROM customers JOIN orders ON customers.id=cust ORDER BY orders.id"
        assert a.execute(q).fetchall() == b.execute(q).fetchall()
    rng = random.Random(0)
    train = {env.sample(rng).task_id for _ in range(2000)}
    held = {t.task_id for t in env.eval_tasks(len(env.split.heldout))}
    assert len(train) > 150 and len(held) > 10 and not train & held
    assert {k.split(":")[1] for k in held} == {k.split(":")[1] for k in train}  # all kinds
    assert seen(SqlEnv(cache_dir=str(tmp_path), databases=6, seed=1)) != seen(other)


def test_reward_correct_partial_wrong(env):
    count = env.task("shop0:ncity:" + env._values("shop0", _question("ncity"))[0])
    assert env.reward(count, count.answer) == 1.0
    assert env.reward(count, f" {count.answer}. ") == 1.0
    assert env.reward(count, str(int(count.answer) + 1)) == 0.0
    assert env.reward(count, None) == 0.0
    avg = env.task("school1:avg:math")
    assert "." in avg.answer and env.reward(avg, avg.answer + "0") == 1.0  # 2 decimals
    name = env.task("school1:best:art")
    assert env.reward(name, name.answer.upper()) == 1.0
    # A list question: two names right and one wrong scores 2 / (gold + 1).
    lists = [env.task(k) for k in env.split.train["livein"] + env.split.heldout
             if ":livein:" in k]
    task = next(t for t in lists if len(t.answer.split(", ")) >= 3)
    gold = task.answer.split(", ")
    assert env.reward(task, ", ".join(reversed(gold))) == 1.0
    partial = f"{gold[0]}, {gold[1]}, Nobody"
    assert env.reward(task, partial) == pytest.approx(2 / (len(gold) + 1))
    assert env.reward(task, "Nobody") == 0.0


def test_grounded_reward_pays_an_answer_only_with_a_query_that_returned_it(cache, env):
    grounded = SqlEnv(cache_dir=cache, databases=6, reward="grounded")
    city = env._values("shop0", _question("ncity"))[0]
    task = grounded.task(f"shop0:ncity:{city}")
    gold = task.data["gold"]

    def sql(q):
        return ToolCall("sql", q)

    right = task.answer
    assert grounded.reward_episode(task, right, (sql(gold),)) == 1.0
    # Another query with the same result counts (an execution match, not string match),
    # and so does a right query after a failed one.
    same = f"SELECT COUNT(id) FROM customers WHERE city = '{city}'"
    assert grounded.reward_episode(task, right, (sql("SELEC nonsense"), sql(same))) == 1.0
    # A guess: the right answer with no query, a broken one, or one whose result differs.
    assert grounded.reward_episode(task, right, ()) == 0.0
    assert grounded.reward_episode(task, right, (sql("SELECT COUNT(*) FROM x='1'"),)) == 0.0
    assert grounded.reward_episode(task, right, (sql("SELECT 123456"),)) == 0.0
    assert grounded.reward_episode(task, right, (ToolCall("search", gold),)) == 0.0
    # A right query does not make a wrong answer right.
    assert grounded.reward_episode(task, str(int(right) + 1), (sql(gold),)) == 0.0
    assert grounded.reward_episode(task, None, (sql(gold),)) == 0.0
    # The default, `answer`, is the answer alone; the held-out check is too in both.
    assert env.reward_episode(task, right, ()) == env.reward(task, right) == 1.0
    assert grounded.reward(task, right) == 1.0
    with pytest.raises(ValueError, match="'answer' or 'grounded'"):
        SqlEnv(cache_dir=cache, databases=6, reward="exact")


def _question(name):
    from astraflow.envs.sql import QUESTIONS

    return next(q for q in QUESTIONS if q.name == name)


def test_sql_tool_refuses_writes_and_reports_errors(env):
    task = env.task(env.split.train["total"][0])
    tool = env.tools["sql"]
    before = _digest(task.data["db"])
    for stmt in ["DELETE FROM orders", "UPDATE orders SET amount=0", "DROP TABLE orders",
                 "INSERT INTO orders VALUES (99,1,1,2020)", "CREATE TABLE t(x)",
                 f"ATTACH '{env.dir}/evil.sqlite' AS e", "PRAGMA query_only=OFF",
                 "VACUUM"]:
        r = tool(task, stmt)
        assert r.error is not None and r.error.startswith("error: "), (stmt, r)
        assert r.output == r.error
    assert _digest(task.data["db"]) == before and not (env.dir / "evil.sqlite").exists()
    bad = tool(task, "SELEC amount FROM orders")
    assert bad.error is not None and "syntax error" in bad.error
    assert "no such table" in (tool(task, "SELECT * FROM nope").error or "")
    assert tool(task, "SELECT 1; SELECT 2").error is not None


def test_sql_tool_timeout_and_truncation(cache):
    env = SqlEnv(cache_dir=cache, databases=6, statement_timeout_s=0.5, max_rows=5,
                 tool_output_chars=60)
    task = env.task(env.split.train["total"][0])
    tool = env.tools["sql"]
    forever = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) "
               "SELECT COUNT(*) FROM c")
    r = tool(task, forever)
    assert r.error == "timeout" and r.seconds < tool.timeout_s
    rows = tool(task, "SELECT id FROM orders ORDER BY id")
    assert rows.error is None
    assert rows.output == "1\n2\n3\n4\n5\n... (more than 5 rows)"
    wide = tool(task, "SELECT * FROM orders JOIN customers")
    assert len(wide.output) == 60 and wide.output.endswith("...")
    assert tool(task, "SELECT id FROM orders WHERE id < 0").output == "(no rows)"


def test_demonstrations_solve_their_tasks_through_the_tool(env):
    rng = random.Random(1)
    tasks = [env.task(ks[0]) for ks in env.split.train.values()]
    assert len(tasks) == 10  # one of each question kind
    for task in tasks:
        turns = env.demonstration(task, rng)
        call, answer = parse_action(turns[0].text), parse_action(turns[-1].text)
        assert isinstance(call, ToolCall) and isinstance(answer, Answer)
        assert env.tools[call.tool](task, call.argument).output == turns[1].text
        assert answer.text == turns[1].text  # the rows, copied verbatim
        assert env.reward(task, answer.text) == 1.0


def test_concurrent_queries(env):
    tasks = env.eval_tasks(8)
    tool = env.tools["sql"]
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda t: tool(t, t.data["gold"]), tasks))
    assert all(o.error is None for o in outs)
    assert [env.reward(t, ", ".join(o.output.splitlines())) for t, o in zip(tasks, outs, strict=True)] \
        == [1.0] * 8
