"""Held-out evaluation of any published version of a policy.

Greedy play of the policy's (first) role on the workflow's fixed held-out
checks, with the codec saved with the version evaluated: accuracy for a
solver, judgement accuracy for a verifier. Used by the launcher (version 0,
live curve, final), by `astraflow eval`, and by benchmarks; it imports no
launcher code.
"""

from __future__ import annotations

from collections.abc import Iterator

from astraflow.context import RunContext
from astraflow.rollout.adapters import SharedAdapters
from astraflow.rollout.engine import HFEngine
from astraflow.rollout.generation import Engine
from astraflow.stores import WeightError
from astraflow.workflows import EvalItem, Workflow
from astraflow.workflows.workload import make_workflow


class Evaluator:
    """Greedy held-out metric of one policy's versions, in this process (hf engine).

    Built on the policy's version 0 (its codec and an engine), which `prune` always
    keeps, so a live run pruning its old versions cannot pull the version it is built
    on away mid-load; a store without version 0 (a partial mirror) builds on its newest.
    Each call swaps in the weights of the version asked for. Every version of a policy
    carries the same tokenizer, so the held-out prompts encode once. `shared`: the
    engines of shared bases (`model.shared_base`) that evaluators of several policies
    hold once between them."""

    def __init__(self, ctx: RunContext, policy: str | None = None, *,
                 shared: dict[str, SharedAdapters] | None = None):
        self.ctx = ctx
        self.policy = policy or ctx.flow.policy.name
        self.role = ctx.flow.role_of(self.policy)
        self.ws = ctx.weights()
        versions = self.ws.versions(self.policy)
        if not versions:
            raise WeightError(f"no weight versions of {self.policy} in {ctx.weights_root}")
        base = 0 if versions[0] == 0 else versions[-1]
        model = ctx.flow.policy_spec(self.policy).model
        path = self.ws.load(self.policy, base)
        self.engine: Engine
        if shared is not None and model.shared_base is not None:  # one base for all of them
            if model.shared_base not in shared:
                shared[model.shared_base] = SharedAdapters(path, dtype=model.dtype)
            self.engine = shared[model.shared_base].engine_for(self.policy, path)
        else:
            self.engine = HFEngine.from_dir(path, dtype=model.dtype)
        self.workflow: Workflow = make_workflow(ctx.flow, self.engine.codec)
        self.metric = self.workflow.metric_name(self.role)
        self.items: list[EvalItem] = self.workflow.eval_items(self.role, ctx.flow.env.eval_size)

    def __call__(self, version: int, n: int | None = None) -> float:
        self.engine.load_weights(self.ws.load(self.policy, version))
        return self.workflow.score(self.role, self.engine, self.items[: n or len(self.items)])


class EvalError(ValueError):
    """A policy or weight version that is not there: one line for the user."""


def held_out(ctx: RunContext, policy: str | None = None, version: int | None = None
             ) -> Iterator[tuple[str, dict[str, object]]]:
    """(policy, {version, metric, accuracy, tasks}) for `policy` (default: every one) at
    `version` (default: its newest), one policy at a time (`astraflow eval`)."""
    names = ctx.flow.policy_names()
    if policy is not None and policy not in names:
        raise EvalError(f"no policy {policy!r} in this flow (policies: {', '.join(names)})")
    for name in [policy] if policy else names:
        ev = Evaluator(ctx, name)
        v = ctx.weights().latest(name) if version is None else version
        if v is None:
            raise EvalError(f"no weight versions of {name} in {ctx.weights_root}")
        if v not in ctx.weights().versions(name):
            raise EvalError(f"no weight version {v} of {name} in {ctx.weights_root} (kept: "
                            f"{ctx.weights().versions(name)[-8:]})")
        yield name, {"version": v, "metric": ev.metric, "accuracy": ev(v), "tasks": len(ev.items)}
