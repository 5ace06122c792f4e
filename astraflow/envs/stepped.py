"""Envs that run their own turn protocol: the model's whole turn goes to the env.

The field's environment libraries (OpenEnv, skyrl-gym, verifiers) do not use this
package's `<call>`/`<answer>` format: each episode is a session the library owns. It
opens with a conversation (the task as the env states it), takes the model's turn as
text, and answers with what the model sees next, a reward, and whether it is over.
`tool_agent` plays such an env (`SteppedEnv`) through its sessions instead of parsing
actions: each step runs on the tool pool under `step_timeout_s`, the env's replies are
context the model did not sample (loss mask 0), and the episode's reward is the sum of
its steps' rewards. A session that fails (its server died, the library raised) ends
its episode with finish reason `env_error` and the reason in the row's extras; the
other episodes and the worker go on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from astraflow.envs.base import DemoTurn, Task


@dataclass(frozen=True)
class Step:
    """What the env did with one model turn (or, from `close`, at the episode's end)."""

    observation: str = ""
    """What the model reads next ("" when nothing); shown as a tool turn, loss mask 0."""
    reward: float = 0.0
    """This step's reward; the episode's reward is the sum over its steps."""
    done: bool = False
    """The env ended the episode (finish reason `done`)."""
    error: str | None = None
    """The session failed (finish reason `env_error`); the reason goes to the row."""
    info: Mapping[str, Any] = field(default_factory=dict)
    """Facts for the row's extras (a rubric's components, an env's metrics)."""


@runtime_checkable
class Session(Protocol):
    """One episode of a stepped env; used from one thread at a time."""

    messages: list[dict[str, str]]
    """The opening conversation (`role`/`content` messages) the model is prompted with."""

    def step(self, text: str) -> Step:
        """The env's answer to the model's turn `text`."""
        ...

    def close(self, finish: str) -> Step:
        """The episode is over (`finish` says why: `done`, `max_turns`, `env_error`, ...);
        release what the session holds. Its reward and info are added to the episode's
        (a rubric that scores the whole conversation answers here)."""
        ...


@runtime_checkable
class SteppedEnv(Protocol):
    """An env whose episodes are sessions (see the module docstring)."""

    turn_stops: tuple[str, ...]
    """Stop strings that end a model turn besides EOS (e.g. `</search>`); often none."""
    step_timeout_s: float
    """The longest one `step` (or `open`, `close`) may take before the episode ends."""
    success_reward: float
    """An episode whose reward reaches this counts as solved (held-out success)."""

    def open(self, task: Task) -> Session:
        """A fresh session of `task` (a reset); raises when the env cannot start one."""
        ...


class NoDemonstrations:
    """For envs built on a library: version 0 is a pretrained model, not a warm start on
    demonstrations this package would have to invent."""

    name: str

    def demonstration(self, task: Task, rng: Any) -> list[DemoTurn]:
        raise ValueError(f"env {self.name!r} has no demonstrations: its version 0 is the "
                         "pretrained model (drop the policy's `warm_start`)")

    def instructions(self) -> str:
        return ""

    def reward(self, task: Task, answer: str | None) -> float:
        raise ValueError(f"env {self.name!r} is stepped: its reward comes from its sessions "
                         "(play it with the `tool_agent` workflow)")


def message_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """Messages as one text: their contents joined by blank lines (an observation the
    model reads as one tool turn)."""
    return "\n\n".join(str(m.get("content") or "") for m in messages if m.get("content"))
