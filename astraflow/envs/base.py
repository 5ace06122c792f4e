"""The environment API: tasks with a held-out split, tools, reward and limits.

An environment is everything about a workload that is not the model: what a task
says, which tools the model may call, how an answer is scored, and when an episode
must end. Workflows play episodes on an `Env`; the flow names one by a built-in name
or `module:attr`. One action format serves every environment; a turn ends at a stop
string and holds at most one action:

    <call>NAME ARGUMENT</call>     a tool call (the turn ends at `</call>`)
    <answer>TEXT</answer>          the final answer (the episode ends)

Tool output comes back as context the model did not sample (loss mask 0), rendered by
the codec. Tools are plain blocking callables; the actor runs a batch's calls
concurrently under their own timeouts, and a tool that needs isolation (running a
program) does it itself, in a subprocess.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

CALL_OPEN, CALL_CLOSE = "<call>", "</call>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TOOL_OPEN, TOOL_CLOSE = "<tool>", "</tool>"
#: Stop strings that end a model turn at an action.
TURN_STOPS: tuple[str, ...] = (CALL_CLOSE, ANSWER_CLOSE)

_CALL = re.compile(re.escape(CALL_OPEN) + r"\s*([A-Za-z_][\w]*)\s?(.*?)" + re.escape(CALL_CLOSE),
                   re.S)
_ANSWER = re.compile(re.escape(ANSWER_OPEN) + r"(.*?)(?:" + re.escape(ANSWER_CLOSE) + r"|$)", re.S)


@dataclass(frozen=True)
class Task:
    """One task. `data` carries what the environment needs to score or serve it
    (hidden tests, a database path, the gold query), never shown to the model."""

    task_id: str
    prompt: str
    answer: str
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCall:
    tool: str
    argument: str


@dataclass(frozen=True)
class Answer:
    text: str


def parse_action(text: str) -> ToolCall | Answer | None:
    """The action a model turn ends with: its first `<call>` if it has one, else its
    `<answer>` (a missing closing tag is tolerated: the turn may have hit its length
    limit right after the answer), else None (the turn did nothing an env can use)."""
    call = _CALL.search(text)
    if call is not None:
        return ToolCall(call.group(1), call.group(2).strip())
    ans = _ANSWER.search(text)
    if ans is not None:
        return Answer(ans.group(1).strip())
    return None


@dataclass(frozen=True)
class ToolResult:
    """What a tool call returned. `error` is set when the call failed (unknown tool,
    bad argument, timeout, a program that crashed): the model still sees `output`
    (usually the error message), and the row counts the error."""

    output: str
    error: str | None = None
    seconds: float = 0.0


@runtime_checkable
class Tool(Protocol):
    name: str
    description: str
    """One line the instructions show the model."""
    timeout_s: float
    """The longest one call may take; the actor stops waiting after it (and the tool
    itself must not leave work running past it: kill its subprocess, cancel its query)."""

    def __call__(self, task: Task, argument: str) -> ToolResult:
        """Run one call for one episode's task. Must be safe to call from several
        threads at once (the calls of a batch run concurrently)."""
        ...


@dataclass(frozen=True)
class Limits:
    """When an episode ends without an answer; each ending is recorded as the row's
    finish reason (`max_turns`, `context`, `timeout`)."""

    max_turns: int = 1
    """Model turns per episode (1: answer at once, no tools)."""
    max_context_tokens: int | None = None
    """Prompt plus everything after it; None: the engine's own limit."""
    episode_timeout_s: float | None = None
    """Wall-clock seconds for the whole episode, tool calls included."""


@dataclass(frozen=True)
class DemoTurn:
    """One turn of a synthetic demonstration: the model's text (`model`) or a tool's
    output (`tool`). A warm start trains on the model turns only."""

    who: str
    text: str


@runtime_checkable
class Env(Protocol):
    """A workload. Held-out tasks are a fixed slice of the task space chosen by a hash
    of the task, so no list is shared between processes and training never draws one."""

    name: str
    tools: Mapping[str, Tool]
    limits: Limits

    def sample(self, rng: random.Random) -> Task:
        """A training task (never a held-out one)."""
        ...

    def eval_tasks(self, n: int) -> list[Task]:
        """`n` distinct held-out tasks, the same in every process and run."""
        ...

    def instructions(self) -> str:
        """What precedes every task's prompt: the tools (name and description) and the
        action format. Empty for single-turn workloads such as math."""
        ...

    def reward(self, task: Task, answer: str | None) -> float:
        """Score of an episode's final answer (None: the episode ended without one)."""
        ...

    def demonstration(self, task: Task, rng: random.Random) -> list[DemoTurn]:
        """A solved episode of `task`, tool use included, for a warm start."""
        ...


@runtime_checkable
class EpisodeReward(Protocol):
    """An env whose reward also looks at the tool calls an episode made, not only its
    answer (`tool_agent` uses it when the env has it). Why: where answers can be
    guessed (a count of 2, one of ten cities), an answer-only reward pays a guess as
    much as a right query, and RL then learns to guess; a reward that pays the answer
    only when a call in the episode produced it (an execution match) does not."""

    def reward_episode(self, task: Task, answer: str | None, calls: tuple[ToolCall, ...]
                       ) -> float:
        """Score of the episode: its final answer and the calls it made, in order."""
        ...


def tool_listing(tools: Mapping[str, Tool]) -> str:
    """The tools as instructions list them, one line each."""
    return "\n".join(f"{CALL_OPEN}{t.name} ARG{CALL_CLOSE}: {t.description}"
                     for t in tools.values())
