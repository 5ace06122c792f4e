"""`solver_verifier`: a solver answers; one or more verifiers judge the answer by
working it out again.

    task "42+17=" ──solver (k samples)──► "58"          reward: the answer is right
    each verifier: "42+17=" ──► "59" (its own working), then the comparison tool
                   ";58?N" (Y iff the two agree)         reward: right verdict from a
                                                         right working, else 0

The comparison is a tool because the tiny character model did not learn to compare
digit strings within a warm-start budget, and rewarding any right verdict taught the
verifier to disagree with the solver; so the verifier learns its working. Rows: the
solver's answer (mask 1); the verifier's working (mask 1) then the tool transcript
(mask 0). Held-out judgement accuracy: right answers and near misses, balanced. The
solver's reward needs no verifier, so it may play alone (`needs`).
"""

from __future__ import annotations

import random
from typing import Any

from astraflow.envs.math import Task
from astraflow.workflows.base import Actor, EvalItem, Part
from astraflow.workflows.single import SingleTurn

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


def agree(own_text: str, shown_answer: str) -> str:
    """The comparison tool: Y iff the verifier's working and the shown answer are the
    same number (an unparsable working confirms nothing)."""
    a, b = own_text.strip(), shown_answer.strip()
    return YES if a.isdigit() and b.isdigit() and int(a) == int(b) else NO


def transcript(answer_text: str, verdict: str) -> str:
    """What the tool writes after the verifier's working: `;<shown answer>?<verdict>`."""
    return f";{answer_text}?{verdict}"


class SolverVerifier(SingleTurn):
    """The solver's turn, demos and held-out checks are `single`'s; verifiers add theirs."""

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

    def needs(self, role: str, roles) -> frozenset[str]:
        """A verifier reads the solver's answer; the solver reads nothing, and its reward
        (the answer is right) is the same whether or not a verifier judges it, so it
        may play alone while a verifier's trainer is behind."""
        return frozenset() if role == "solver" else frozenset({"solver"})

    def episodes(self, tasks: list[Task], actor: Actor) -> list[Part]:
        codec, k, m = self.codec, self.k, self.judge_samples
        judges = [r for r in self.verifier_roles if r in actor.roles]
        parts = super().episodes(tasks, actor)  # the solver's turn (and its env wait)
        # Per solver sample, in order: (answer text, right?).
        answers = [(codec.decode(p.completion_ids), p.reward == 1.0) for p in parts]
        prompts = [self.encode_prompt(t.prompt) for t in tasks]
        # A verdict counts only when the working behind it is right. Rewarding any right
        # verdict pays the verifier for disagreeing with the solver: started from the
        # solver's weights it shares the solver's slips, so a wrong answer it would have
        # confirmed is one it was punished for computing. Seen here: its own working went
        # from 7.5% right to 1.9% (sampled) in 200 steps while its reward stayed flat.
        per_task = k * m  # verifier episodes per task: m judgements of each of k answers
        for role in judges:
            own = actor.generate(role, prompts, samples=per_task,
                                 max_new_tokens=self.max_new_tokens(role))
            for i, (comp, lps, why) in enumerate(zip(own.completions, own.logprobs,
                                                     own.finish_reasons, strict=True)):
                j = i // per_task
                text, right = answers[j * k + (i % per_task) // m]
                working = codec.decode(comp)
                said = agree(working, text)
                reward = float((said == YES) == right
                               and self.env.reward(tasks[j], working) == 1.0)
                tool = codec.encode(transcript(text, said))[1:]  # no BOS: a continuation
                parts.append(Part.from_segments(role, tasks[j].task_id, f"v{j}", prompts[j],
                                                [(comp, lps), (tool, None)], reward,
                                                finish_reason=why))
        if judges:
            actor.env_wait()
        return parts

    def items(self, role: str, tasks: list[Task], rng: random.Random) -> list[EvalItem]:
        if role == "solver":
            return super().items(role, tasks, rng)
        out = []
        for i, t in enumerate(tasks):
            right = i % 2 == 0
            cand = t.answer if right else near_miss(t.answer, rng)
            want = YES if right else NO
            out.append(EvalItem(t.prompt, lambda text, c=cand, w=want: agree(text, c) == w))
        return out
