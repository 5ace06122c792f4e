"""A verifiers (0.4, `verifiers.v1`) environment for examples/verifiers.yaml and its
test: word problems with a calculator tool, scored by a rubric of two weighted rewards
and a metric. Loaded by module as any taskset is (`taskset: examples.verifiers_arith`;
verifiers imports the module and takes the Taskset subclass in its `__all__`).

    task       "Ana has 23 apples and buys 58 more. ..."   (prompt + system prompt)
    tool       add(a, b) -> a + b                          (a Toolset, an MCP server)
    rubric     correct (weight 1): the reply's last number is the answer
               brief   (weight 0.2): the reply is at most 80 characters
    metric     turns: model turns in the episode
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

import verifiers.v1 as vf

__all__ = ["ArithTaskset"]

SYSTEM = "Solve the problem. End your reply with the number alone."


class ArithData(vf.TaskData):
    answer: str = ""


class Calculator(vf.Toolset):
    TOOL_PREFIX = None

    @vf.tool
    async def add(self, a: int, b: int) -> str:
        """Add two integers."""
        return str(int(a) + int(b))


class ArithTask(vf.Task[ArithData]):
    @property
    def key(self) -> str:
        return str(self.data.id)

    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [Calculator(vf.ToolsetConfig())]

    @vf.reward(weight=1.0)
    async def correct(self, task: ArithData, trace: vf.Trace) -> float:
        found = re.findall(r"-?\d+", trace.last_reply)
        return float(bool(found) and found[-1] == task.answer)

    @vf.reward(weight=0.2)
    async def brief(self, trace: vf.Trace) -> float:
        return float(0 < len(trace.last_reply) <= 80)

    @vf.metric
    async def turns(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)


class ArithTaskset(vf.Taskset[ArithTask]):
    def load(self) -> Iterator[ArithTask]:
        rng = random.Random(0)
        for i in range(300):
            a, b = rng.randint(2, 60), rng.randint(2, 40)
            prompt = f"Ana has {a} apples and buys {b} more. How many apples does she have?"
            yield ArithTask(ArithData(id=f"arith-{i}", prompt=prompt, system_prompt=SYSTEM,
                                      answer=str(a + b)), self.config.task)
