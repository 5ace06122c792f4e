"""The workflow API: roles, turns, and one Part per policy per episode."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:  # flow validation resolves workflows: keep torch/transformers out of it
    from astraflow.envs.base import Env
    from astraflow.models.codec import Codec
    from astraflow.rollout.generation import Generation


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
    finish_reason: str = "stop"
    """How this policy's (last) turn ended: `stop` (a stop id or string) or `length`
    (cut at max_new_tokens: truncated); a multi-turn episode's ending (`answer`,
    `max_turns`, `context`, `timeout`, ...: see tool_agent). Recorded in the row's extras."""
    extras: dict[str, Any] = field(default_factory=dict)
    """More facts for the row's `extras` JSON (a multi-turn episode's turns, tool calls,
    tool errors and tool seconds), so a user can query why episodes fail."""

    def __post_init__(self) -> None:
        n = len(self.completion_ids)
        if len(self.logprobs) != n or len(self.loss_mask) != n:
            raise ValueError(f"{self.role} part of {self.task_id}: completion, logprobs and loss "
                             f"mask differ in length ({n}, {len(self.logprobs)}, {len(self.loss_mask)})")
        if not any(self.loss_mask):
            raise ValueError(f"{self.role} part of {self.task_id} has no token of its own to train")

    @classmethod
    def own_turn(cls, role: str, task_id: str, group: str, prompt_ids: list[int],
                 completion: list[int], logprobs: list[float], reward: float,
                 finish_reason: str = "stop") -> Part:
        """A part that is one turn of this policy's own, straight after the prompt."""
        return cls(role, task_id, group, prompt_ids, list(completion), list(logprobs),
                   [1] * len(completion), reward, finish_reason)

    @classmethod
    def from_segments(cls, role: str, task_id: str, group: str, prompt_ids: list[int],
                      segments: list[tuple[list[int], list[float] | None]], reward: float,
                      finish_reason: str = "stop", extras: dict[str, Any] | None = None
                      ) -> Part:
        """A multi-turn part: `segments` in episode order, each (token ids, logprobs) for
        a turn this policy sampled, or (token ids, None) for tokens it only read (another
        policy's turn, a tool's output) — kept for the forward pass, masked out of the loss."""
        ids: list[int] = []
        lps: list[float] = []
        mask: list[int] = []
        for tokens, logprobs in segments:
            ids.extend(tokens)
            lps.extend([0.0] * len(tokens) if logprobs is None else logprobs)
            mask.extend([0 if logprobs is None else 1] * len(tokens))
        return cls(role, task_id, group, prompt_ids, ids, lps, mask, reward, finish_reason,
                   dict(extras or {}))


@dataclass(frozen=True)
class Demo:
    """One supervised example for a role's warm start: train on `target_ids` where
    `target_mask` is 1 (a turn of the role's own), read the rest as context."""

    prompt_ids: list[int]
    target_ids: list[int]
    target_mask: list[int]


class Actor(Protocol):
    """What a workflow may do during an episode: generate as a role, wait on the world."""

    codec: Codec
    roles: frozenset[str]
    """The roles this batch plays (the worker's admission; every role unless the
    workflow's `needs` lets some play apart). Generating another role is an error."""

    def generate(self, role: str, prompts: list[list[int]], *, samples: int,
                 max_new_tokens: int, stop: Sequence[str] = ()) -> Generation:
        """`samples` completions of each prompt; each ends at a stop id, at `max_new_tokens`,
        or at the end of the first string of `stop` in its text (kept in the completion)."""
        ...

    def env_wait(self) -> None:
        """The modelled environment/tool wait of one turn (the batch's episodes wait
        concurrently, as async tool calls do)."""


@dataclass(frozen=True)
class EvalItem:
    """One held-out check of a role: greedy completion of `prompt` scored by `check`.
    `data` carries whatever a multi-turn workflow needs to play the later turns."""

    prompt: str
    check: Callable[[str], bool]
    data: Mapping[str, Any] | None = None


