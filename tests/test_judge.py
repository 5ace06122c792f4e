"""The `judge` workflow: the verdict parser, the reward table's four cases, episodes
played through a scripted actor and through the rollout worker, held-out items, and
verdicts of the real SmolLM2."""

from __future__ import annotations

import random

import pytest
import torch

from astraflow.envs.math import MathEnv
from astraflow.models.codec import load_codec
from astraflow.rollout.generation import Generation
from astraflow.workflows.judge import (
    ACCEPT,
    REJECT,
    SOLVER_FOOLED,
    VERIFIER_FOOLED,
    Judge,
    rewards,
    verdict,
)
from tests.runs import seeded_run

ENV = dict(digits=2, op="+", heldout_fraction=0.2, style="question", digits_b=1)


@pytest.mark.parametrize("text, want", [
    ("The student's answer is correct.", ACCEPT),
    ("The student's answer is incorrect.", REJECT),
    ("Yes", ACCEPT), ("no.", REJECT), ("Correct!", ACCEPT), ("WRONG", REJECT),
    ("No, the correct answer is 67.", REJECT),    # the first verdict word counts
    ("Yes. The proposed answer is correct.", ACCEPT),
    ("That is not correct.", REJECT), ("It is right.", ACCEPT), ("true", ACCEPT),
    ("The student's answer is not entirely correct.", REJECT),
    ("It isn't quite right.", REJECT), ("Not correct", REJECT),
    ("66", None), ("", None), ("incorrectly formatted? unknown", None),
])
def test_verdict_words(text, want):
    assert verdict(text) == want


@pytest.mark.parametrize("text, want", [
    ("18 + 4 = 22, so the student's answer is correct.", ACCEPT),
    ("The correct answer is 67, so the student's answer is incorrect.", REJECT),
    ("The correct answer is 67, not 66: that is not correct.", REJECT),
    ("Wrong at first glance, but 18 + 4 = 22, so it is right.", ACCEPT),
    ("18 + 4 = 22", None),
])
def test_a_worked_verdict_is_its_last_verdict_word(text, want):
    """`worked: true` reads the last verdict word: a worked reply may name 'the correct
    answer' before it judges (the first word would accept every such reply)."""
    assert verdict(text, last=True) == want


def test_reward_table_all_four_cases():
    """Right answers pay the solver 1 whatever the verdict; the verifier earns 1 for a right
    verdict, 0 for rejecting a right answer, and a wrong answer accepted costs both."""
    assert rewards(True, [ACCEPT]) == (1.0, [1.0])
    assert rewards(True, [REJECT]) == (1.0, [0.0])
    assert rewards(False, [REJECT]) == (0.0, [1.0]) and str(rewards(False, [REJECT])[0]) == "0.0"
    assert rewards(False, [ACCEPT]) == (SOLVER_FOOLED, [VERIFIER_FOOLED])
    assert SOLVER_FOOLED < 0 and VERIFIER_FOOLED < 0
    assert rewards(True, [None]) == (1.0, [0.0]) and rewards(False, [None]) == (0.0, [0.0])
    # Several verdicts of one wrong answer: the solver pays for the share that accepted it.
    assert rewards(False, [ACCEPT, REJECT]) == (SOLVER_FOOLED / 2, [VERIFIER_FOOLED, 1.0])


class ScriptedActor:
    """Solver: samples 0 and 1 of each task right, 2 and 3 wrong (answer + 1), written as
    `a + b = n`; verifier: accepts answers 0 and 2 of each task, rejects 1 and 3."""

    def __init__(self, codec, tasks):
        self.codec, self.tasks = codec, tasks
        self.roles = frozenset({"solver", "verifier"})
        self.seen: dict[str, list[str]] = {}

    def generate(self, role, prompts, *, samples, max_new_tokens, stop=()):
        self.seen[role] = [self.codec.decode(p) for p in prompts]
        if role == "solver":
            texts = [f"{t.task_id.replace('+', ' + ')} = {int(t.answer) + (s >= 2)}"
                     for t in self.tasks for s in range(samples)]
        else:
            texts = [("The student's answer is correct." if i % 2 == 0 else "No, it is wrong.")
                     for i in range(len(prompts)) for _ in range(samples)]
        ids = [self.codec.encode(x)[:max_new_tokens] for x in texts]
        return Generation(ids, [[-0.5] * len(c) for c in ids], ["stop"] * len(ids))

    def env_wait(self):
        pass


