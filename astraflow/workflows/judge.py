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
from collections.abc import Sequence
from typing import Any

from astraflow.envs.math import SUFFIX, MathEnv, Task, parse_answer
from astraflow.workflows.base import Actor, Demo, EvalItem, Part, Workflow
from astraflow.workflows.single import SingleTurn
from astraflow.workflows.solver_verifier import SolverVerifier, near_miss

ACCEPT, REJECT = "accept", "reject"
TEMPLATE = ('A student was asked: "{question}"\nThe student answered: {answer}\n'
            "Is the student's answer correct? Answer with one word: correct or incorrect.")
"""The verifier's user message. Measured on SmolLM2's version 0 (greedy, balanced
held-out answers), this wording split its verdicts between both words; "Reply with
only yes or no" drew "No, …" for nine answers in ten."""
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


def verdict(text: str) -> str | None:
    """`accept` or `reject` from the verifier's reply: its first verdict word (yes,
    correct, right, true / no, incorrect, wrong, false, not [up to two words] correct);
    None when it has none."""
    m = _VERDICT.search(text)
    if m is None:
        return None
    word = m.group(1).lower()
    return ACCEPT if word in ("yes", "correct", "right", "true") else REJECT


def rewards(right: bool, verdicts: Sequence[str | None]) -> tuple[float, list[float]]:
    """(solver's reward, one reward per verdict) for an answer and the verdicts it drew:

        answer  verdict   solver  verifier
        right   accept     1       1
        right   reject     1       0
        wrong   reject     0       1
        wrong   accept    -0.5    -1     (SOLVER_FOOLED, VERIFIER_FOOLED)
        any     none      1 / 0    0     (no verdict: accepts nothing, rejects nothing)

    With several verdicts the solver pays the share of them that accepted it wrongly."""
    per = []
    for v in verdicts:
        if v is None:
            per.append(0.0)
        elif (v == ACCEPT) == right:
            per.append(1.0)
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
    verifier judges in its own words instead of working the answer out."""

    def needs(self, role: str, roles: Sequence[str]) -> frozenset[str]:
        """Every other role: the solver's reward depends on the verdict too."""
        return Workflow.needs(self, role, roles)

    def judge_prompt(self, task: Task, answer: str) -> list[int]:
        """The verifier's prompt: `TEMPLATE` as a user message through the chat template."""
        return self.encode_prompt(TEMPLATE.format(question=question(self.env, task),
                                                  answer=answer))

    def verdict_group(self, answer: int) -> str:
        """The GRPO group of solver answer number `answer`'s verdicts. With several
        verdicts per answer (`judge_samples` >= 2) it is that answer's: one prompt, so
        the advantage compares judgements of the same answer, a signal about judging
        whatever the share of right answers (once the solver is mostly right, a group
        of the task's answers is mostly four right ones with one verdict each, which
        says nothing about wrong ones). With one verdict per answer there is no such
        group; the task's `k` answers' verdicts form one, and teach only where those
        answers differ in rightness."""
        return f"v{answer}" if self.judge_samples > 1 else f"v{answer // self.k}"

    def episodes(self, tasks: list[Task], actor: Actor) -> list[Part]:
        codec, k, m = self.codec, self.k, self.judge_samples
        parts = SingleTurn.episodes(self, tasks, actor)  # the solver's turn (and its env wait)
        judges = [r for r in self.verifier_roles if r in actor.roles]
        if not judges:  # the roles play together (`needs`): only a direct call gets here
            return parts
        right = [p.reward == 1.0 for p in parts]
        prompts = [self.judge_prompt(tasks[i // k],
                                     shown_answer(self.env, codec.decode(p.completion_ids)))
                   for i, p in enumerate(parts)]
        gens = {r: actor.generate(r, prompts, samples=m, max_new_tokens=self.max_new_tokens(r))
                for r in judges}
        actor.env_wait()
        # Per role, per solver answer: its m verdicts.
        said = {r: [[verdict(codec.decode(g.completions[i * m + s])) for s in range(m)]
                    for i in range(len(prompts))] for r, g in gens.items()}
        judged: list[Part] = []
        for r, g in gens.items():
            for i, prompt in enumerate(prompts):
                _, per = rewards(right[i], said[r][i])
                for s in range(m):
                    j = i * m + s
                    judged.append(Part.own_turn(r, parts[i].task_id, self.verdict_group(i), prompt,
                                                g.completions[j], g.logprobs[j], per[s],
                                                finish_reason=g.finish_reasons[j]))
        for i, p in enumerate(parts):
            every = [v for r in judges for v in said[r][i]]
            p.reward, _ = rewards(right[i], every)
            p.extras["accepted"] = sum(v == ACCEPT for v in every)
        return parts + judged

    def demo(self, role: str, rng: random.Random) -> Demo:
        """The verifier's warm-start example (pretrained policies take none by default):
        a right answer or a near miss, half each, and the one-word verdict."""
        if role == "solver":
            return super().demo(role, rng)
        t = self.env.sample(rng)
        right = rng.random() < 0.5
        target = self.encode_answer("correct" if right else "incorrect")
        return Demo(self.judge_prompt(t, t.answer if right else near_miss(t.answer, rng)),
                    target, [1] * len(target))

    def items(self, role: str, tasks: list[Task], rng: random.Random) -> list[EvalItem]:
        if role == "solver":
            return SingleTurn.items(self, role, tasks, rng)
        out = []
        for i, t in enumerate(tasks):
            right = i % 2 == 0  # balanced: a right answer, then a near miss
            cand = t.answer if right else near_miss(t.answer, rng)
            want = ACCEPT if right else REJECT
            out.append(EvalItem(TEMPLATE.format(question=question(self.env, t), answer=cand),
                                lambda text, w=want: verdict(text) == w))
        return out

    def default_max_new_tokens(self, role: str) -> int:
        """The verifier's: room for a one-sentence verdict ("The student's answer is
        incorrect." is 7 SmolLM2 tokens and the end of turn)."""
        return super().default_max_new_tokens(role) if role == "solver" else 16
