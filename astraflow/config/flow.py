"""FlowSpec: the typed model of a flow YAML, and PolicySpec, one policy in it.

A flow names its policies, workload, rollout and trainer settings, the data
stages that turn trajectories into a batch, and when to stop; each section's
model lives in the module of its subject (model, algorithm, workload,
components, store, cloud). Every field has a docstring and a default that works
on the embedded default (one CPU machine). Reading a file: astraflow.config.loader.
"""

from __future__ import annotations

from typing import Any, Literal

import yaml
from pydantic import Field, field_validator, model_validator

from astraflow import registry
from astraflow.config.algorithm import AlgorithmSpec, StageSpec, default_stages
from astraflow.config.cloud import LaunchSpec
from astraflow.config.components import RolloutSpec, StopSpec, TrainerSpec
from astraflow.config.model import ModelSpec, WarmStartSpec
from astraflow.config.spec import Spec, unique
from astraflow.config.store import StoreSpec
from astraflow.config.workload import EnvSpec, WorkflowSpec

HF_MAX_UPDATE_KL = 0.02
"""`algorithm.max_update_kl` of an `hf` policy that does not set it: the per-update KL
that PPO practice targets (0.01-0.02; PPO's adaptive-KL and target-KL settings), the
top of that range since a pulled-back update still costs its forward passes."""

HF_ENTROPY_FLOOR_OF_V0 = 0.3
"""`algorithm.entropy_floor_of_v0` of an `hf` policy that sets no floor: the sampling
entropy's floor is this share of version 0's own. Once most groups are solved, GRPO's
few groups left with signal drive the sampling entropy down (SmolLM2 on arithmetic at
T 0.7: 1.0 nats per token at version 0, 0.12-0.15 when its held-out fell) until a
group's samples agree on a wrong answer and nothing corrects it. On that task this
share gives the 0.3 nats the floor was measured at (docs/benchmarks/peers.md, "An
entropy floor, and a decaying rate"). A share rather than a number, because a
tool-calling agent starts far surer (SmolLM2 on SQL after its warm start: 0.016), and
there a fixed 0.3 kept the bonus on at every step and walked the agent off its skill
(held-out 90% → 34%: "A floor relative to version 0")."""