def test_episodes_reward_each_case_and_show_the_solvers_answer_not_the_gold(bpe_model_dir):
    codec = load_codec(bpe_model_dir)
    env = MathEnv(**ENV)
    wf = Judge(env, codec, samples_per_prompt=4, max_new_tokens=24)
    tasks = [env.sample(random.Random(s)) for s in (1, 2)]
    actor = ScriptedActor(codec, tasks)
    parts = wf.episodes(tasks, actor)
    solver = [p for p in parts if p.role == "solver"]
    judged = [p for p in parts if p.role == "verifier"]
    assert len(solver) == len(judged) == 8
    # Per task: right+accepted, right+rejected, wrong+accepted, wrong+rejected.
    assert [p.reward for p in solver] == [1.0, 1.0, SOLVER_FOOLED, 0.0] * 2
    assert [p.reward for p in judged] == [1.0, 0.0, VERIFIER_FOOLED, 1.0] * 2
    assert [p.extras["accepted"] for p in solver] == [1, 0, 1, 0] * 2
    for i, (p, shown) in enumerate(zip(judged, actor.seen["verifier"], strict=True)):
        t = tasks[i // 4]
        a, b = t.task_id.split("+")
        answer = int(t.answer) + (i % 4 >= 2)
        # The question (without its format instruction) and the answer the reward scored.
        assert f"What is {a} + {b}?" in shown and "Reply with only" not in shown
        assert f"The student answered: {answer}\n" in shown
        assert p.loss_mask == [1] * len(p.completion_ids) and p.group == f"v{i // 4}"
        assert p.task_id == t.task_id
    # The rewards depend on the verdict, so no role plays alone.
    assert wf.needs("solver", ("solver", "verifier")) == frozenset({"verifier"})
    assert wf.needs("verifier", ("solver", "verifier")) == frozenset({"solver"})


def test_several_verdicts_of_one_answer_are_one_group(bpe_model_dir):
    """`judge_samples: 2`: each answer's two verdicts share a group (one prompt), so the
    advantage compares judgements of the same answer; their rewards follow the table."""
    codec = load_codec(bpe_model_dir)
    env = MathEnv(**ENV)
    wf = Judge(env, codec, samples_per_prompt=4, max_new_tokens=24, judge_samples=2)
    tasks = [env.sample(random.Random(s)) for s in (1, 2)]
    judged = [p for p in wf.episodes(tasks, ScriptedActor(codec, tasks)) if p.role == "verifier"]
    assert len(judged) == 16
    assert [p.group for p in judged] == [f"v{i // 2}" for i in range(16)]
    # answer i's two verdicts are the scripted verdict of prompt i (accept for even i)
    assert [p.reward for p in judged] == [1.0, 1.0, 0.0, 0.0, VERIFIER_FOOLED,
                                          VERIFIER_FOOLED, 1.0, 1.0] * 2


def test_balance_adds_constructed_answers_that_train_the_verifier_only(bpe_model_dir):
    """`balance: true`: after each task's k solver answers the verifier judges k more (the
    gold answer per wrong solver answer, a near miss per right one), so what it judges is
    half right; those verdicts are in its task's group and rewards, never the solver's."""
    codec = load_codec(bpe_model_dir)
    env = MathEnv(**ENV)
    params = {"balance": True}
    wf = Judge(env, codec, samples_per_prompt=4, max_new_tokens=24, **params)
    assert Judge.parts_per_task("verifier", params, 4) == 8
    assert Judge.parts_per_task("solver", params, 4) == 4
    tasks = [env.sample(random.Random(s)) for s in (1, 2)]
    actor = ScriptedActor(codec, tasks)
    parts = wf.episodes(tasks, actor)
    solver = [p for p in parts if p.role == "solver"]
    judged = [p for p in parts if p.role == "verifier"]
    assert len(solver) == 8 and len(judged) == 16
    # The solver's rewards and accept counts come from its own answers' verdicts alone.
    assert [p.reward for p in solver] == [1.0, 1.0, SOLVER_FOOLED, 0.0] * 2
    assert [p.extras["accepted"] for p in solver] == [1, 0, 1, 0] * 2
    for t, task in enumerate(tasks):
        mine = judged[8 * t:8 * (t + 1)]
        assert {p.group for p in mine} == {f"v{t}"} and {p.task_id for p in mine} == {task.task_id}
        shown = [x.split("The student answered: ")[1].split("\n")[0]
                 for x in actor.seen["verifier"][8 * t:8 * (t + 1)]]
        assert sum(a == task.answer for a in shown) == 4  # half right: 2 solver + 2 gold
        assert [p.extras.get("constructed", False) for p in mine] == [False] * 4 + [True] * 4
        for i, (p, a) in enumerate(zip(mine, shown, strict=True)):
            accepted = i % 2 == 0  # the script accepts every other prompt
            assert [p.reward] == rewards(a == task.answer, [ACCEPT if accepted else REJECT])[1]
    # Every right answer is balanced by a near miss, never by the answer itself.
    rng = random.Random(0)
    extra = wf.constructed(tasks[0], [True] * 4, rng)
    assert len(extra) == 4 and tasks[0].answer not in extra
    assert wf.constructed(tasks[0], [False] * 4, rng) == [tasks[0].answer] * 4


def test_worked_verdicts_get_room_and_the_last_word(bpe_model_dir):
    """`worked: true`: the verifier's message asks it to work the answer out first, its
    turn is `verdict_tokens` long whatever the flow's max_new_tokens, and held-out items
    and demos read and write the verdict at the end."""
    codec = load_codec(bpe_model_dir)
    wf = Judge(MathEnv(**ENV), codec, samples_per_prompt=2, max_new_tokens=12, worked=True,
               verdict_tokens=48)
    assert wf.max_new_tokens("verifier") == 48 and wf.max_new_tokens("solver") == 12
    assert Judge(MathEnv(**ENV), codec, samples_per_prompt=2, max_new_tokens=12,
                 worked=True).max_new_tokens("verifier") == 40
    items = wf.eval_items("verifier", 4)
    assert all("First work the answer out yourself" in it.prompt for it in items)
    said = "The correct answer is {}, so the student's answer is {}."
    tasks = wf.env.eval_tasks(4)
    accepts = [it.check(said.format(t.answer, "correct"))
               for it, t in zip(items, tasks, strict=True)]
    assert accepts == [True, False, True, False]
    demo = wf.demo("verifier", random.Random(1))
    assert "so the student's answer is" in codec.decode(demo.target_ids)
    with pytest.raises(ValueError, match="verdict_tokens"):
        Judge(MathEnv(**ENV), codec, samples_per_prompt=2, verdict_tokens=0)


def test_a_worked_verdict_pays_only_from_a_right_working(bpe_model_dir):
    """`worked: true`: a right verdict earns 1 only when the answer worked out before it is
    the task's; from a wrong working it earns 0; a wrong answer accepted costs -1 either
    way. The solver's reward is the table's. `pay_working: false` pays any right verdict."""
    codec = load_codec(bpe_model_dir)
    env = MathEnv(**ENV)
    tasks = [env.sample(random.Random(s)) for s in (1, 2)]

    class Worked(ScriptedActor):
        """Verifier: works out gold (prompts 0, 1 of each 4) or gold + 2 (2, 3), then
        accepts prompts 0 and 2, rejects 1 and 3."""

        def generate(self, role, prompts, *, samples, max_new_tokens, stop=()):
            if role == "solver":
                return super().generate(role, prompts, samples=samples,
                                        max_new_tokens=max_new_tokens)
            texts = []
            for i in range(len(prompts)):
                t = self.tasks[i // 4]
                own = int(t.answer) + (2 if i % 4 >= 2 else 0)
                word = "correct" if i % 2 == 0 else "incorrect"
                texts += [f"The answer is {own}, so the student's answer is {word}."] * samples
            ids = [self.codec.encode(x)[:max_new_tokens] for x in texts]
            return Generation(ids, [[-0.5] * len(c) for c in ids], ["stop"] * len(ids))

    wf = Judge(env, codec, samples_per_prompt=4, max_new_tokens=24, worked=True,
               verdict_tokens=40)
    parts = wf.episodes(tasks, Worked(codec, tasks))
    judged = [p for p in parts if p.role == "verifier"]
    # Answers per task: right, right, wrong, wrong. Verdicts: accept, reject, accept, reject.
    # Workings: right, right, wrong, wrong. So: paid, 0 (rejected a right answer), fooled,
    # 0 (a right verdict from a wrong working).
    assert [p.reward for p in judged] == [1.0, 0.0, VERIFIER_FOOLED, 0.0] * 2
    assert [p.reward for p in parts if p.role == "solver"] == [1.0, 1.0, SOLVER_FOOLED, 0.0] * 2
    assert wf.working_right(tasks[0], f"{tasks[0].answer}. So it is incorrect, 3 4 5.") is True
    assert wf.working_right(tasks[0], f"The answer is {tasks[0].answer}") is True
    assert wf.working_right(tasks[0], "It is correct.") is False
    loose = Judge(env, codec, samples_per_prompt=4, max_new_tokens=24, worked=True,
                  pay_working=False)
    judged = [p for p in loose.episodes(tasks, Worked(codec, tasks)) if p.role == "verifier"]
    assert [p.reward for p in judged] == [1.0, 0.0, VERIFIER_FOOLED, 1.0] * 2
    assert rewards(False, [REJECT, ACCEPT], [False, True]) == (SOLVER_FOOLED / 2,
                                                               [0.0, VERIFIER_FOOLED])


def full(codec, ids):
    """Every turn's text (`decode` stops at the first end of turn)."""
    return codec.tokenizer.decode(ids, skip_special_tokens=True)


class Blind(ScriptedActor):
    """Verifier, first turn (the question alone): the gold answer for prompts 0 and 1 of
    each task's 4, gold + 2 for 2 and 3; second turn (its answer, then the student's):
    accepts prompts 0 and 2, rejects 1 and 3."""

    def generate(self, role, prompts, *, samples, max_new_tokens, stop=()):
        if role == "solver":
            return super().generate(role, prompts, samples=samples, max_new_tokens=max_new_tokens)
        self.seen.setdefault(role, []).append([full(self.codec, p) for p in prompts])
        first = "The student answered" not in full(self.codec, prompts[0])
        texts = []
        for i in range(len(prompts)):
            t = self.tasks[i // 4]
            texts += ([str(int(t.answer) + (2 if i % 4 >= 2 else 0))] if first else
                      ["correct" if i % 2 == 0 else "incorrect"]) * samples
        ids = [self.codec.encode(x)[:max_new_tokens] for x in texts]
        return Generation(ids, [[-0.5] * len(c) for c in ids], ["stop"] * len(ids))


def test_a_blind_verifier_answers_before_it_sees_the_answer(bpe_model_dir):
    """`blind: true`: the verifier's first turn is the question alone (the solver's
    prompt); then it is shown the student's answer and gives its verdict. One row holds
    both turns, the message between them masked out of the loss; a right verdict pays
    only from a right first answer."""
    codec = load_codec(bpe_model_dir)
    env = MathEnv(**ENV)
    tasks = [env.sample(random.Random(s)) for s in (1, 2)]
    wf = Judge(env, codec, samples_per_prompt=4, max_new_tokens=24, blind=True)
    actor = Blind(codec, tasks)
    parts = wf.episodes(tasks, actor)
    judged = [p for p in parts if p.role == "verifier"]
    first, second = actor.seen["verifier"]
    assert all(tasks[i // 4].prompt in x and "answered" not in x for i, x in enumerate(first))
    for i, x in enumerate(second):
        answer = int(tasks[i // 4].answer) + (i % 4 >= 2)  # the solver's, per the script
        assert tasks[i // 4].prompt in x and f"The student answered: {answer}\n" in x
    # Own answer right, right, wrong, wrong; verdicts accept, reject, accept, reject on
    # answers right, right, wrong, wrong: paid, 0, fooled, 0 (a wrong own answer).
    assert [p.reward for p in judged] == [1.0, 0.0, VERIFIER_FOOLED, 0.0] * 2
    for p in judged:
        assert p.prompt_ids == wf.encode_prompt(tasks[0 if p.task_id == tasks[0].task_id
                                                     else 1].prompt)
        assert "The student answered" in full(codec, p.completion_ids)
        # own answer (trained), the message (masked), the verdict (trained)
        masked = [i for i, m in enumerate(p.loss_mask) if m == 0]
        assert masked and p.loss_mask[0] == 1 and p.loss_mask[-1] == 1
        assert "The student answered" in full(codec, [p.completion_ids[i] for i in masked])
    demo = wf.demo("verifier", random.Random(3))
    assert 0 in demo.target_mask and demo.target_mask[0] == 1
    with pytest.raises(ValueError, match="one of worked and blind"):
        Judge(env, codec, samples_per_prompt=4, blind=True, worked=True)


def test_a_blind_verifier_is_scored_on_both_turns(bpe_model_dir):
    """Held out, a blind verifier answers the question, then judges the item's answer."""
    codec = load_codec(bpe_model_dir)
    env = MathEnv(**ENV)
    wf = Judge(env, codec, samples_per_prompt=2, blind=True)
    items = wf.eval_items("verifier", 6)
    tasks = env.eval_tasks(6)

    class Engine:
        """Answers every question right, then accepts an answer iff it equals its own."""

        def generate(self, prompts, *, max_new_tokens, greedy):
            out = []
            for p in prompts:
                x = full(codec, p)
                t = next(t for t in tasks if t.prompt in x)
                if "The student answered: " not in x:
                    out.append(codec.encode(t.answer))
                else:
                    shown = x.split("The student answered: ")[1].split("\n")[0]
                    out.append(codec.encode("correct" if shown == t.answer else "incorrect"))
            return Generation(out, [[0.0] * len(c) for c in out], ["stop"] * len(out))

    assert all(it.prompt == t.prompt for it, t in zip(items, tasks, strict=True))
    assert wf.score("verifier", Engine(), items) == 1.0


def test_held_out_judgement_is_balanced_and_scored_by_the_verdict(bpe_model_dir):
    wf = Judge(MathEnv(**ENV), load_codec(bpe_model_dir), samples_per_prompt=2)
    items = wf.eval_items("verifier", 20)
    tasks = wf.env.eval_tasks(20)
    accept = [it.check("The student's answer is correct.") for it in items]
    reject = [it.check("The student's answer is incorrect.") for it in items]
    assert accept == [i % 2 == 0 for i in range(20)] and reject == [not a for a in accept]
    assert not any(it.check("I cannot tell.") for it in items)
    for i, (it, t) in enumerate(zip(items, tasks, strict=True)):
        shown = it.prompt.split("The student answered: ")[1].split("\n")[0]
        assert (shown == t.answer) == (i % 2 == 0)
    assert wf.metric_name("verifier") == "judgement accuracy"
    assert [it.check(t.answer) for it, t in zip(wf.eval_items("solver", 20), tasks,
                                                 strict=True)] == [True] * 20


def test_rollout_worker_writes_both_tables_from_one_batch(tmp_path, bpe_model_dir):
    from astraflow.rollout.worker import RolloutWorker

    model = {"kind": "hf", "path": str(bpe_model_dir)}
    ctx = seeded_run(tmp_path / "run", {
        "name": "j", "policies": [{"name": "solver", "model": model},
                                  {"name": "verifier", "model": model}],
        "workflow": {"name": "judge"},
        "env": {**ENV, "eval_size": 20},
        "rollout": {"prompts_per_batch": 3, "samples_per_prompt": 2, "max_new_tokens": 8,
                    "temperature": 1.0},
    }, bpe_model_dir, every_policy=True)
    w = RolloutWorker(ctx, "wA")
    assert w.refresh_weights()
    assert w.produce_batch() == 3 * 2 * 2
    traj, codec, env = ctx.trajectories(), load_codec(bpe_model_dir), MathEnv(**ENV)
    solver = traj.read_range("solver", 0, 10**9).to_pylist()
    judged = traj.read_range("verifier", 0, 10**9).to_pylist()
    assert len(solver) == len(judged) == 6 == ctx.flow.batch_rows("verifier")
    for s, v in zip(solver, judged, strict=True):  # one verdict per answer, in order
        assert s["task_id"] == v["task_id"]
        a, b = (int(x) for x in s["task_id"].split("+"))
        right = env.reward(env._task(a, b), codec.decode(s["completion_ids"])) == 1.0
        want_s, want_v = rewards(right, [verdict(codec.decode(v["completion_ids"]))])
        assert (s["reward"], v["reward"]) == (want_s, want_v[0])
        assert "The student answered:" in codec.decode(v["prompt_ids"])


def test_smollm2_gives_verdicts_the_parser_reads(smollm2_dir):
    """The real model, sampled as in training: most replies hold a verdict (at 0.7 some
    ramble past 12 tokens first, and earn 0), and the rows' rewards follow the table
    from the gold answer and the verdict; greedy, every reply holds one."""
    from astraflow.rollout.engine import HFEngine

    eng = HFEngine.from_dir(smollm2_dir)
    env = MathEnv(**ENV)
    wf = Judge(env, eng.codec, samples_per_prompt=2, max_new_tokens=12)
    gen = torch.Generator().manual_seed(0)

    class Actor:
        codec, roles = eng.codec, frozenset({"solver", "verifier"})

        def generate(self, role, prompts, *, samples, max_new_tokens, stop=()):
            return eng.generate(prompts, samples_per_prompt=samples, temperature=0.7,
                                max_new_tokens=max_new_tokens, generator=gen)

        def env_wait(self):
            pass

    tasks = [env.sample(random.Random(s)) for s in range(6)]
    parts = wf.episodes(tasks, Actor())
    solver = [p for p in parts if p.role == "solver"]
    judged = [p for p in parts if p.role == "verifier"]
    said = [verdict(eng.codec.decode(p.completion_ids)) for p in judged]
    assert said.count(None) <= len(said) // 2, [eng.codec.decode(p.completion_ids) for p in judged]
    for i, (s, v, word) in enumerate(zip(solver, judged, said, strict=True)):
        right = env.reward(tasks[i // 2], eng.codec.decode(s.completion_ids)) == 1.0
        assert (s.reward, [v.reward]) == rewards(right, [word])
    # Greedy, on balanced held-out answers: a verdict for each (its accuracy is measured
    # in docs/agents.md, not asserted).
    items = wf.eval_items("verifier", 8)
    out = eng.generate([wf.encode_prompt(it.prompt) for it in items], max_new_tokens=12,
                       greedy=True)
    assert all(verdict(eng.codec.decode(c)) is not None for c in out.completions)
