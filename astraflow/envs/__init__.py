"""Workloads: task sampling, tools, rewards, held-out evaluation sets.

The flow names an environment as it names a workflow: a built-in name or
`module:attr`. Built-ins are import strings (astraflow.registry) loaded only when
an env is built, so flow validation imports none of them (no torch, no LanceDB)
and a missing module fails where it is used, naming it.
"""

from __future__ import annotations

from typing import Any

from astraflow import registry
from astraflow.envs.base import Env


def build_env(name: str, params: dict[str, Any]) -> Env:
    """An env instance: the class (or factory) `name` stands for (astraflow.registry),
    called with `params` and checked against the Env protocol."""
    cls = registry.resolve("env", name)
    try:
        env = cls(**params)
    except TypeError as err:
        raise ValueError(f"env {name!r} does not take these params {sorted(params)}: {err}"
                         ) from None
    missing = [a for a in ("name", "tools", "limits", "sample", "eval_tasks", "instructions",
                           "reward", "demonstration") if not hasattr(env, a)]
    if missing:
        raise ValueError(f"env {name!r} does not implement the Env protocol "
                         f"(astraflow.envs.base.Env): it lacks {missing}")
    return env


__all__ = ["Env", "build_env"]
