"""`solver_verifier`: a solver answers, one or more verifiers judge the answer.

    task "42+17="  ──solver (k samples)──► "59"            reward: the answer is right
                     env wait (one turn)
    for each answer, each verifier plays two turns:
      "42+17="     ──verifier──► "59"                      (works the sum out itself)
      ";58?"       (the solver's answer, shown by the workflow)
                   ──verifier──► "YN"                      one mark per digit of the shown
                                                           answer; verdict Y iff all marks Y
                     env wait (one turn; the verifiers judge concurrently)
    verifier reward: its verdict is right (Y for a right answer, N for a wrong one)

Why this shape: a ~1 M-parameter character model did not learn to judge
`042+917=959?` with one token within a warm-start budget (validation stayed
near chance for 900 supervised steps, and a bare "are these two numbers
equal" task took it 300+ steps to leave chance). Working the sum out first
uses the same token positions as the solver's answer, so a verifier
warm-started from the solver's version 0 (`warm_start.init_from: solver`)
starts with its arithmetic; marking digit by digit makes each judgement token
a comparison of two digits at fixed distances, which it learns far sooner.

Rows: the solver's part is its answer (mask all 1). A verifier's part is its
own answer (mask 1), then `;answer?` that it only read (mask 0), then its
marks (mask 1): the exact token sequence it saw, trained only on its own
tokens. Held-out judgement accuracy is measured on a fixed, balanced set: for
each held-out task either the right answer or a near miss (one digit changed,
or off by 1, 10 or 100: the slips a solver makes), so always answering "all
right" or "wrong" scores 50%.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from astraflow.envs.math import Task
from astraflow.workflows.base import Actor, Demo, EvalItem, Part, Workflow

YES, NO = "Y", "N"


def near_miss(answer: str, rng: random.Random) -> str:
    """A wrong answer close to the right one (what a half-trained solver writes)."""
    v = int(answer)
    if rng.random() < 0.5:
        digits = list(str(v))
        i = rng.randrange(len(digits))
        digits[i] = rng.choice([d for d in "0123456789" if d != digits[i]])
        w = int("".join(digits))
    else:
        w = v + rng.choice([1, -1, 10, -10, 100, -100])
    return str(w) if w != v and w >= 0 else str(v + 1)


def marks(own: str, shown_answer: str) -> str:
    """The right marks: Y where the shown answer's digit equals the verifier's own,
    right-aligned (a missing digit on either side is a mismatch)."""
    w = max(len(own), len(shown_answer), 1)
    a, b = own.rjust(w, " "), shown_answer.rjust(w, " ")
    return "".join(YES if x == y and x != " " else NO for x, y in zip(a, b, strict=True))


def verdict(mark_text: str) -> str:
    """Y iff the verifier marked at least one digit and every mark is Y."""
    text = mark_text.strip()
    return YES if text and set(text) == {YES} else NO


def shown(answer_text: str) -> str:
    """What the workflow shows a verifier after its own turn: `;<answer>?`."""
    return f";{answer_text}?"


class SolverVerifier(Workflow):
    metric: ClassVar[dict[str, str]] = {"solver": "accuracy"}

    def __init__(self, env, codec, *, samples_per_prompt: int, verifiers: int = 1,
                 judge_samples: int = 1, **params: Any):
        super().__init__(env, codec, samples_per_prompt=samples_per_prompt, **params)
        if verifiers < 1 or judge_samples < 1:
            raise ValueError("workflow.params: verifiers and judge_samples must be >= 1")
        self.verifier_roles = self.role_names({"verifiers": verifiers})[1:]
        self.judge_samples = judge_samples

    @classmethod
    def role_names(cls, params) -> tuple[str, ...]:
        n = int(params.get("verifiers", 1))
        if n < 1:
            raise ValueError("workflow.params.verifiers must be >= 1")
        return ("solver", "verifier", *(f"verifier_{i}" for i in range(2, n + 1)))

    @classmethod
    def parts_per_task(cls, role: str, params, samples_per_prompt: int) -> int:
        return samples_per_prompt * (1 if role == "solver" else int(params.get("judge_samples", 1)))

    def metric_name(self, role: str) -> str:
        return "accuracy" if role == "solver" else "judgement accuracy"

    def _ids(self, text: str) -> list[int]:
        return self.codec.encode(text)[1:]  # no BOS: a continuation

    def episodes(self, tasks: list[Task], actor: Actor) -> list[Part]:
        codec, k, m = self.codec, self.k, self.judge_samples
        prompts = [codec.encode(t.prompt) for t in tasks]
        gen = actor.generate("solver", prompts, samples=k,
                             max_new_tokens=self.max_new_tokens("solver"))
        actor.env_wait()
        parts: list[Part] = []
        answers: list[tuple[str, bool]] = []  # per solver sample: (answer text, right?)
        for i, (comp, lps) in enumerate(zip(gen.completions, gen.logprobs, strict=True)):
            j = i // k
            text = codec.decode(comp)
            right = self.env.reward(tasks[j], text) == 1.0
            parts.append(Part.own_turn("solver", tasks[j].task_id, f"s{j}", prompts[j], comp, lps,
                                       float(right)))
            answers.append((text, right))
        per_task = k * m  # verifier episodes per task: m judgements of each of k answers
        for role in self.verifier_roles:
            own = actor.generate(role, prompts, samples=per_task,
                                 max_new_tokens=self.max_new_tokens(role))
            context = [self._ids(shown(answers[i // m][0])) for i in range(len(tasks) * per_task)]
            second = [prompts[i // per_task] + c + ctx
                      for i, (c, ctx) in enumerate(zip(own.completions, context, strict=True))]
            judged = actor.generate(role, second, samples=1,
                                    max_new_tokens=self.max_new_tokens(role))
            for i in range(len(second)):
                j = i // per_task
                text, right = answers[j * k + (i % per_task) // m]
                said = verdict(codec.decode(judged.completions[i]))
                reward = float((said == YES) == right)
                parts.append(Part.from_segments(role, tasks[j].task_id, f"v{j}", prompts[j], [
                    (own.completions[i], own.logprobs[i]),
                    (context[i], None),
                    (judged.completions[i], judged.logprobs[i]),
                ], reward))
        if self.verifier_roles:
            actor.env_wait()
        return parts

    def demo(self, role: str, rng: random.Random) -> Demo:
        t = self.env.sample(rng)
        eos = self.codec.eos_id
        answer = self._ids(t.answer) + [eos]
        if role == "solver":
            return Demo(self.codec.encode(t.prompt), answer, [1] * len(answer))
        cand = t.answer if rng.random() < 0.5 else near_miss(t.answer, rng)
        context = self._ids(shown(cand))
        judgement = self._ids(marks(t.answer, cand)) + [eos]
        return Demo(self.codec.encode(t.prompt), answer + context + judgement,
                    [1] * len(answer) + [0] * len(context) + [1] * len(judgement))

    def items(self, role: str, tasks: list[Task], rng: random.Random) -> list[EvalItem]:
        if role == "solver":
            return [EvalItem(t.prompt, lambda text, t=t: self.env.reward(t, text) == 1.0)
                    for t in tasks]
        out = []
        for i, t in enumerate(tasks):
            right = i % 2 == 0
            cand = t.answer if right else near_miss(t.answer, rng)
            want = YES if right else NO
            out.append(EvalItem(t.prompt, lambda text, w=want: verdict(text) == w,
                                {"candidate": cand}))
        return out

    def score(self, role: str, engine: Any, items: list[EvalItem], batch: int = 500) -> float:
        if role == "solver":
            return super().score(role, engine, items, batch)
        correct = 0
        for i in range(0, len(items), batch):
            chunk = items[i : i + batch]
            prompts = [self.codec.encode(it.prompt) for it in chunk]
            own = engine.generate(prompts, max_new_tokens=self.max_new_tokens(role), greedy=True)
            second = [p + c + self._ids(shown(it.data["candidate"]))  # type: ignore[index]
                      for p, c, it in zip(prompts, own.completions, chunk, strict=True)]
            judged = engine.generate(second, max_new_tokens=self.max_new_tokens(role),
                                     greedy=True)
            correct += sum(bool(it.check(self.codec.decode(c)))
                           for it, c in zip(chunk, judged.completions, strict=True))
        return correct / max(len(items), 1)

    def max_new_tokens(self, role: str) -> int:
        return self.env.max_new_tokens()  # an answer, or one mark per digit (+ EOS)
