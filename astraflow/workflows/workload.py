"""A flow's workload: its environment and its workflow, built the same way in every
component (worker, trainer's warm start, evaluator), so all of them draw the same
tasks, encode the same prompts and score the same way.

Light on purpose (no torch): the codec is passed in by the caller, which built it
from the tokenizer saved with a weight version.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from astraflow import registry
from astraflow.envs import build_env
from astraflow.envs.base import Env
from astraflow.workflows import Workflow

if TYPE_CHECKING:
    from astraflow.config.flow import FlowSpec
    from astraflow.models.codec import Codec


def make_env(flow: FlowSpec) -> Env:
    """The flow's env: `math` from its own fields (plus any `params`), every other env
    from `env.params` (built-in name or `module:attr`, see astraflow.envs)."""
    e = flow.env
    if e.name == "math":
        params = dict(digits=e.digits, op=e.op, heldout_fraction=e.heldout_fraction,
                      style=e.style, digits_b=e.digits_b)
        return build_env("math", {**params, **e.params})
    return build_env(e.name, dict(e.params))


def make_workflow(flow: FlowSpec, codec: Codec) -> Workflow:
    """The flow's workflow on its environment, encoding with `codec`."""
    wf = flow.workflow
    cls: type[Workflow] = registry.resolve("workflow", wf.name)
    return cls(make_env(flow), codec, samples_per_prompt=flow.rollout.samples_per_prompt,
               max_new_tokens=flow.rollout.max_new_tokens, **wf.params)
