"""The workflow API: roles, turns, and one Part per policy per episode."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:  # flow validation resolves workflows: keep torch/transformers out of it
    from astraflow.envs.math import MathEnv
    from astraflow.models.tokenizer import CharCodec
    from astraflow.rollout.engine import Generation


@dataclass
class Part:
    """One policy's part of one episode; it becomes one row of that policy's table.

    The policy's tokens and everything it was shown after the prompt (other
    policies' turns, tool output) sit in `completion_ids`, in the order the
    episode produced them; `loss_mask` is 1 exactly on the tokens this policy
    sampled, and `logprobs` holds their behaviour logprobs (0.0 elsewhere).
    """

    role: str
    task_id: str
    group: str
    """Parts compared with each other (a GRPO group); unique within one batch."""
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    loss_mask: list[int]
    reward: float

    def __post_init__(self) -> None:
        n = len(self.completion_ids)
        if len(self.logprobs) != n or len(self.loss_mask) != n:
            raise ValueError(f"{self.role} part of {self.task_id}: completion, logprobs and loss "
                             f"mask differ in length ({n}, {len(self.logprobs)}, {len(self.loss_mask)})")
        if not any(self.loss_mask):
            raise ValueError(f"{self.role} part of {self.task_id} has no token of its own to train")

    @classmethod
    def own_turn(cls, role: str, task_id: str, group: str, prompt_ids: list[int],
                 completion: list[int], logprobs: list[float], reward: float) -> Part:
        """A part that is one turn of this policy's own, straight after the prompt."""
        return cls(role, task_id, group, prompt_ids, list(completion), list(logprobs),
                   [1] * len(completion), reward)

    @classmethod
    def after_context(cls, role: str, task_id: str, group: str, prompt_ids: list[int],
                      context: list[int], completion: list[int], logprobs: list[float],
                      reward: float) -> Part:
        """A part whose own turn follows tokens it did not write (another policy's turn,
        a tool's output): those are kept for the forward pass and masked out of the loss."""
        return cls(role, task_id, group, prompt_ids, [*context, *completion],
                   [0.0] * len(context) + list(logprobs), [0] * len(context) + [1] * len(completion),
                   reward)


class Actor(Protocol):
    """What a workflow may do during an episode: generate as a role, wait on the world."""

    codec: CharCodec

    def generate(self, role: str, prompts: list[list[int]], *, samples: int,
                 max_new_tokens: int) -> Generation: ...

    def env_wait(self) -> None:
        """The modelled environment/tool wait of one turn (the batch's episodes wait
        concurrently, as async tool calls do)."""


@dataclass(frozen=True)
class EvalItem:
    """One held-out check: greedy completion of `prompt` as a role, scored by `check`."""

    prompt: str
    check: Callable[[str], bool]


class Workflow(ABC):
    """Subclass this (and name it `module:attr` in `workflow.name`) for your own."""

    roles: ClassVar[tuple[str, ...]] = ()
    metric: ClassVar[Mapping[str, str]] = {}
    """Role → name of its held-out metric, for progress and summaries."""

    def __init__(self, env: MathEnv, codec: CharCodec, *, samples_per_prompt: int,
                 **params: Any):
        if params:
            raise ValueError(f"workflow {type(self).__name__} takes no parameters "
                             f"{sorted(params)}")
        self.env, self.codec, self.k = env, codec, samples_per_prompt

    @classmethod
    def role_names(cls, params: Mapping[str, Any]) -> tuple[str, ...]:
        """The roles, in turn order, for these parameters."""
        return cls.roles

    @classmethod
    def parts_per_task(cls, role: str, params: Mapping[str, Any], samples_per_prompt: int) -> int:
        """Parts (rows) one task yields for `role`; sizes each trainer's batch."""
        return samples_per_prompt

    @abstractmethod
    def episodes(self, tasks: list[Any], actor: Actor) -> list[Part]:
        """Run one batch of episodes; return every policy's part of every episode."""

    @abstractmethod
    def sft_example(self, role: str, rng: random.Random) -> tuple[str, str]:
        """(prompt, target) text for the supervised warm start of `role`'s version 0."""

    @abstractmethod
    def eval_items(self, role: str, n: int) -> list[EvalItem]:
        """`n` fixed held-out checks of `role` (the same in every process and run)."""

    @abstractmethod
    def max_new_tokens(self, role: str) -> int:
        """Longest turn `role` may generate."""

    def metric_name(self, role: str) -> str:
        return self.metric.get(role, "accuracy")
