"""One registry of the names a flow or a command gives: stages, workflows, envs, scaling policies.

A built-in name maps to a `module:attr` import string, so checking a name imports
nothing (a flow validates without torch or the runtime); any other `module:attr` is
the user's own and is imported when resolved. Errors say what to do: an unknown name
lists the built-ins and the closest one; a module that is not found names
`PYTHONPATH=.` (user code lives in the project folder); one that fails to import says why.
This module imports nothing of astraflow, so every package may use it.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Kind:
    """One kind of named thing: how messages call it and what is built in."""

    label: str
    """How messages name it (`stage`, `scaling policy`)."""
    command: str
    """The `astraflow` command that loads user code of this kind (for the PYTHONPATH hint)."""
    builtins: dict[str, str]
    """Built-in name → `module:attr`."""
    base: str | None = None
    """`module:attr` of the class a resolved object must subclass (None: any)."""
    callable_only: bool = False
    """The resolved object must be callable (a stage function)."""


KINDS: dict[str, Kind] = {
    "stage": Kind("stage", "run", {
        "staleness": "astraflow.data.stages:staleness",
        "replay": "astraflow.data.replay:replay",
        "overlength_penalty": "astraflow.data.shaping:overlength_penalty",
        "solved_filter": "astraflow.data.shaping:solved_filter",
        "zero_variance_filter": "astraflow.data.stages:zero_variance_filter",
        "group_advantages": "astraflow.data.stages:group_advantages",
        "dr_grpo_advantages": "astraflow.data.shaping:dr_grpo_advantages",
        "length_norm": "astraflow.data.shaping:length_norm",
    }, callable_only=True),
    "workflow": Kind("workflow", "run", {
        "single": "astraflow.workflows.single:SingleTurn",
        "solver_verifier": "astraflow.workflows.solver_verifier:SolverVerifier",
        "judge": "astraflow.workflows.judge:Judge",
        "tool_agent": "astraflow.workflows.tool_agent:ToolAgent",
        "arena": "astraflow.workflows.arena:Arena",
    }, base="astraflow.workflows.base:Workflow"),
    "env": Kind("env", "run", {
        "math": "astraflow.envs.math:MathEnv",
        "search": "astraflow.envs.search:SearchEnv",
        "code": "astraflow.envs.code:CodeEnv",
        "sql": "astraflow.envs.sql:SqlEnv",
        "textarena": "astraflow.envs.games:TextArenaEnv",
        "reasoning_gym": "astraflow.envs.rgym:ReasoningGymEnv",
        "openenv": "astraflow.envs.openenv:OpenEnvEnv",
        "skyrl_gym": "astraflow.envs.skyrl_gym:SkyrlGymEnv",
        "verifiers": "astraflow.envs.verifiers:VerifiersEnv",
    }),
    "policy": Kind("scaling policy", "scale", {
        "fixed": "astraflow.policies:Fixed",
        "deadband": "astraflow.policies:DeadBand",
        "cost": "astraflow.policies:CostAware",
    }),
}


#: Built-in names that need an optional extra: (kind, name) → (module, extra).
EXTRAS: dict[tuple[str, str], tuple[str, str]] = {
    ("env", "reasoning_gym"): ("reasoning_gym", "reasoning-gym"),
    ("env", "textarena"): ("textarena", "textarena"),
    ("env", "openenv"): ("openenv", "openenv"),
    ("env", "skyrl_gym"): ("skyrl_gym", "skyrl-gym"),
}


def require(module: str, extra: str, what: str) -> Any:
    """Import `module` of an optional extra; when it is not installed, say which extra
    installs it (`pip install 'astraflow[extra]'`)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name and (module == err.name or module.startswith(err.name + ".")):
            raise ModuleNotFoundError(f"{what} needs the {extra!r} extra, which is not "
                                      f"installed: pip install 'astraflow[{extra}]'") from None
        raise


def _kind(kind: str) -> Kind:
    try:
        return KINDS[kind]
    except KeyError:
        raise ValueError(f"no registry kind {kind!r}: one of {sorted(KINDS)}") from None


def builtins(kind: str) -> list[str]:
    """The built-in names of `kind`, sorted."""
    return sorted(_kind(kind).builtins)


def check(kind: str, name: str) -> None:
    """Refuse a name that is neither built in nor `module:attr`; imports nothing."""
    k = _kind(kind)
    if name in k.builtins:
        if (kind, name) in EXTRAS:  # found, not imported: validation stays light
            module, extra = EXTRAS[kind, name]
            if importlib.util.find_spec(module) is None:
                raise ValueError(f"{k.label} {name!r} needs the {extra!r} extra, which is not "
                                 f"installed: pip install 'astraflow[{extra}]'")
        return
    mod, sep, attr = name.partition(":")
    if sep and mod and attr:
        return
    close = difflib.get_close_matches(name, k.builtins, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown {k.label} {name!r}: no built-in {k.label} has that name (built "
                     f"in are {sorted(k.builtins)}{hint}), or give `module:attr` for your own")


def load(target: str, what: str = "object", command: str = "run") -> Any:
    """Import `module:attr`; `what` names it in errors (e.g. "stage 'x'")."""
    mod, _, attr = target.partition(":")
    try:
        module = importlib.import_module(mod)
    except ModuleNotFoundError as err:
        missing = err.name or ""
        if mod == missing or mod.startswith(missing + "."):
            raise ValueError(f"cannot load {what}: module {mod!r} does not import ({err}); "
                             f"is its folder on PYTHONPATH? e.g. `PYTHONPATH=. astraflow "
                             f"{command} …`") from None
        raise ValueError(f"cannot load {what}: module {mod!r} does not import ({err})") from None
    except ImportError as err:
        raise ValueError(f"cannot load {what}: module {mod!r} does not import ({err})") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"cannot load {what}: module {mod!r} has no {attr!r}") from None


def resolve(kind: str, name: str) -> Any:
    """The object `name` stands for (a built-in or `module:attr`), imported now."""
    check(kind, name)
    k = _kind(kind)
    what = f"{k.label} {name!r}"
    obj = load(k.builtins.get(name, name), what, k.command)
    if k.callable_only and not callable(obj):
        raise ValueError(f"{what} is not callable")
    if k.base is not None:
        base = load(k.base)
        if not (isinstance(obj, type) and issubclass(obj, base)):
            raise ValueError(f"{what} is not a subclass of {base.__module__}.{base.__qualname__}")
    return obj


def make_policy(name: str, **params: Any) -> Any:
    """A scaling policy: a built-in (`fixed`, `deadband`, `cost`) or a user's class,
    factory or instance named `module:attr`, called with `params`; it must have
    `plan(observation)`."""
    obj = resolve("policy", name)
    if hasattr(obj, "plan") and not isinstance(obj, type):
        if params:
            raise ValueError(f"scaling policy {name!r} is an instance: it takes no parameters")
        pol = obj
    else:
        pol = obj(**params)
    if not callable(getattr(pol, "plan", None)):
        raise ValueError(f"scaling policy {name!r} has no plan(observation) method")
    return pol
