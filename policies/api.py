"""The scaling-policy API: an observation of a run, a plan of workers per pool.

    store (ledger, metrics, progress files, trajectory rows per worker)  ─┐
    backend (live workers per pool, recent preemptions)                  ─┼─► Observation
    price catalog (spot and on-demand $/h per cloud/region/accelerator)  ─┘        │
                                                          policy.plan(obs) ─► Plan: target workers
                                                                                  per pool + reason

The same policy object runs in the simulator (`astraflow.policies.scaling_sim`)
and under `astraflow scale` (`astraflow.scale`), so what was simulated is what
acts. A policy is stateless between calls: everything it needs is in the
observation (the autoscaler can be killed and restarted at any time).

Pure Python: no torch, modal or sky (tested).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

from astraflow.policies.egress import Traffic


@dataclass(frozen=True)
class Pool:
    """Where rollout workers can run: one backend, one place, one accelerator, one price."""

    name: str  # unique; names the pool's workers and jobs
    backend: str = "sky"  # "local" | "modal" | "sky"
    cloud: str = ""  # aws, gcp, modal, local
    region: str = ""
    accelerator: str = ""  # SkyPilot name, e.g. "A100" (count separate)
    accelerator_count: int = 1
    spot: bool = False
    price_per_hour: float = 0.0  # $/h for one worker (whole instance)
    rows_per_s: float = 1.0  # prior throughput of one worker, until measured
    cold_start_s: float = 120.0  # launch to first row (billed)
    max_workers: int = 64
    # Egress (policies/egress.py): $/GB for weights from the store's region to this pool's,
    # and for rows back; `replica`: a weight replica in the pool's region, so weights
    # cross once per version for the region, not once per worker.
    weights_usd_per_gb: float = 0.0
    rows_usd_per_gb: float = 0.0
    replica: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("Pool.name must be a non-empty string")
        for f in ("price_per_hour", "cold_start_s", "weights_usd_per_gb", "rows_usd_per_gb"):
            v = getattr(self, f)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"Pool({self.name}).{f} must be a finite number >= 0, got {v!r}")
        if not (self.rows_per_s > 0):
            raise ValueError(f"Pool({self.name}).rows_per_s must be > 0, got {self.rows_per_s!r}")
        if self.max_workers < 0 or self.accelerator_count < 0:
            raise ValueError(f"Pool({self.name}): max_workers and accelerator_count must be >= 0")

    @property
    def gpus(self) -> int:
        return self.accelerator_count


@dataclass(frozen=True)
class PoolState:
    """What is observed about one pool now."""

    pool: Pool
    live: int = 0  # workers running or starting (billed)
    starting: int = 0  # of `live`: launched, no row yet
    rows_per_s: float | None = None  # measured per productive worker; None: not yet measured
    preemptions_1h: int = 0  # workers lost to the cloud in the last hour
    launch_failures_1h: int = 0  # launches the cloud refused (no capacity) in the last hour
    # Seconds since the pool last lost a worker to the cloud or had a launch refused (one
    # that never did: since the run began). None: the backend does not know.
    quiet_s: float | None = None
    # Seconds since the pool last lost a worker to the cloud (refused launches do not
    # count; one that never did: since the run began). None: the backend does not know.
    since_preemption_s: float | None = None
    blocked_fraction: float = 0.0  # share of worker time spent waiting on backpressure

    @property
    def throughput(self) -> float:
        """Rows/s one productive worker of this pool gives: measured, else the prior."""
        return self.rows_per_s if self.rows_per_s else self.pool.rows_per_s


@dataclass(frozen=True)
class TrainerState:
    """What is observed about one policy's trainer."""

    policy: str
    wait_fraction: float = 0.0  # share of recent wall time the trainer waited for rows
    backlog_rows: int = 0  # rows appended but not consumed yet
    batch_rows: int = 1  # rows one trainer step consumes
    max_backlog_rows: int = 0  # workers block (backpressure) once the backlog reaches this
    demand_rows_per_s: float | None = None  # rows/s it would consume if never waiting
    steps_done: int = 0
    steps_target: int | None = None  # stop.max_steps
    traffic: Traffic = Traffic()  # bytes per version and per row (egress; 0: not counted)

    @property
    def versions_per_hour(self) -> float:
        """Versions it publishes per hour: one per step at its measured pace, else the
        rate its traffic expects (0: unknown)."""
        if self.demand_rows_per_s:
            return self.demand_rows_per_s * 3600.0 / max(self.batch_rows, 1)
        return self.traffic.versions_per_hour or 0.0


@dataclass(frozen=True)
class Observation:
    """Everything a policy may look at. `time` is seconds since the run (or sim) began."""

    time: float
    trainers: tuple[TrainerState, ...]
    pools: tuple[PoolState, ...]
    deadline_s: float | None = None  # seconds from `time` by which training must end
    interval_s: float = 60.0  # until the policy is asked again (what it waits before acting)

    def pool(self, name: str) -> PoolState:
        for p in self.pools:
            if p.pool.name == name:
                return p
        raise KeyError(f"no pool {name!r} in this observation (pools: "
                       f"{', '.join(p.pool.name for p in self.pools)})")

    @property
    def wait_fraction(self) -> float:
        """The hungriest trainer's wait."""
        return max((t.wait_fraction for t in self.trainers), default=0.0)

    @property
    def live(self) -> dict[str, int]:
        return {p.pool.name: p.live for p in self.pools}


@dataclass(frozen=True)
class Plan:
    """Target worker count per pool (pools not named keep their count) and why."""

    targets: dict[str, int]
    reason: str = ""

    def __post_init__(self) -> None:
        for k, v in self.targets.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"Plan target for pool {k!r} must be an integer >= 0, got {v!r}")

    def clamp(self, obs: Observation) -> Plan:
        """Each target within its pool's `max_workers`; unknown pools refused."""
        out = {}
        for name, n in self.targets.items():
            p = obs.pool(name).pool
            out[name] = min(n, p.max_workers)
        return replace(self, targets=out)


@runtime_checkable
class ScalingPolicy(Protocol):
    """A policy: `plan(obs) -> Plan`. Subclass `Policy` or just provide the method."""

    def plan(self, obs: Observation) -> Plan: ...


class Policy:
    """Base class for policies; `name` shows in reports."""

    name: str = "policy"

    def plan(self, obs: Observation) -> Plan:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


@dataclass
class Decision:
    """One plan applied at one time (the simulator's and the autoscaler's log)."""

    time: float
    targets: dict[str, int]
    live: dict[str, int]
    reason: str
    wait_fraction: float = 0.0
    backlog_rows: int = 0
    extra: dict[str, float] = field(default_factory=dict)

