"""`judge`: a solver answers; a verifier reads the question and the solver's answer in
natural language (never the gold answer) and replies whether it is right.

    task "What is 59 + 7?" ──solver (k samples)──► "59 + 7 = 66"
    verifier: "A student was asked … The student answered: 66. Is the student's answer
               correct? …" ──► "The student's answer is correct."   verdict: accept

The judge form of `solver_verifier` for chat models (SmolLM2), where judging is the
verifier's own skill (there the tiny model works the sum out and a tool compares). The
verifier sees the answer the reward scores, so a verdict is right exactly when it agrees
with the reward; a wrong answer judged right costs both (`rewards`). Both rewards hang on
the verdict, so the roles play together, never the solver alone. Held-out: the solver's
accuracy; the verifier's judgement accuracy on balanced right answers and near misses.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from astraflow.envs.math import SUFFIX, MathEnv, Task, parse_answer
from astraflow.models.turns import continuation
from astraflow.workflows.base import Actor, Demo, EvalItem, Part, Workflow
from astraflow.workflows.single import SingleTurn
from astraflow.workflows.solver_verifier import SolverVerifier, near_miss

if TYPE_CHECKING:
    from astraflow.rollout.generation import Generation

ACCEPT, REJECT = "accept", "reject"
TEMPLATE = ('A student was asked: "{question}"\nThe student answered: {answer}\n'
            "Is the student's answer correct? Answer with one word: correct or incorrect.")
"""The verifier's user message. Measured on SmolLM2's version 0 (greedy, balanced
held-out answers), this wording split its verdicts between both words; "Reply with
only yes or no" drew "No, …" for nine answers in ten."""
WORKED = ('A student was asked: "{question}"\nThe student answered: {answer}\n'
          "First work the answer out yourself. Then say whether the student's answer is "
          "correct: end with one word, correct or incorrect.")
"""The verifier's message with `worked: true`: it may compute before it judges, so it can
judge with the solver's own skill; its last verdict word counts ("The correct answer is
67, so it is incorrect" rejects)."""
ASK = ("The student answered: {answer}\nIs the student's answer correct? Answer with one "
       "word: correct or incorrect.")
"""The verifier's second message with `blind: true`, after it answered the question."""
#: Verdict words; the first one in the reply counts ("No, the correct answer is 67" rejects).
#: A negation up to two words before "correct"/"right" rejects: SmolLM2 learnt to write
#: "The student's answer is not entirely correct." (read as an accept before this).
_VERDICT = re.compile(r"((?:\bnot|n't)\s+(?:\w+\s+){0,2}?(?:correct|right)\b"
                      r"|\b(?:incorrect|wrong|false|no|yes|correct|right|true)\b)", re.I)
#: A wrong answer accepted: the costliest outcome of the pair, since that is the answer the
#: pair would hand on. The verifier loses more than a false reject (0) costs it, which also
#: keeps "accept everything" from paying while the solver is mostly right; the solver's
#: cost stays below a right answer's gain, so being right remains what it learns first.
SOLVER_FOOLED, VERIFIER_FOOLED = -0.5, -1.0


def verdict(text: str, *, last: bool = False) -> str | None:
    """`accept` or `reject` from the verifier's reply: its first verdict word (yes,
    correct, right, true / no, incorrect, wrong, false, not [up to two words] correct),
    or its last with `last` (a worked reply states its verdict at the end); None when it
    has none."""
    found = list(_VERDICT.finditer(text)) if last else [m for m in [_VERDICT.search(text)] if m]
    if not found:
        return None
    word = found[-1].group(1).lower()
    return ACCEPT if word in ("yes", "correct", "right", "true") else REJECT


def rewards(right: bool, verdicts: Sequence[str | None],
            sound: Sequence[bool] | None = None) -> tuple[float, list[float]]:
    """(solver's reward, one reward per verdict) for an answer and the verdicts it drew:

        answer  verdict   solver  verifier
        right   accept     1       1
        right   reject     1       0
        wrong   reject     0       1
        wrong   accept    -0.5    -1     (SOLVER_FOOLED, VERIFIER_FOOLED)
        any     none      1 / 0    0     (no verdict: accepts nothing, rejects nothing)

    With several verdicts the solver pays the share of them that accepted it wrongly.
    `sound` (one per verdict, `worked` verdicts): a right verdict pays 1 only when the
    working before it was right, else 0; a wrong answer accepted costs -1 either way."""
    per = []
    for i, v in enumerate(verdicts):
        if v is None:
            per.append(0.0)
        elif (v == ACCEPT) == right:
            per.append(1.0 if sound is None or sound[i] else 0.0)
        else:
            per.append(VERIFIER_FOOLED if v == ACCEPT else 0.0)
    if right:
        return 1.0, per
    fooled = sum(v == ACCEPT for v in verdicts) / max(len(verdicts), 1)
    return (SOLVER_FOOLED * fooled if fooled else 0.0), per  # never -0.0 in a table


