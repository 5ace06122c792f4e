"""Built-in scaling policies: fixed, dead band on trainer wait, cost-aware.

    fixed     N workers in one pool, whatever happens (the baseline).
    deadband  the AstraFlow paper's: one pool; add `step` workers when the trainer
              waited more than `high` of the window, retire `step` when it waited
              less than `low` and the backlog is past `backlog_high` of the
              backpressure bound (workers about to block). Hold otherwise.
    cost      fewest dollars per useful row that keeps every trainer fed, in the pools
              whose rows take no more GPU-hours than on-demand's (`cost.py`).
"""

from __future__ import annotations

from astraflow.policies.api import Observation, Plan, Policy, PoolState
from astraflow.policies.cost import CostAware


def _one_pool(obs: Observation, pool: str | None) -> PoolState:
    return obs.pool(pool) if pool else obs.pools[0]


class Fixed(Policy):
    """`workers` in `pool` (default: the first pool), always."""

    name = "fixed"

    def __init__(self, workers: int = 1, pool: str | None = None):
        self.workers, self.pool = int(workers), pool

    def plan(self, obs: Observation) -> Plan:
        p = _one_pool(obs, self.pool)
        return Plan({p.pool.name: self.workers}, f"fixed at {self.workers}")


class DeadBand(Policy):
    """The paper's dead band on trainer wait, in one pool."""

    name = "deadband"

    def __init__(self, pool: str | None = None, low: float = 0.02, high: float = 0.10,
                 step: int = 1, min_workers: int = 1, backlog_high: float = 0.75,
                 start: int | None = None):
        if not 0 <= low <= high <= 1:
            raise ValueError(f"deadband: need 0 <= low <= high <= 1, got low={low} high={high}")
        self.pool, self.low, self.high, self.step = pool, low, high, step
        self.min_workers, self.backlog_high, self.start = min_workers, backlog_high, start

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


BUILTIN: dict[str, type[Policy]] = {"fixed": Fixed, "deadband": DeadBand, "cost": CostAware}
