"""The `launch:` section of a flow: where its trainers and rollout worker pools run.

`astraflow launch FLOW` (astraflow.cloud.launch) turns this into SkyPilot managed jobs
(`sky/train.sky.yaml`, `sky/rollout.sky.yaml`) and Modal calls. Plain pydantic
models, in the style of astraflow.config.flow: nothing here imports SkyPilot or Modal,
so a flow file validates on any machine.

Accelerators are SkyPilot strings, `NAME:COUNT` (`H100:1`, `A100-80GB:1`, `L4:1`);
Modal reads the same names. Where a component may run is a SkyPilot `infra`
string, `cloud[/region[/zone]]` (`aws`, `aws/us-east-1`, `gcp/us-central1`).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from astraflow.config.spec import Spec, unique

_ACCELERATOR = r"^[A-Za-z0-9][A-Za-z0-9_.+-]*(:\d+(\.\d+)?)?$"
_INFRA = r"^[A-Za-z0-9*][A-Za-z0-9*_.:-]*(/[A-Za-z0-9*][A-Za-z0-9*_.:-]*){0,2}$"


def _check_accelerators(values: list[str]) -> list[str]:
    for v in values:
        if not re.match(_ACCELERATOR, v):
            raise ValueError(f"{v!r} is not an accelerator: use NAME:COUNT, e.g. 'L4:1' or "
                             f"'A100-80GB:1'")
    if len(set(values)) != len(values):
        raise ValueError(f"accelerators are listed twice: {values}")
    return values


def _check_infra(values: list[str]) -> list[str]:
    for v in values:
        if not re.match(_INFRA, v):
            raise ValueError(f"{v!r} is not a SkyPilot infra: use cloud[/region[/zone]], e.g. "
                             f"'aws/us-east-1' or 'gcp'")
    if len(set(values)) != len(values):
        raise ValueError(f"infra entries are listed twice: {values}")
    return values


class _Placement(Spec):
    """Checks the `accelerators` and `infra` lists of the launch models below."""

    @field_validator("accelerators", check_fields=False)
    @classmethod
    def _accelerator_names(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else _check_accelerators(v)

    @field_validator("infra", check_fields=False)
    @classmethod
    def _infra_names(cls, v: list[str]) -> list[str]:
        return _check_infra(v)


#: The GPUs a trainer asks for when the flow wants one (`trainer.device: cuda`) and the
#: launch section names none: any one of these per node; SkyPilot picks the cheapest.
DEFAULT_TRAINER_GPUS = ("H100:1", "A100-80GB:1", "A100:1", "L40S:1")
#: The CPU VM of a trainer that trains on CPU (SkyPilot `cpus`), unless `cpus` or
#: `instance_type` say otherwise; the task file carries the same default.
DEFAULT_TRAINER_CPUS = "8+"


class TrainerLaunchSpec(_Placement):
    """Each policy's trainer runs as one SkyPilot managed job (`sky/train.sky.yaml`) of
    `nodes` VMs; more than one process (several nodes, or several GPUs per node) runs
    it under `torchrun` with SkyPilot's rendezvous.

    GPUs are rented only when asked for: name `accelerators`, or set `trainer.device:
    cuda` in the flow (then the default GPU list applies). Otherwise the trainer gets a
    CPU VM (`cpus`, default 8+), the cheap and honest choice for a trainer that trains
    on CPU; a trainer whose `trainer.device` is `cpu` is refused GPUs outright."""

    accelerators: list[str] | None = None
    """GPUs per node, any one of these (SkyPilot `any_of`), `NAME:COUNT`: `H100:8` is one
    node of 8 GPUs and 8 trainer ranks on it. None (default): follow `trainer.device`
    (`cuda`: H100:1 / A100-80GB:1 / A100:1 / L40S:1; otherwise a CPU VM). `[]`: a CPU VM."""
    nodes: int = Field(1, ge=1, le=256)
    """VMs of the trainer job (SkyPilot `num_nodes`); ranks = nodes x GPUs per node (one
    per node on CPU). Each node runs `torchrun --nnodes N --node-rank R ...`."""
    cpus: str | None = Field(None, pattern=r"^\d+(\.\d+)?\+?$")
    """vCPUs per node, SkyPilot form (`8`, `8+`). Default: 8+ for a CPU trainer, whatever
    the GPU instance has otherwise."""
    memory: str | None = Field(None, pattern=r"^\d+(\.\d+)?[+x]?$")
    """GiB of memory per node, SkyPilot form (`32+`); default: SkyPilot's."""
    instance_type: str | None = Field(None, min_length=1)
    """An exact instance type (`m6i.4xlarge`, `p5.48xlarge`) instead of `cpus`/`memory`."""
    infra: list[str] = []
    """Where the trainer may run, `cloud[/region]` entries (each is tried with every
    accelerator); empty: any cloud and region SkyPilot has access to."""
    spot: bool = True
    """Spot/preemptible VMs. A preempted trainer is relaunched by SkyPilot (next region
    first) and resumes from its newest checkpoint in the bucket."""
    max_restarts_on_errors: int = Field(3, ge=0)
    """Relaunches after the trainer itself fails (preemptions are always recovered)."""

