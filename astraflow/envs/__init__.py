"""Workloads: task sampling, tools, rewards, held-out evaluation sets.

The flow names an environment as it names a workflow: a built-in name or
`module:attr`. Built-ins are import strings loaded only when an env is built,
so flow validation imports none of them (no torch, no LanceDB) and a missing
module fails where it is used, naming it.
"""

from __future__ import annotations

import importlib
from typing import Any

from astraflow.envs.base import Env

BUILTIN: dict[str, str] = {
    "math": "astraflow.envs.math:MathEnv",
    "search": "astraflow.envs.search:SearchEnv",
    "code": "astraflow.envs.code:CodeEnv",
    "sql": "astraflow.envs.sql:SqlEnv",
}


def check_env_name(name: str) -> None:
    """Refuse a name that is neither built in nor `module:attr` (no import)."""
    if name in BUILTIN:
        return
    mod, sep, attr = name.partition(":")
    if not (sep and mod and attr):
        raise ValueError(f"unknown env {name!r}: built in are {sorted(BUILTIN)}, or give "
                         f"`module:attr` for your own Env class")


def resolve_env(name: str) -> type:
    """The class (or factory) an env name stands for, imported now."""
    check_env_name(name)
    target = BUILTIN.get(name, name)
    mod, attr = target.split(":", 1)
    try:
        module = importlib.import_module(mod)
    except ImportError as err:
        raise ValueError(f"cannot load env {name!r}: module {mod!r} does not import ({err})"
                         ) from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"cannot load env {name!r}: module {mod!r} has no {attr!r}") from None


def build_env(name: str, params: dict[str, Any]) -> Env:
    """An env instance: `resolve_env(name)(**params)`, checked against the Env protocol."""
    cls = resolve_env(name)
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


__all__ = ["BUILTIN", "Env", "build_env", "check_env_name", "resolve_env"]