class Workflow(ABC):
    """Subclass this (and name it `module:attr` in `workflow.name`) for your own."""

    roles: ClassVar[tuple[str, ...]] = ()
    metric: ClassVar[Mapping[str, str]] = {}
    """Role → name of its held-out metric, for progress and summaries."""

    def __init__(self, env: Env, codec: Codec, *, samples_per_prompt: int,
                 max_new_tokens: int | None = None, **params: Any):
        if params:
            raise ValueError(f"workflow {type(self).__name__} takes no parameters "
                             f"{sorted(params)}")
        self.env, self.codec, self.k = env, codec, samples_per_prompt
        self.max_new_tokens_override = max_new_tokens
        """The flow's `rollout.max_new_tokens`; `max_new_tokens(role)` honours it."""

    def encode_prompt(self, text: str) -> list[int]:
        """A task's prompt as ids: a user message through the model's chat template
        (generation prompt added) for chat models, plain text otherwise."""
        if self.codec.is_chat:
            return self.codec.encode_chat([{"role": "user", "content": text}])
        return self.codec.encode(text)

    def encode_answer(self, text: str) -> list[int]:
        """A role's own turn as ids (no BOS), ended by the codec's EOS: what a warm-start
        demo trains on."""
        ids = self.codec.encode(text)
        bos = getattr(self.codec, "bos_id", None)
        if ids and bos is not None and ids[0] == bos:
            ids = ids[1:]
        return ids + [self.codec.eos_id]

    @classmethod
    def role_names(cls, params: Mapping[str, Any]) -> tuple[str, ...]:
        """The roles, in turn order, for these parameters."""
        return cls.roles

    def needs(self, role: str, roles: Sequence[str]) -> frozenset[str]:
        """The roles whose turns `role`'s part of an episode reads, of this flow's
        `roles`: the worker plays `role` only with them, and may play a role without
        the roles that need it (a policy whose trainer is behind is then not started,
        rather than generated and thrown away). Default: every other role (the roles
        cannot be separated; an episode is played whole or held). A workflow that
        narrows this must play only `actor.roles` in `episodes`."""
        return frozenset(roles) - {role}

    @classmethod
    def parts_per_task(cls, role: str, params: Mapping[str, Any], samples_per_prompt: int) -> int:
        """Parts (rows) one task yields for `role`; sizes each trainer's batch."""
        return samples_per_prompt

    @abstractmethod
    def episodes(self, tasks: list[Any], actor: Actor) -> list[Part]:
        """Run one batch of episodes; return every policy's part of every episode."""

    @abstractmethod
    def demo(self, role: str, rng: random.Random) -> Demo:
        """A supervised example for the warm start of `role`'s version 0."""

    @abstractmethod
    def items(self, role: str, tasks: list[Any], rng: random.Random) -> list[EvalItem]:
        """Checks of `role` on these tasks (held-out tasks for evaluation, training draws
        for the warm start's validation)."""

    def eval_items(self, role: str, n: int) -> list[EvalItem]:
        """`n` fixed held-out checks of `role` (the same in every process and run)."""
        return self.items(role, self.env.eval_tasks(n), random.Random(4321))

    def validation_items(self, role: str, rng: random.Random, n: int) -> list[EvalItem]:
        """Checks drawn from the training distribution (never the held-out set)."""
        return self.items(role, [self.env.sample(rng) for _ in range(n)], rng)

    def score(self, role: str, engine: Any, items: list[EvalItem], batch: int = 500) -> float:
        """Fraction of items passed by greedy play of `role` with `engine` (one turn;
        multi-turn workflows override this to play their later turns)."""
        correct = 0
        for i in range(0, len(items), batch):
            chunk = items[i : i + batch]
            gen = engine.generate([self.encode_prompt(it.prompt) for it in chunk],
                                  max_new_tokens=self.max_new_tokens(role), greedy=True)
            correct += sum(bool(it.check(self.codec.decode(c)))
                           for it, c in zip(chunk, gen.completions, strict=True))
        return correct / max(len(items), 1)

    def max_new_tokens(self, role: str) -> int:
        """Longest turn `role` may generate: the flow's `rollout.max_new_tokens`, else
        the workflow's own `default_max_new_tokens(role)`."""
        return self.max_new_tokens_override or self.default_max_new_tokens(role)

    @abstractmethod
    def default_max_new_tokens(self, role: str) -> int:
        """Longest turn `role` may generate when the flow does not say."""

    def metric_name(self, role: str) -> str:
        return self.metric.get(role, "accuracy")
