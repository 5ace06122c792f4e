"""Workflows: how an episode runs and which policy plays each of its turns.

A workflow names its roles (`solver`, `verifier`, …); the flow casts a policy
in each role. The rollout worker hands the workflow a batch of tasks and an
Actor that generates with whichever role's policy is asked for; the workflow
returns one Part per policy per episode, and each Part becomes a row in that
policy's own table with its own loss mask (1 only on that policy's tokens) and
its own reward. Built in: `single`, `solver_verifier`; `module:attr` loads your own.
"""

from __future__ import annotations

import importlib

from astraflow.workflows.base import Actor, Demo, EvalItem, Part, Workflow
from astraflow.workflows.single import SingleTurn
from astraflow.workflows.solver_verifier import SolverVerifier
from astraflow.workflows.tool_agent import ToolAgent

BUILTIN: dict[str, type[Workflow]] = {"single": SingleTurn, "solver_verifier": SolverVerifier,
                                      "tool_agent": ToolAgent}


def resolve_workflow(name: str) -> type[Workflow]:
    """A built-in workflow by name, or `module:attr` naming a Workflow subclass."""
    if name in BUILTIN:
        return BUILTIN[name]
    if ":" not in name:
        raise ValueError(f"unknown workflow {name!r}: built in are {sorted(BUILTIN)}, "
                         f"or give `module:attr` for your own")
    mod, attr = name.split(":", 1)
    try:
        obj = getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"cannot load workflow {name!r}: {err}") from None
    if not (isinstance(obj, type) and issubclass(obj, Workflow)):
        raise ValueError(f"workflow {name!r} is not a subclass of astraflow.workflows.Workflow")
    return obj


__all__ = ["Actor", "BUILTIN", "Demo", "EvalItem", "Part", "SingleTurn", "SolverVerifier", "ToolAgent",
           "Workflow",
           "resolve_workflow"]