HF_UPDATE_KL_SOLVED_AT = 1.0
"""`algorithm.update_kl_solved_at` of an `hf` policy that does not set it: a group is
solved when every sample earns the whole reward (1.0, a correct answer's reward in the
built-in envs). Late in a run the whole bound on each update, carried by the one or two
groups still unsolved, walks a learnt skill off; the scaled bound shrinks those steps
and leaves the early ones whole (measured: docs/benchmarks/peers.md, "The bound scaled
by the share of groups already solved")."""


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
    def _pretrained_defaults(self) -> PolicySpec:
        """Defaults of a pretrained (`hf`) policy, each only where the flow left it unset.
        Version 0 is the model as it is, so a warm start is opt-in (a tiny model from
        scratch needs one to get any reward). A pretrained model has skill to lose, so
        it learns under three guards (why and what each measured:
        docs/benchmarks/peers.md): each update is bounded (`max_update_kl`; `null`
        turns it off), since with clipping and Adam an update moves it about as far
        whatever its batch says, and more tightly the more of its batch is already
        solved (`update_kl_solved_at`); the rate decays over the run's budget (`lr_schedule:
        cosine`), since at a constant rate Adam takes full steps on the last few groups
        with signal; and the sampling entropy has a floor, a share of version 0's
        (`entropy_floor_of_v0`)."""
        if self.model.kind != "hf":
            return self
        if "warm_start" not in self.model_fields_set:
            self.warm_start = WarmStartSpec(max_steps=0)
        given = self.algorithm.model_fields_set
        unset = {"max_update_kl": HF_MAX_UPDATE_KL, "lr_schedule": "cosine",
                 "update_kl_solved_at": HF_UPDATE_KL_SOLVED_AT}
        unset = {k: v for k, v in unset.items() if k not in given}
        if not given & {"entropy_floor", "entropy_floor_of_v0"}:  # `entropy_floor: null`: none
            unset["entropy_floor_of_v0"] = HF_ENTROPY_FLOOR_OF_V0
        if unset:
            self.algorithm = self.algorithm.model_copy(update=unset)
        return self



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
    stages: list[StageSpec] = Field(default_factory=default_stages)
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
    def _endpoint_is_async(self) -> FlowSpec:
        if self.rollout.endpoint is not None and self.mode == "sync":
            raise ValueError("rollout.endpoint serves an agent's episodes as they come; sync "
                             "mode plays the workflow's batches in lockstep: use mode: async")
        return self

    @model_validator(mode="after")
    def _fill_is_async(self) -> FlowSpec:
        for p in self.policies:
            if p.algorithm.min_signal_rows is not None and self.mode == "sync":
                raise ValueError(f"policies.{p.name}.algorithm.min_signal_rows waits for further "
                                 "rollout batches; sync mode trains on each batch as it is "
                                 "produced: remove it, or use mode: async")
        return self

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
            # Adapters (lora, shared_base) differ freely: version 0 is full weights.
            if (self.policy_spec(src).model.model_dump(exclude={"lora", "shared_base"})
                    != p.model.model_dump(exclude={"lora", "shared_base"})):
                raise ValueError(f"policies.{p.name}.warm_start.init_from: {src!r} has a different "
                                 f"model shape; give both the same `model`")
        return self

    @model_validator(mode="after")
    def _shared_bases_agree(self) -> FlowSpec:
        names = [p.name for p in self.policies]
        for group, members in self.shared_bases().items():
            specs = [self.policy_spec(m) for m in members]
            if group in names:
                raise ValueError(f"shared_base: {group} is also a policy's name; name the base "
                                 f"otherwise (its trainer process is `trainer-{group}`)")
            if self.rollout.engine != "hf":
                raise ValueError(f"policies {members} share base {group!r}, which the hf engine "
                                 f"serves (one base, an adapter per policy); vLLM multi-LoRA "
                                 f"serving is not built yet: use rollout.engine: hf")
            shape = {m: s.model.model_dump(exclude={"lora"}) for m, s in zip(members, specs,
                                                                             strict=True)}
            if any(v != shape[members[0]] for v in shape.values()):
                raise ValueError(f"policies {members} share base {group!r} but their models "
                                 f"differ (kind, path, dtype or shape): give them the same "
                                 f"`model` but for `lora`")
            kl = [s.name for s in specs if s.algorithm.kl_coef > 0]
            if kl:
                raise ValueError(f"policies {kl} share base {group!r}: algorithm.kl_coef > 0 "
                                 f"with a shared base is not built yet; set kl_coef: 0")
            first = specs[0]
            as_is = first.warm_start.max_steps == 0 and first.warm_start.init_from is None
            for s in specs[1:]:
                ok = s.warm_start.max_steps == 0 and s.warm_start.init_from in (
                    {first.name, None} if as_is else {first.name})
                if not ok:
                    raise ValueError(
                        f"policies.{s.name} shares base {group!r} with {first.name}, so its "
                        f"version 0 must be {first.name}'s: set warm_start: {{init_from: "
                        f"{first.name}, max_steps: 0}}")
        return self

    def shared_bases(self) -> dict[str, list[str]]:
        """`model.shared_base` name → the policies sharing it, in role order."""
        out: dict[str, list[str]] = {}
        for name in self.policy_names():
            group = self.policy_spec(name).model.shared_base
            if group is not None:
                out.setdefault(group, []).append(name)
        return out

    def _roles(self) -> tuple[str, ...]:
        return registry.resolve("workflow", self.workflow.name).role_names(self.workflow.params)

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
        wf = registry.resolve("workflow", self.workflow.name)
        name = self.policy.name if policy is None else policy
        per_task = sum(wf.parts_per_task(role, self.workflow.params, self.rollout.samples_per_prompt)
                       for role, p in self.role_map().items() if p == name)
        return self.rollout.prompts_per_batch * per_task

    def backlog_rows(self, policy: str) -> int:
        """The most unconsumed rows the workers let `policy`'s table hold
        (`rollout.max_backlog_batches` of its batches): more never come."""
        return self.rollout.max_backlog_batches * self.batch_rows(policy)

    def policy_names(self) -> list[str]:
        """Policies in the order they first play a role (primary first)."""
        return list(dict.fromkeys(self.role_map().values()))

    def dump(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)