class RolloutPoolSpec(_Placement):
    """A group of rollout workers that run on one backend for a bounded time."""

    name: str = Field(pattern=r"^[a-z][a-z0-9-]{0,23}$")
    """Lower-case identifier; names the pool's jobs (`<flow>-<pool>`) and its worker ids."""
    backend: Literal["sky", "modal"]
    """`sky`: one SkyPilot managed job per worker (`sky/rollout.sky.yaml`), spot, each on its
    own VM, so workers spread over the regions in `infra`. `modal`: one call of the
    deployed Modal app per worker (`modal deploy apps/rollout.py` first)."""
    workers: int = Field(1, ge=1, le=256)
    """How many workers this pool starts."""
    minutes: float = Field(60.0, gt=0, le=24 * 60)
    """Each worker stops after this many minutes (launch again, or let a scaling policy,
    to keep going). A sky worker recovered after a preemption starts its minutes anew."""
    region: str | None = None
    """The weight replica the workers read (`astraflow rollout --region`). Default: a sky
    worker names the region its VM landed in; a Modal worker names none (primary store)."""
    accelerators: list[str] = []
    """sky: any one of these per worker (default: the task file's list). modal: at most
    one, replacing the GPU list the app was deployed with (default: the app's list)."""
    infra: list[str] = []
    """sky only: where workers may run, `cloud[/region]` entries, each tried with every
    accelerator; empty: the task file's list (several clouds and regions)."""
    spot: bool = True
    """sky only: spot/preemptible VMs (Modal has no such choice)."""
    cold_start_s: float = Field(120.0, gt=0, le=4 * 3600)
    """Seconds from a worker's launch to its first row (VM, image, model load, first batch),
    for `astraflow scale`: a scaling policy's lead time, and, times three (at least 600),
    how long a launch may go without a row before it counts as refused."""

    @model_validator(mode="after")
    def _backend_fields(self) -> RolloutPoolSpec:
        if self.backend == "modal":
            if self.infra:
                raise ValueError(f"pool {self.name!r}: `infra` applies to sky pools; Modal places "
                                 f"its containers itself (drop `infra` or use backend: sky)")
            if len(self.accelerators) > 1:
                raise ValueError(f"pool {self.name!r}: a Modal pool takes at most one accelerator "
                                 f"(it replaces the app's GPU list, e.g. accelerators: [L4]); got "
                                 f"{self.accelerators}")
        return self


class TrafficSpec(Spec):
    """What each policy's run moves across region and cloud boundaries, for the launch
    estimate's egress lines (priced per GB by `astraflow.policies.egress`)."""

    version_gb: float = Field(0.0, ge=0)
    """GB of one whole weight version in the dtype the workers serve (SmolLM2-135M in
    bfloat16: 0.27; an 8B model: 16); 0: the weights' egress is not estimated."""
    versions_per_hour: float = Field(60.0, ge=0)
    """Versions each policy publishes per hour (one per trainer step)."""
    reloads_per_hour: float = Field(60.0, ge=0)
    """Times a rollout worker loads the newest weights per hour (once per batch)."""
    rows_per_hour: float = Field(0.0, ge=0)
    """Trajectory rows of each policy all workers give per hour (shared by the pools by
    their workers); 0: the rows' egress is not estimated."""
    row_kb: float = Field(8.0, ge=0)
    """kB of one trajectory row as stored."""
    delta_ratio: float = Field(0.037, gt=0, le=2)
    """A delta's bytes over a whole version, used where `store.delta_chain` > 0 (0.037:
    SmolLM2-135M in bfloat16, measured; docs/weights.md)."""


class LaunchSpec(Spec):
    """Where `astraflow launch` runs this flow: one trainer per policy and rollout pools,
    all started with the flow's `store.uri` (an s3:// bucket) and nothing else."""

    trainer: TrainerLaunchSpec = TrainerLaunchSpec()
    """Resources of every policy's trainer job."""
    rollout: list[RolloutPoolSpec] = []
    """Rollout worker pools; empty: start workers yourself (`astraflow rollout STORE`)."""
    modal_app: str = Field("astraflow-rollout", min_length=1)
    """Name of the deployed Modal app whose `Rollout` class modal pools call."""
    store_region: str | None = Field(None, pattern=r"^[a-z0-9]+/[A-Za-z0-9_.-]+$")
    """The store bucket's `cloud/region` (e.g. aws/us-east-1). With it, `launch --dry-run`
    prices the bytes crossing to trainers and pools placed elsewhere (egress, with
    `traffic`); None: egress is not estimated."""
    traffic: TrafficSpec = TrafficSpec()
    """Bytes per version and rows per hour, for the egress estimate."""

    @field_validator("rollout")
    @classmethod
    def _unique_pools(cls, v: list[RolloutPoolSpec]) -> list[RolloutPoolSpec]:
        unique([p.name for p in v], "pool names must be unique")
        return v
