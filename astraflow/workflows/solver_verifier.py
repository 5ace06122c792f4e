"""`solver_verifier`: a solver answers, one or more verifiers judge the answer.

    task "042+917=" ──solver (k samples)──► answer "959"      reward: answer right
                        env wait (one turn)
    "042+917=959?" ──each verifier──────► "Y" | "N"          reward: judged right
                        env wait (one turn; the verifiers judge concurrently)

Rows: the solver's part is its answer (mask all 1). A verifier's part keeps the
task as its prompt and the solver's answer plus `?` as context it did not write
(mask 0), then its own judgement (mask 1), so a verifier row is the exact token
sequence the verifier saw and its loss touches only its own token.

Held-out judgement accuracy is measured on a fixed, balanced set: for each
held-out task either the right answer or a near miss (one digit changed, or off
by 1, 10 or 100: the slips a solver makes), so always answering `Y` or always
`N` scores 50%.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from astraflow.envs.math import Task
from astraflow.workflows.base import Actor, EvalItem, Part, Workflow

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


def judge_prompt(task: Task, answer_text: str) -> str:
    return f"{task.prompt}{answer_text}?"


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

    def episodes(self, tasks: list[Task], actor: Actor) -> list[Part]:
        codec, k = self.codec, self.k
        prompts = [codec.encode(t.prompt) for t in tasks]
        gen = actor.generate("solver", prompts, samples=k,
                             max_new_tokens=self.max_new_tokens("solver"))
        actor.env_wait()
        parts: list[Part] = []
        answers: list[tuple[int, str, bool]] = []  # (task index, answer text, right?)
        for i, (comp, lps) in enumerate(zip(gen.completions, gen.logprobs, strict=True)):
            j = i // k
            text = codec.decode(comp)
            right = self.env.reward(tasks[j], text) == 1.0
            parts.append(Part.own_turn("solver", tasks[j].task_id, f"s{j}", prompts[j], comp, lps,
                                       float(right)))
            answers.append((j, text, right))
        judge_prompts = [codec.encode(judge_prompt(tasks[j], text)) for j, text, _ in answers]
        m = self.judge_samples
        for role in self.verifier_roles:
            judged = actor.generate(role, judge_prompts, samples=m,
                                    max_new_tokens=self.max_new_tokens(role))
            for i, (comp, lps) in enumerate(zip(judged.completions, judged.logprobs, strict=True)):
                j, text, right = answers[i // m]
                said = codec.decode(comp).strip()
                reward = float((said == YES and right) or (said == NO and not right))
                context = codec.encode(text + "?")[1:]  # the solver's answer, then "?" (no BOS)
                parts.append(Part.after_context(role, tasks[j].task_id, f"v{j}", prompts[j],
                                                context, comp, lps, reward))
        if self.verifier_roles:
            actor.env_wait()
        return parts

    def sft_example(self, role: str, rng: random.Random) -> tuple[str, str]:
        t = self.env.sample(rng)
        if role == "solver":
            return t.prompt, t.answer
        if rng.random() < 0.5:
            return judge_prompt(t, t.answer), YES
        return judge_prompt(t, near_miss(t.answer, rng)), NO

    def eval_items(self, role: str, n: int) -> list[EvalItem]:
        tasks = self.env.eval_tasks(n)
        if role == "solver":
            return [EvalItem(t.prompt, lambda text, t=t: self.env.reward(t, text) == 1.0)
                    for t in tasks]
        rng = random.Random(4321)  # fixed: every process and run judges the same candidates
        items = []
        for i, t in enumerate(tasks):
            right = i % 2 == 0
            cand = t.answer if right else near_miss(t.answer, rng)
            want = YES if right else NO
            items.append(EvalItem(judge_prompt(t, cand), lambda text, w=want: text.strip() == w))
        return items

    def max_new_tokens(self, role: str) -> int:
        return self.env.max_new_tokens() if role == "solver" else 2  # judgement + EOS
