"""FlowSpec: the typed model of a flow YAML.

A flow names its policies, workload, rollout and trainer settings, the data
stages that turn trajectories into a batch, and when to stop. Every field has
a docstring and a default that works on the embedded default (one CPU machine).
An invalid file fails before anything starts, with the field path and a hint;
the resolved config is written next to the run so a run can be reproduced.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class FlowError(ValueError):
    """A flow file is missing, unreadable or invalid; the message says how to fix it."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class ModelSpec(_Spec):
    kind: Literal["tiny"] = "tiny"
    """`tiny`: a small Llama with a character tokenizer, built from scratch."""
    hidden_size: int = Field(128, ge=16)
    layers: int = Field(4, ge=1)
    heads: int = Field(4, ge=1)
    intermediate_size: int = Field(512, ge=16)

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelSpec:
        if self.hidden_size % self.heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} must be divisible by heads {self.heads} "
                f"(e.g. hidden_size: {self.heads * 32})"
            )
        return self


class WarmStartSpec(_Spec):
    """Short supervised pass so version 0 is right some of the time, not always."""

    max_steps: int = Field(1500, ge=0)
    """Upper bound on SFT steps; 0 publishes the random initialisation as version 0."""
    batch_size: int = Field(128, ge=1)
    lr: float = Field(1e-3, gt=0)
    target_accuracy: float = Field(0.25, ge=0, le=1)
    """Stop as soon as greedy accuracy on a validation draw reaches this."""
    check_every: int = Field(10, ge=1)
    """Steps between validation checks (accuracy jumps fast, so check often)."""
    check_size: int = Field(200, ge=10)


class AlgorithmSpec(_Spec):
    """GRPO-style policy gradient with a PPO-clip loss against behaviour logprobs."""

    lr: float = Field(1e-4, gt=0)
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = Field(0.0, ge=0)
    clip_eps: float = Field(0.2, gt=0, lt=1)
    grad_clip: float = Field(1.0, gt=0)
    publish_every: int = Field(1, ge=1)
    """Publish a new weight version every this many optimizer steps."""


class PolicySpec(_Spec):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,31}$")
    """Lower-case identifier; names the trajectory table `traj_<name>` and weight stream."""
    model: ModelSpec = ModelSpec()
    warm_start: WarmStartSpec = WarmStartSpec()
    algorithm: AlgorithmSpec = AlgorithmSpec()


class EnvSpec(_Spec):
    name: Literal["math"] = "math"
    digits: int = Field(3, ge=1, le=6)
    op: Literal["+", "-", "*"] = "+"
    eval_size: int = Field(500, ge=10)
    """Held-out tasks for the final evaluation (disjoint from training tasks)."""
    turn_latency_ms: float = Field(0.0, ge=0)
    """Modelled wait per episode turn (a remote tool, sandbox or environment).
    The episodes of a batch wait concurrently, as async tool calls do."""


class RolloutSpec(_Spec):
    workers: int = Field(1, ge=1, le=64)
    engine: Literal["hf"] = "hf"
    prompts_per_batch: int = Field(32, ge=1)
    samples_per_prompt: int = Field(8, ge=2)
    """Samples of one task compared with each other (a GRPO group); at least 2."""
    temperature: float = Field(1.0, gt=0)
    max_backlog_batches: int = Field(2, ge=1)
    """Backpressure: a worker waits while this many unconsumed batches are queued."""
    max_weight_lag: int = Field(4, ge=0)
    """A worker stops producing when its loaded weights trail the newest by more."""
    threads: int = Field(1, ge=1)


class TrainerSpec(_Spec):
    threads: int = Field(1, ge=1)
    poll_interval_s: float = Field(0.02, gt=0)
    checkpoint_every: int = Field(10, ge=1)
    """Steps between checkpoints (model, optimizer, RNG, cursor); also on SIGTERM."""
    keep_checkpoints: int = Field(2, ge=1)


class StageSpec(_Spec):
    name: str
    """A built-in stage (see astraflow.data.stages) or `module:attr` for your own."""
    params: dict[str, Any] = {}


def _default_stages() -> list[StageSpec]:
    return [
        StageSpec(name="staleness", params={"max_versions": 8}),
        StageSpec(name="zero_variance_filter"),
        StageSpec(name="group_advantages"),
    ]


class StopSpec(_Spec):
    max_steps: int = Field(2000, ge=1)
    """Trainer steps (consumed batches) after which the run ends."""
    max_minutes: float = Field(6.0, gt=0)
    target_accuracy: float | None = Field(None, ge=0, le=1)
    """End early once live held-out accuracy reaches this."""
    eval_every_s: float = Field(20.0, gt=0)
    live_eval_size: int = Field(200, ge=10)


