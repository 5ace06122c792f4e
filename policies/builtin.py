"""Built-in scaling policies: fixed and the dead band on trainer wait (cost: `cost/`).

    fixed     N workers in one pool, whatever happens (the baseline).
    deadband  the AstraFlow paper's: one pool; add `step` workers when the trainer
              waited more than `high` of the window, retire `step` when it waited
              less than `low` and the backlog is past `backlog_high` of the
              backpressure bound (workers about to block). Hold otherwise.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from astraflow.policies.api import Observation, Plan, Policy, PoolState
from astraflow.policies.options import explain

_TYPED = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class FixedConfig(BaseModel):
    """The `fixed` policy's settings."""

    model_config = _TYPED
    workers: int = Field(1, ge=0)
    """Workers to run, always."""
    pool: str | None = None
    """The pool they run in (default: the first pool)."""


class DeadBandConfig(BaseModel):
    """The `deadband` policy's settings."""

    model_config = _TYPED
    pool: str | None = None
    """The pool it scales (default: the first pool)."""
    low: float = Field(0.02, ge=0, le=1)
    """Retire `step` workers when the trainer waited less than this share of the window
    (and the backlog is past `backlog_high` of its bound)."""
    high: float = Field(0.10, ge=0, le=1)
    """Add `step` workers when the trainer waited more than this share of the window."""
    step: int = Field(1, ge=1)
    """Workers added or retired at a time."""
    min_workers: int = Field(1, ge=0)
    """Never fewer workers than this."""
    backlog_high: float = Field(0.75, ge=0, le=1)
    """Share of the backpressure bound past which workers are about to block."""
    start: int | None = Field(None, ge=0)
    """Workers to start with when none runs (None: grow from `min_workers`)."""

    @model_validator(mode="after")
    def _band(self) -> DeadBandConfig:
        if not self.low <= self.high:
            raise ValueError(f"need 0 <= low <= high <= 1, got low={self.low} "
                             f"high={self.high} (e.g. low: 0.02, high: 0.10)")
        return self


def _typed(model: type[BaseModel], what: str, **options: Any) -> Any:
    try:
        return model(**options)
    except ValidationError as err:
        raise ValueError(explain(err, what)) from None


def _one_pool(obs: Observation, pool: str | None) -> PoolState:
    return obs.pool(pool) if pool else obs.pools[0]


class Fixed(Policy):
    """`workers` in `pool` (default: the first pool), always."""

    name = "fixed"

    def __init__(self, workers: int = 1, pool: str | None = None):
        self.config = _typed(FixedConfig, "fixed", workers=workers, pool=pool)
        self.workers, self.pool = self.config.workers, pool

    def plan(self, obs: Observation) -> Plan:
        p = _one_pool(obs, self.pool)
        return Plan({p.pool.name: self.workers}, f"fixed at {self.workers}")


class DeadBand(Policy):
    """The paper's dead band on trainer wait, in one pool."""

    name = "deadband"

    def __init__(self, pool: str | None = None, low: float = 0.02, high: float = 0.10,
                 step: int = 1, min_workers: int = 1, backlog_high: float = 0.75,
                 start: int | None = None):
        self.config = _typed(DeadBandConfig, "deadband", pool=pool, low=low, high=high,
                             step=step, min_workers=min_workers, backlog_high=backlog_high,
                             start=start)
        c = self.config
        self.pool, self.low, self.high, self.step = c.pool, c.low, c.high, c.step
        self.min_workers, self.backlog_high, self.start = c.min_workers, c.backlog_high, c.start

    def plan(self, obs: Observation) -> Plan:
        p = _one_pool(obs, self.pool)
        n, wait = p.live, obs.wait_fraction
        if n == 0 and self.start:
            return Plan({p.pool.name: self.start}, f"start with {self.start}")
        full = [t for t in obs.trainers
                if t.max_backlog_rows and t.backlog_rows >= self.backlog_high * t.max_backlog_rows]
        if wait > self.high:
            return Plan({p.pool.name: n + self.step},
                        f"trainer waited {wait:.0%} > {self.high:.0%}: add {self.step}")
        if wait < self.low and full and n > self.min_workers:
            t = full[0]
            return Plan({p.pool.name: max(self.min_workers, n - self.step)},
                        f"trainer waited {wait:.0%} < {self.low:.0%} and {t.policy}'s backlog "
                        f"{t.backlog_rows} rows >= {self.backlog_high:.0%} of "
                        f"{t.max_backlog_rows}: retire {self.step}")
        if n < self.min_workers:
            return Plan({p.pool.name: self.min_workers},
                        f"up to min_workers {self.min_workers} (trainer waited {wait:.0%})")
        return Plan({p.pool.name: n}, f"hold at {n} (trainer waited {wait:.0%})")
