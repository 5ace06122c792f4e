"""How a policy learns: the RL objective and optimizer (`algorithm:`) and the data stages
that turn consumed rows into its batch (`stages:`). Stage names are checked against
astraflow.registry, which imports nothing to do so."""

from __future__ import annotations

import inspect
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from astraflow import registry
from astraflow.config.spec import Spec


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
    min_signal_rows: int | None = Field(None, ge=1)
    """Batch fill (async mode): a trainer step waits for further rollout batches, up to
    the workers' backlog bound, until its rows hold at least this many in groups whose
    rewards differ (DAPO's dynamic sampling, done by the consumer; astraflow.train.consume.
    BatchFill says why). None: step on each batch as it comes."""
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
    `lr_decay_steps` updates, or over the run's budget (then held there). Default:
    `cosine` over the budget for `hf` policies (astraflow.config.flow says why),
    `constant` for `tiny` ones."""
    lr_decay_steps: int | None = Field(None, ge=1)
    """`cosine`: updates after warmup over which the learning rate decays. None: the
    run's budget, whichever of `stop.max_steps` (× `minibatches` updates) and
    `stop.max_minutes` (counted from version 0's publish) it has used more of, so the
    rate is at its floor when the run ends (the budget-aware schedule of Li et al. 2020,
    "Budgeted Training"; transformers' Trainer decays over `max_steps` likewise)."""
    lr_min_ratio: float = Field(0.1, ge=0, le=1)
    """`cosine`: the final learning rate as a fraction of `lr`."""
    max_update_kl: float | None = Field(None, gt=0)
    """Trust region of each optimizer update: after the update, the KL from the policy
    before it to the policy after it, per unmasked token of the update's rows, is
    measured, and an update above this bound is pulled back along its direction to it
    (astraflow.train.trust). Unlike PPO's per-token clip it bounds the whole move, so a
    late update carried by two groups cannot move the model further than this (how far
    relative to an update on more groups: `max_update_kl_rows`). Cost: one no-grad forward pass per update and one copy of the
    trainable parameters. None: unbounded. Default: 0.02 for `hf` policies (a pretrained
    model has skill to lose; astraflow.config.flow.HF_MAX_UPDATE_KL says why this
    value), unbounded for `tiny` ones; `null` turns it off."""
    max_update_kl_rows: int | None = Field(None, ge=1)
    """With `max_update_kl`: the rows with a non-zero advantage an update needs for the
    whole bound; an update on fewer may move the policy only their share of it
    (`max_update_kl` × rows / this). A fixed bound lets one group's update move the model
    as far as eight groups' (astraflow.train.trust). None: every update gets the whole
    bound. Measured on SmolLM2 against TRL and not made a default: 16 rows took +40
    points 2.3x longer and fell further (docs/benchmarks/peers.md)."""
    update_kl_solved_at: float | None = None
    """With `max_update_kl`: a group of the step's consumed rows whose every reward is
    at least this is solved, and each update's bound is scaled by (1 − s)², s the share
    of the step's groups that are solved (counted before `zero_variance_filter` drops
    them), so the update's length shrinks with the share of the batch the policy already
    gets right (astraflow.train.trust.update_budget says why). Early in a run few groups
    are solved and the bound is whole; after a fall fewer are, and it grows back.
    Default: 1.0 for `hf` policies (astraflow.config.flow.HF_UPDATE_KL_SOLVED_AT), off
    for `tiny` ones; `null` turns it off. Metric: `solved_share`."""
    kl_coef: float = Field(0.0, ge=0)
    """Weight of a KL penalty toward a frozen reference policy: version 0 of this same
    policy (its pretrained or warm-started starting point; version 0 is never pruned).
    Per unmasked completion token the k3 estimator of KL(policy ‖ reference),
    exp(ref − new) − (ref − new) − 1 (≥ 0, unbiased, low variance), capped at 10 (as
    verl caps it), times `kl_coef`, is added to the policy loss and normalised like it;
    the metric `kl_ref` is its mean per token. It anchors what the policy already did
    well (an all-success group carries no advantage, so nothing else holds it), but only
    on rows that reach the loss: the default `zero_variance_filter` stage drops
    all-success groups, so to anchor them give that stage `keep_solved_at: 1.0`, or leave
    it out (their GRPO advantage is 0: they carry only the KL term, and count in the
    token mean). Not a default (docs/benchmarks/peers.md says why). Cost: a second copy of
    the model in the trainer's memory and one extra no-grad forward pass per micro-batch. 0 (default):
    off, no reference is loaded. With `trainer.ranks` > 1 (FSDP2) every rank holds the
    reference whole (one full copy of the weights per rank)."""

    pg_mean: Literal["all", "signal"] = "all"
    """The policy-gradient term's token mean: over every row that reaches the loss
    (`all`), or over the rows with a non-zero advantage (`signal`); the `kl_coef` term is
    always over every row. With zero-variance groups kept for the anchor (no
    `zero_variance_filter`, or its `keep_solved_at`), `signal` keeps them from diluting
    the update, so the anchor acts on every sampled group (all-wrong ones included) while
    the policy gradient is as large as when they are dropped. With the default stages the
    two are the same."""
    entropy_floor: float | None = Field(None, gt=0)
    """An entropy bonus that acts only below a floor (nats per completion token, at the
    sampling temperature): a minibatch whose sampled tokens' mean surprisal (−behaviour
    logprob, an unbiased estimate of the entropy they were drawn from) is under it adds
    −`entropy_coef` · H per token to the loss, H the new policy's entropy (with grad);
    above it nothing is added. Why: once a group's samples all say the same wrong answer
    their rewards do not differ and GRPO has no gradient to correct it
    (docs/benchmarks/peers.md); a floor keeps the samples apart without the
    ever-present bonus that makes a model ramble (Skywork-OR1 adapts its coefficient
    for the same reason; this one is a fixed hinge, so a resumed trainer carries no
    state). Cost: the entropy's backward on every head chunk of a minibatch under the
    floor. None (default): off."""
    entropy_floor_of_v0: float | None = Field(None, gt=0, lt=1)
    """The same floor, set as this share of version 0's own sampling entropy: the mean
    surprisal of the first batch of rows version 0 sampled (read from the trajectory
    store, so a resumed trainer finds the same value; logged as `entropy_floor`). Why
    relative: how sure a healthy policy is depends on the task. SmolLM2 answering
    arithmetic samples at 1.0 nats a token; after its warm start on SQL tool calls in a
    fixed format, at 0.016. A fixed 0.3 kept the bonus on at every step there and
    walked the agent off its skill (held-out 90% → 34%; docs/benchmarks/peers.md, "A
    floor relative to version 0"): a collapse is a fall from where it started. Set this or
    `entropy_floor`, not both. Default: astraflow.config.flow.HF_ENTROPY_FLOOR_OF_V0 for
    `hf` policies that set neither; off for `tiny` ones."""
    entropy_coef: float = Field(1.0, ge=0)
    """`entropy_floor`: the bonus's weight per token, normalised like the policy loss.
    Large next to the 0.001-0.01 of an ever-present bonus, because it must outweigh the
    policy term's own pull on the entropy: on SmolLM2's late math batches the weight that
    cancels it to first order measured 0.85-0.9 (docs/models.md)."""

    @model_validator(mode="after")
    def _one_floor(self) -> AlgorithmSpec:
        if self.entropy_floor is not None and self.entropy_floor_of_v0 is not None:
            raise ValueError(
                f"set entropy_floor ({self.entropy_floor} nats per token) or "
                f"entropy_floor_of_v0 ({self.entropy_floor_of_v0} of version 0's entropy), "
                "not both")
        return self


class StageSpec(Spec):
    name: str
    """A built-in stage (see astraflow.data.stages; names in astraflow.registry) or `module:attr` for your own."""
    params: dict[str, Any] = {}
    """Keyword arguments of the stage function (e.g. `max_versions: 8`)."""

    @field_validator("name")
    @classmethod
    def _exists(cls, v: str) -> str:
        registry.resolve("stage", v)  # raises with the list of known stages
        return v

    @model_validator(mode="after")
    def _params_fit(self) -> StageSpec:
        """A misspelt parameter fails here, not in the trainer minutes later."""
        try:
            inspect.signature(registry.resolve("stage", self.name)).bind(None, None, **self.params)
        except TypeError as err:
            raise ValueError(f"stage {self.name!r} does not take params {sorted(self.params)}: "
                             f"{err}") from None
        except ValueError:  # no introspectable signature (a C callable): the trainer will tell
            pass
        return self


def default_stages() -> list[StageSpec]:
    """The flow's `stages:` when it gives none: a staleness bound, then GRPO."""
    return [
        StageSpec(name="staleness", params={"max_versions": 8}),
        StageSpec(name="zero_variance_filter"),
        StageSpec(name="group_advantages"),
    ]