class StoreSpec(_Spec):
    uri: str | None = None
    """Trajectory/ledger/metrics location, a path or s3://bucket/prefix; default
    `runs/<name>/store`. Credentials and endpoint come from the environment only."""
    weights: str | None = None
    """Weight store root; default `<uri>/weights`, or `runs/<name>/weights`."""
    checkpoints: str | None = None
    """Trainer checkpoints; default `<uri>/checkpoints`, or `runs/<name>/checkpoints`."""
    retry_budget_s: float = Field(120.0, gt=0)
    """How long components retry an unreachable store before stopping with an error."""

    @field_validator("uri", "weights", "checkpoints")
    @classmethod
    def _location(cls, v: str | None) -> str | None:
        if v is None or "://" not in v or v.startswith("file://"):
            return v
        parsed = urlparse(v)
        if parsed.scheme != "s3":
            raise ValueError(f"scheme {parsed.scheme!r} is not supported: use a local path or "
                             f"s3://bucket/prefix (GCS and others through AWS_ENDPOINT_URL)")
        if "@" in parsed.netloc or parsed.password or parsed.query:
            raise ValueError("credentials do not belong in a store URI: set AWS_ACCESS_KEY_ID / "
                             "AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL) in the environment")
        if not parsed.netloc:
            raise ValueError(f"{v!r} names no bucket (expected s3://bucket/prefix)")
        return v.rstrip("/")
    keep_last: int = Field(4, ge=1)
    keep_every: int = Field(25, ge=0)
    """Also keep every N-th version (milestones for accuracy curves); 0 = none."""


class FlowSpec(_Spec):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    seed: int = 0
    mode: Literal["async", "sync"] = "async"
    """`async`: decoupled processes over the store; `sync`: the trainer-centred baseline."""
    policies: list[PolicySpec] = Field(min_length=1)
    env: EnvSpec = EnvSpec()
    rollout: RolloutSpec = RolloutSpec()
    trainer: TrainerSpec = TrainerSpec()
    stages: list[StageSpec] = Field(default_factory=_default_stages)
    stop: StopSpec = StopSpec()
    store: StoreSpec = StoreSpec()

    @field_validator("policies")
    @classmethod
    def _one_policy_for_now(cls, v: list[PolicySpec]) -> list[PolicySpec]:
        names = [p.name for p in v]
        if len(set(names)) != len(names):
            raise ValueError(f"policy names must be unique, got {names}")
        if len(v) != 1:
            raise ValueError(
                "this version trains exactly one policy per flow; "
                "multi-policy flows are not supported yet"
            )
        return v

    @field_validator("stages")
    @classmethod
    def _stages_exist(cls, v: list[StageSpec]) -> list[StageSpec]:
        from astraflow.data.stages import resolve_stage

        for s in v:
            resolve_stage(s.name)  # raises with the list of known stages
        return v

    @property
    def policy(self) -> PolicySpec:
        return self.policies[0]

    def batch_rows(self) -> int:
        return self.rollout.prompts_per_batch * self.rollout.samples_per_prompt

    def dump(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _format(err: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid flow ({err.error_count()} problem(s)):"]
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            field = str(e["loc"][-1])
            known = _known_fields(e["loc"][:-1])
            close = difflib.get_close_matches(field, known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known fields: {', '.join(known)}"
            msg = f"unknown field — {hint}"
        elif e["type"] == "missing":
            msg = "required field is missing — add it"
        elif e["loc"][:1] == ("store",):
            pass  # never echo a store location back: it may carry a credential
        else:
            msg = f"{msg} (got {e.get('input')!r})"
        lines.append(f"  {path}: {msg}")
    return "\n".join(lines)


def _known_fields(loc: tuple[Any, ...]) -> list[str]:
    model: Any = FlowSpec
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        ann = field.annotation
        args = getattr(ann, "__args__", None)
        if args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
            ann = args[0]
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return sorted(model.model_fields)


def parse_flow(data: Any, source: str = "<flow>") -> FlowSpec:
    if not isinstance(data, dict):
        raise FlowError(f"{source}: a flow is a YAML mapping (name:, policies:, …), got {type(data).__name__}")
    try:
        return FlowSpec.model_validate(data)
    except ValidationError as err:
        raise FlowError(_format(err, source)) from None


def load_flow(path: str | Path, overrides: dict[str, Any] | None = None) -> FlowSpec:
    """Read and validate a flow YAML; `overrides` are dotted keys (`stop.max_steps`)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise FlowError(f"{path}: no such flow file") from None
    except yaml.YAMLError as err:
        raise FlowError(f"{path}: not valid YAML: {err}") from None
    for key, value in (overrides or {}).items():
        _set_dotted(data, key, value)
    return parse_flow(data, str(path))


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for p in parts[:-1]:
        if isinstance(node, list):
            node = node[int(p)]
        else:
            node = node.setdefault(p, {})
    if isinstance(node, list):
        node[int(parts[-1])] = value
    else:
        node[parts[-1]] = value
