"""How much of the demand a spot pool may supply, whether it may grow, and probing.

One rule sizes a spot pool's share: losing the whole pool at once leaves the trainers
short of its rows for a lead time (an interval to notice, a cold start to replace),
of which the backlog the policy keeps covers some; the time since the pool's last
preemption bounds how often that happens. The pool may supply what keeps the wait so
caused within `wait_budget` of the rows it supplies, and never less than
`max_pool_share` (the hedge while it has no record). Derivation and measurements:
docs/benchmarks/scaling.md.
"""

from __future__ import annotations

from astraflow.policies.api import Observation, PoolState
from astraflow.policies.cost.config import CostConfig


def can_grow(s: PoolState) -> bool:
    """A spot pool that preempted workers or refused a launch in the last hour is short
    of capacity: keep what it has, grow elsewhere."""
    return not (s.pool.spot and (s.preemptions_1h or s.launch_failures_1h))


def share_quiet_s(s: PoolState) -> float | None:
    """The time a pool's share is earned by: since its last preemption (a refused launch
    says the pool is full, not that its workers are at risk); where a backend reports
    only `quiet_s` (since either), that. None: unknown."""
    return s.since_preemption_s if s.since_preemption_s is not None else s.quiet_s


def lead_s(s: PoolState, obs: Observation) -> float:
    """Seconds from losing a pool's workers to their replacements' first rows: the
    interval until the policy sees it, then a cold start."""
    return obs.interval_s + s.pool.cold_start_s


def pool_share(cfg: CostConfig, s: PoolState, obs: Observation, demand: float) -> float:
    """Most of `demand` (rows/s) pool `s` may supply. On demand: all of it.

    Spot: a pool supplying share x, lost at once, leaves x * demand rows/s missing for
    `lead_s` (L) seconds; the backlog the policy keeps (`grow_margin` trainer steps,
    b seconds of demand) covers b of them, so the trainers wait x * L - b seconds. A
    pool quiet for q seconds (`share_quiet_s`) is lost at a rate of at most 1/q (a
    one-sided bound: at a higher rate a quiet spell that long has odds under 1/e).
    Charging each pool `wait_budget` (w) for each unit of share it supplies,
    (x * L - b) / q <= w * x, so x <= b / (L - w * q), and any share once w * q >= L:
    summed over pools, the wait stays within w. Never below `max_pool_share`; unknown
    quiet time: `max_pool_share`."""
    if not s.pool.spot:
        return 1.0
    q = share_quiet_s(s)
    if q is None or demand <= 0:
        return cfg.max_pool_share
    cover = cfg.grow_margin * sum(t.batch_rows for t in obs.trainers) / demand
    left = lead_s(s, obs) - cfg.wait_budget * max(q, 0.0)
    earned = 1.0 if left <= cover else cover / left
    return min(1.0, max(cfg.max_pool_share, earned))


def probe_limit(s: PoolState, interval_s: float) -> int:
    """Most workers a spot pool that `can_grow` refuses may hold through moves: none
    unless only refused launches hold it back (no preemption in the last hour) and none
    was refused in the last interval (`quiet_s`; unknown: none); then what it has plus
    as many again, at least one (a probe, then doubling while launches succeed, as TCP's
    slow start). A refused launch costs nothing and capacity that comes back shows only
    to a launch; these workers replace dearer ones, growth never counts on them."""
    if (not s.pool.spot or s.preemptions_1h or not s.launch_failures_1h
            or s.quiet_s is None or s.quiet_s < interval_s):
        return 0
    return s.live + max(1, s.live)