def question(env: Any, task: Task) -> str:
    """The task as a question, without the instruction on how to format the answer."""
    text = task.prompt
    for suffix in (SUFFIX, getattr(env, "suffix", "")):
        if suffix:
            text = text.removesuffix(suffix)
    return text.strip()


def shown_answer(env: Any, text: str) -> str:
    """What the verifier is shown of a reply: the answer its reward scores (the last
    number for math, the env's `answer_of` where it has one), else the reply as written."""
    found: Any = None
    if isinstance(env, MathEnv) and env.style != "compact":
        found = parse_answer(text)
    elif callable(getattr(env, "answer_of", None)):
        found = env.answer_of(text)
    return str(found) if found is not None else (text.strip() or "(nothing)")


class Judge(SolverVerifier):
    """`solver_verifier`'s roles and parameters (`verifiers`, `judge_samples`); the
    verifier judges in its own words instead of working the answer out through a tool.

    Options for the verifier's own learning (off by default, the paper's shape):
    `worked: true` asks it to work the answer out before its verdict (`WORKED`, the
    last verdict word counts, `verdict_tokens` long); `blind: true` has it answer the
    question in a turn of its own before it sees the answer (`ASK`); `balance: true`
    has it also judge as many constructed answers per task (the gold answer, or a near
    miss) as make the task's judged answers half right and half wrong. Those extra
    verdicts train the verifier only: the solver's reward hangs on its own answers'
    verdicts. A worked or blind verdict pays only from a right working unless
    `pay_working: false`."""

    def __init__(self, env, codec, *, samples_per_prompt: int, worked: bool = False,
                 blind: bool = False, pay_working: bool = True, balance: bool = False,
                 verdict_tokens: int | None = None, **params: Any):
        super().__init__(env, codec, samples_per_prompt=samples_per_prompt, **params)
        if verdict_tokens is not None and verdict_tokens < 1:
            raise ValueError("workflow.params.verdict_tokens must be >= 1")
        if worked and blind:
            raise ValueError("workflow.params: choose one of worked and blind (blind works "
                             "the answer out in a turn of its own)")
        self.worked, self.blind = worked, blind
        self.balance, self.verdict_tokens = balance, verdict_tokens
        self.pay_working = (worked or blind) and pay_working
        """A worked verdict pays only when its working is right (`working_right`): paid
        for any right verdict, the measured SmolLM2 verifier's answers got no better
        and its verdicts swung to rejecting everything (docs/benchmarks/
        multi-policy-smollm2.md), as `solver_verifier`'s tiny one learnt to disagree."""

    @classmethod
    def parts_per_task(cls, role: str, params, samples_per_prompt: int) -> int:
        """With `balance`, a verifier judges each task's k answers and k constructed ones."""
        n = super().parts_per_task(role, params, samples_per_prompt)
        return n if role == "solver" or not params.get("balance", False) else 2 * n

    def needs(self, role: str, roles: Sequence[str]) -> frozenset[str]:
        """Every other role: the solver's reward depends on the verdict too."""
        return Workflow.needs(self, role, roles)

    def judge_prompt(self, task: Task, answer: str) -> list[int]:
        """The verifier's prompt (`TEMPLATE`, or `WORKED`) as a user message through the
        chat template."""
        return self.encode_prompt(self.judge_text(task, answer))

    def judge_text(self, task: Task, answer: str) -> str:
        return (WORKED if self.worked else TEMPLATE).format(question=question(self.env, task),
                                                            answer=answer)

    def read_verdict(self, text: str) -> str | None:
        return verdict(text, last=self.worked)

    def working_right(self, task: Task, text: str) -> bool:
        """Whether a worked reply's own answer, the last number before its verdict (or in
        the whole reply when it has none), is the task's answer."""
        found = list(_VERDICT.finditer(text))
        return self.env.reward(task, text[:found[-1].start()] if found else text) == 1.0

    def verdict_group(self, answer: int) -> str:
        """The GRPO group of judged answer number `answer`'s verdicts (answers numbered
        task by task, each task's constructed ones after its solver answers). With
        several verdicts per answer (`judge_samples` >= 2) it is that answer's: one
        prompt, so the advantage compares judgements of the same answer, a signal about
        judging whatever the share of right answers (once the solver is mostly right, a
        group of the task's answers is mostly four right ones with one verdict each,
        which says nothing about wrong ones). With one verdict per answer the task's
        judged answers form one group, which teaches only where those answers differ in
        rightness (always, with `balance`)."""
        per_task = self.k * (2 if self.balance else 1)
        return f"v{answer}" if self.judge_samples > 1 else f"v{answer // per_task}"

    def one_turn(self, actor: Actor, role: str, prompts: list[list[int]]) -> list[tuple]:
        """The verdict in one turn: per prompt and sample, (segments, verdict text,
        working text, finish reason)."""
        g = actor.generate(role, prompts, samples=self.judge_samples,
                           max_new_tokens=self.max_new_tokens(role))
        return [([(c, lp)], text, text, why)
                for c, lp, why in zip(g.completions, g.logprobs, g.finish_reasons, strict=True)
                for text in [self.codec.decode(c)]]

    def blind_turns(self, generate: Callable[..., Generation], role: str,
                    prompts: list[list[int]], answers: list[str], samples: int) -> list[tuple]:
        """`blind`: the verifier answers the question itself (its first turn, as long as
        the solver's), and only then is shown the student's answer (`ASK`) and gives its
        verdict; one row of both turns, the message between them masked. So it cannot
        copy the answer it judges into its working. `generate(prompts, samples,
        max_new_tokens)` samples for training or plays greedily for held-out checks.
        Per prompt and sample, as `one_turn`."""
        codec = self.codec
        first = generate(prompts, samples, self.max_new_tokens("solver"))
        asks = [continuation(codec, own, [{"role": "user",
                                           "content": ASK.format(answer=answers[j // samples])}])
                for j, own in enumerate(first.completions)]
        contexts = [list(prompts[j // samples]) + list(own) + ask
                    for j, (own, ask) in enumerate(zip(first.completions, asks, strict=True))]
        second = generate(contexts, 1, self.max_new_tokens(role))
        return [([(c1, lp1), (ask, None), (c2, lp2)], codec.decode(c2), codec.decode(c1), why)
                for c1, lp1, ask, c2, lp2, why in zip(
                    first.completions, first.logprobs, asks, second.completions,
                    second.logprobs, second.finish_reasons, strict=True)]

    def constructed(self, task: Task, right: Sequence[bool], rng: random.Random) -> list[str]:
        """`balance`'s extra answers for one task whose solver answers were `right`: one
        gold answer per wrong solver answer and one near miss per right one, so the k
        answers and these k are half right and half wrong; shuffled so their order says
        nothing."""
        out = [task.answer] * sum(not r for r in right)
        out += [near_miss(task.answer, rng) for r in right if r]
        rng.shuffle(out)
        return out

    def episodes(self, tasks: list[Task], actor: Actor) -> list[Part]:
        codec, k, m = self.codec, self.k, self.judge_samples
        parts = SingleTurn.episodes(self, tasks, actor)  # the solver's turn (and its env wait)
        judges = [r for r in self.verifier_roles if r in actor.roles]
        if not judges:  # the roles play together (`needs`): only a direct call gets here
            return parts
        right = [p.reward == 1.0 for p in parts]
        shown = [shown_answer(self.env, codec.decode(p.completion_ids)) for p in parts]
        # Judged answers, task by task: its k solver answers (index into parts), then with
        # `balance` its k constructed ones (None).
        judged_ix: list[int | None] = []
        texts: list[str] = []
        truth: list[bool] = []
        for t, task in enumerate(tasks):
            own = range(t * k, (t + 1) * k)
            judged_ix += own
            texts += [shown[i] for i in own]
            truth += [right[i] for i in own]
            if self.balance:
                rng = random.Random(f"{task.task_id}/{[right[i] for i in own]}/{len(texts)}")
                extra = self.constructed(task, [right[i] for i in own], rng)
                judged_ix += [None] * len(extra)
                texts += extra
                truth += [a == task.answer for a in extra]
        per_task = len(texts) // len(tasks)
        task_of = [tasks[i // per_task] for i in range(len(texts))]
        if self.blind:
            prompts = [self.encode_prompt(t.prompt) for t in task_of]
            turns = {r: self.blind_turns(
                lambda p, n, most, r=r: actor.generate(r, p, samples=n, max_new_tokens=most),
                r, prompts, texts, m) for r in judges}
        else:
            prompts = [self.judge_prompt(t, a) for t, a in zip(task_of, texts, strict=True)]
            turns = {r: self.one_turn(actor, r, prompts) for r in judges}
        actor.env_wait()
        # Per role, per judged answer: its m verdicts.
        said = {r: [[self.read_verdict(t[i * m + s][1]) for s in range(m)]
                    for i in range(len(prompts))] for r, t in turns.items()}
        out: list[Part] = []
        for r, got in turns.items():
            for i, prompt in enumerate(prompts):
                task = task_of[i]
                sound = ([self.working_right(task, got[i * m + s][2]) for s in range(m)]
                         if self.pay_working else None)
                _, per = rewards(truth[i], said[r][i], sound)
                for s in range(m):
                    segments, _, _, why = got[i * m + s]
                    part = Part.from_segments(r, task.task_id, self.verdict_group(i), prompt,
                                              segments, per[s], finish_reason=why)
                    if judged_ix[i] is None:
                        part.extras["constructed"] = True
                    out.append(part)
        for i, ix in enumerate(judged_ix):
            if ix is None:
                continue
            every = [v for r in judges for v in said[r][i]]
            parts[ix].reward, _ = rewards(right[ix], every)
            parts[ix].extras["accepted"] = sum(v == ACCEPT for v in every)
        return parts + out

    def demo(self, role: str, rng: random.Random) -> Demo:
        """The verifier's warm-start example (pretrained policies take none by default):
        a right answer or a near miss, half each, and the one-word verdict."""
        if role == "solver":
            return super().demo(role, rng)
        t = self.env.sample(rng)
        right = rng.random() < 0.5
        cand = t.answer if right else near_miss(t.answer, rng)
        word = "correct" if right else "incorrect"
        if self.blind:  # its own answer, the student's shown (read only), the verdict
            own, said = self.encode_answer(t.answer), self.encode_answer(word)
            ask = continuation(self.codec, own, [{"role": "user",
                                                  "content": ASK.format(answer=cand)}])
            return Demo(self.encode_prompt(t.prompt), own + ask + said,
                        [1] * len(own) + [0] * len(ask) + [1] * len(said))
        said = (f"The answer is {t.answer}, so the student's answer is {word}." if self.worked
                else word)
        target = self.encode_answer(said)
        return Demo(self.judge_prompt(t, cand), target, [1] * len(target))

    def items(self, role: str, tasks: list[Task], rng: random.Random) -> list[EvalItem]:
        if role == "solver":
            return SingleTurn.items(self, role, tasks, rng)
        out = []
        for i, t in enumerate(tasks):
            right = i % 2 == 0  # balanced: a right answer, then a near miss
            cand = t.answer if right else near_miss(t.answer, rng)
            want = ACCEPT if right else REJECT
            out.append(EvalItem(t.prompt if self.blind else self.judge_text(t, cand),
                                lambda text, w=want: self.read_verdict(text) == w,
                                {"answer": cand}))
        return out

    def score(self, role: str, engine: Any, items: list[EvalItem], batch: int = 500) -> float:
        """`blind` verifiers play both turns greedily (their answer, then the verdict on
        the item's answer); everything else is one turn, as `Workflow.score`."""
        if role == "solver" or not self.blind:
            return super().score(role, engine, items, batch)
        def greedy(prompts: list[list[int]], samples: int, most: int) -> Generation:
            return engine.generate(prompts, max_new_tokens=most, greedy=True)

        right = 0
        for i in range(0, len(items), batch):
            chunk = items[i : i + batch]
            played = self.blind_turns(greedy, role, [self.encode_prompt(it.prompt) for it in chunk],
                                      [it.data["answer"] for it in chunk], 1)
            right += sum(bool(it.check(said)) for it, (_, said, _, _) in
                         zip(chunk, played, strict=True))
        return right / max(len(items), 1)

    def max_new_tokens(self, role: str) -> int:
        """A verifier's `verdict_tokens` where set, else with `worked` the workflow's own
        40 (a worked verdict needs more room than the solver's answer, which the flow's
        `rollout.max_new_tokens` is sized for), else the flow's or the default."""
        if role != "solver" and self.verdict_tokens is not None:
            return self.verdict_tokens
        if role != "solver" and self.worked:
            return self.default_max_new_tokens(role)
        return super().max_new_tokens(role)

    def default_max_new_tokens(self, role: str) -> int:
        """The verifier's: room for a one-sentence verdict ("The student's answer is
        incorrect." is 7 SmolLM2 tokens and the end of turn), or for a worked one."""
        if role == "solver":
            return super().default_max_new_tokens(role)
        return 40 if self.worked else 16
