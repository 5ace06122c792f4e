"""Workflows: how an episode runs and which policy plays each of its turns.

A workflow names its roles (`solver`, `verifier`, …); the flow casts a policy
in each role. The rollout worker hands the workflow a batch of tasks and an
Actor that generates with whichever role's policy is asked for; the workflow
returns one Part per policy per episode, and each Part becomes a row in that
policy's own table with its own loss mask (1 only on that policy's tokens) and
its own reward. Built in: `single`, `solver_verifier`, `judge`, `tool_agent`, `arena`;
`module:attr` names your own (astraflow.registry resolves both).
"""

from __future__ import annotations

from astraflow.workflows.base import Actor, Demo, EvalItem, Part, Workflow
from astraflow.workflows.single import SingleTurn
from astraflow.workflows.solver_verifier import SolverVerifier
from astraflow.workflows.tool_agent import ToolAgent

__all__ = ["Actor", "Demo", "EvalItem", "Part", "SingleTurn", "SolverVerifier", "ToolAgent",
           "Workflow"]
