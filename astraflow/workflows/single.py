"""`single`: one policy answers each task; reward 1 for the exact answer."""

from __future__ import annotations

import random
from typing import ClassVar

from astraflow.envs.math import Task
from astraflow.workflows.base import Actor, Demo, EvalItem, Part, Workflow


class SingleTurn(Workflow):
    roles: ClassVar[tuple[str, ...]] = ("solver",)

    def episodes(self, tasks: list[Task], actor: Actor) -> list[Part]:
        prompts = [self.encode_prompt(t.prompt) for t in tasks]
        gen = actor.generate("solver", prompts, samples=self.k,
                             max_new_tokens=self.max_new_tokens("solver"))
        actor.env_wait()
        parts = []
        for i, (comp, lps, why) in enumerate(zip(gen.completions, gen.logprobs,
                                                 gen.finish_reasons, strict=True)):
            t = tasks[i // self.k]
            parts.append(Part.own_turn("solver", t.task_id, f"t{i // self.k}", prompts[i // self.k],
                                       comp, lps, self.env.reward(t, self.codec.decode(comp)),
                                       finish_reason=why))
        return parts

    def demo(self, role: str, rng: random.Random) -> Demo:
        t = self.env.sample(rng)
        target = self.encode_answer(t.answer)
        return Demo(self.encode_prompt(t.prompt), target, [1] * len(target))

    def items(self, role: str, tasks: list[Task], rng: random.Random) -> list[EvalItem]:
        return [EvalItem(t.prompt, lambda text, t=t: self.env.reward(t, text) == 1.0)
                for t in tasks]

    def default_max_new_tokens(self, role: str) -> int:
        return self.env.max_new_tokens()
