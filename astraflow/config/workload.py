"""The workload: how an episode runs (`workflow:`) and the environment it runs in (`env:`).
Names are checked against astraflow.registry; an env's module is imported only when built."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from astraflow import registry
from astraflow.config.spec import Spec


class WorkflowSpec(Spec):
    """How one episode runs: which policy plays each role, turn by turn."""

    name: str = "single"
    """`single` (one policy answers each task), `solver_verifier` (a solver answers,
    verifiers judge the answer by working it out, a tool compares), `judge` (a solver
    answers, a chat-model verifier reads the question and the answer and replies whether
    it is right), `tool_agent` (multi-turn episodes with the env's
    tools), `arena` (a textarena game, each player seat a role), or `module:attr`
    for your own Workflow class. Default: `single` for the
    `math` env, `tool_agent` for every other env."""
    roles: dict[str, str] = {}
    """Role → policy name. A role left out is played by the policy of the same name;
    in a one-policy flow every role defaults to that policy."""
    params: dict[str, Any] = {}
    """Passed to the workflow's constructor (e.g. `verifiers: 3`)."""

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        registry.resolve("workflow", v)  # raises with the built-in names
        return v


class EnvSpec(Spec):
    name: str = "math"
    """The workload: a built-in environment (`math`: synthetic arithmetic, `search`: a
    local corpus behind a full-text `search` tool, `code`, `sql`; see astraflow.envs),
    one from the field's libraries (`reasoning_gym`, `openenv`, `skyrl_gym`,
    `verifiers`, `textarena`: docs/environments.md, each behind its extra) or
    `module:attr` naming your own Env class. Loaded when a component builds it, so a
    missing module fails there, naming it."""
    params: dict[str, Any] = {}
    """Passed to the environment's constructor (e.g. `search`: `entities: 300`).
    The math fields below are `math`'s own and ignored by every other env."""
    style: Literal["compact", "question", "word"] = "compact"
    """`compact`: `042+917=` for the tiny character model (exact-match reward).
    `question` ("What is 59 + 7? Reply with only the number.") and `word` (a short
    word problem) for chat models: the answer is parsed from free text (the last
    `\\boxed{}`, else the last integer)."""
    digits: int = Field(3, ge=1, le=6)
    """Digits of the first operand (`compact`: of both, zero-padded)."""
    digits_b: int | None = Field(None, ge=1, le=6)
    """Digits of the second operand (`question` / `word` only); default: `digits`."""
    op: Literal["+", "-", "*"] = "+"
    """The arithmetic operation."""
    heldout_fraction: float = Field(0.05, gt=0, lt=1)
    """Share of the task space held out for evaluation (never drawn for training);
    raise it for small task spaces (two-digit + one-digit has only 900 tasks)."""
    eval_size: int = Field(500, ge=10)
    """Held-out tasks for the final evaluation (disjoint from training tasks)."""
    turn_latency_ms: float = Field(0.0, ge=0)
    """A benchmark knob: a modelled wait per turn of the `single`, `solver_verifier` and
    `judge` workflows (the episodes of a batch wait concurrently). Tool-using envs wait on
    their real tools instead (`tool_agent`)."""

    @field_validator("name")
    @classmethod
    def _env_name(cls, v: str) -> str:
        registry.check("env", v)  # form only: the module is imported when the env is built
        return v

