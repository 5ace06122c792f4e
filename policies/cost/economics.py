"""What a row costs in each pool, what the trainers consume, and what a move saves.

Dollars per useful row are the price over rows/s net of the cold starts and lost
batches recent preemptions cost; GPU-hours per row are the accelerator's, not its
luck. A pool whose rows take more GPU-hours than the reference's is left out: spot is
meant to replace on-demand at a discount, not to buy the same rows with more GPUs.
A row's dollars include the bytes its worker moves across a region or cloud boundary
(`egress_per_hour`): cheap GPUs an ocean from the store can lose once that counts.
"""

from __future__ import annotations

import math

from astraflow.policies.api import Observation, PoolState
from astraflow.policies.cost.config import CostConfig
from astraflow.policies.egress import GB


def productive_share(cfg: CostConfig, s: PoolState) -> float:
    """Share of a worker's billed time that yields rows, net of the cold starts and lost
    batches its pool's recent preemptions cost."""
    if s.preemptions_1h == 0:
        return 1.0
    per_worker_h = s.preemptions_1h / max(s.live, 1)
    loss = cfg.preemption_loss_s if cfg.preemption_loss_s is not None \
        else s.pool.cold_start_s + 60.0
    return max(0.05, 1.0 - per_worker_h * loss / 3600.0)


def useful_rows_per_s(cfg: CostConfig, s: PoolState) -> float:
    return s.throughput * productive_share(cfg, s)


def egress_per_hour(s: PoolState, obs: Observation | None) -> float:
    """$/h one productive worker of `s` adds in egress: the weights it fetches from the
    store's region (none where a replica serves its region: those bytes cross once per
    version whoever reads them) and the rows it sends back, per trainer's traffic."""
    p = s.pool
    if obs is None or not (p.weights_usd_per_gb or p.rows_usd_per_gb) or not obs.trainers:
        return 0.0
    usd = 0.0
    for t in obs.trainers:
        tr = t.traffic
        if p.weights_usd_per_gb and not p.replica and tr.version_bytes:
            vph = t.versions_per_hour
            rph = 3600.0 * s.throughput / tr.worker_batch_rows if tr.worker_batch_rows else vph
            usd += tr.worker_bytes_per_hour(vph, rph) / GB * p.weights_usd_per_gb
        usd += 3600.0 * s.throughput / len(obs.trainers) * tr.row_bytes / GB * p.rows_usd_per_gb
    return usd


def dollars_per_row(cfg: CostConfig, s: PoolState, obs: Observation | None = None) -> float:
    """The pool's price plus its egress (with `obs`) over its useful rows/s."""
    return (s.pool.price_per_hour + egress_per_hour(s, obs)) / (3600.0 * useful_rows_per_s(cfg, s))


def gpu_hours_per_row(s: PoolState) -> float:
    """GPU-hours a row takes in this pool's accelerator (its speed, not its luck:
    preemption losses are priced in dollars per row and move work elsewhere)."""
    return s.pool.gpus / (3600.0 * s.throughput)


def gpu_budget(cfg: CostConfig, obs: Observation) -> tuple[float, str]:
    """The most GPU-hours per row a pool may take, and the pool that sets it."""
    usable = [s for s in obs.pools if s.pool.max_workers > 0]
    od = [s for s in usable if not s.pool.spot]
    if cfg.gpu_ref == "none" or not usable:
        return math.inf, ""
    if cfg.gpu_ref == "ondemand" and od:
        ref = min(od, key=lambda s: dollars_per_row(cfg, s, obs))
    else:  # "fewest", or no on-demand pool to compare with: the fastest per GPU
        ref = min(usable, key=gpu_hours_per_row)
    return gpu_hours_per_row(ref) * (1.0 + cfg.gpu_slack), ref.pool.name


def eligible(cfg: CostConfig, obs: Observation) -> list[PoolState]:
    """The pools whose rows take no more GPU-hours than the budget allows."""
    budget, _ = gpu_budget(cfg, obs)
    return [s for s in obs.pools if gpu_hours_per_row(s) <= budget * (1 + 1e-9)]


def supply(obs: Observation) -> float:
    """Rows/s the productive workers give now."""
    return sum((s.live - s.starting) * s.throughput for s in obs.pools)


def demand(cfg: CostConfig, obs: Observation) -> tuple[float, str]:
    """Rows/s the trainers consume when never waiting (plus `headroom`), and how it was
    worked out. Not measured yet: inferred from the supply and the wait."""
    have = supply(obs)
    total, how = 0.0, []
    for t in obs.trainers:
        if t.demand_rows_per_s:
            d, src = t.demand_rows_per_s, "measured"
        else:  # a trainer waiting a share w of the time would eat supply / (1 - w)
            d, src = have / max(1.0 - t.wait_fraction, 0.2) / max(len(obs.trainers), 1), \
                "from supply and wait"
        d *= 1.0 + cfg.headroom
        total += d
        how.append(f"{t.policy} {d:.2f} rows/s ({src})")
    return total, "; ".join(how)


def deadline_at_risk(cfg: CostConfig, obs: Observation, want: float) -> bool:
    """Even supplying `want` rows/s from now on would finish too close to the deadline."""
    if obs.deadline_s is None or want <= 0 or not all(t.demand_rows_per_s
                                                      for t in obs.trainers):
        return False  # judged on measured demand only
    need = sum((t.steps_target - t.steps_done) * t.batch_rows for t in obs.trainers
               if t.steps_target is not None)
    return need / want > obs.deadline_s * cfg.deadline_margin


def remaining_s(obs: Observation, rows_per_s: float) -> float:
    """Seconds of rollout the run still needs at `rows_per_s` (inf: no step target)."""
    if rows_per_s <= 0 or any(t.steps_target is None for t in obs.trainers):
        return math.inf
    rows = sum((t.steps_target - t.steps_done) * t.batch_rows for t in obs.trainers)
    return max(rows, 0) / rows_per_s


def move_pays(cfg: CostConfig, s: PoolState, c: PoolState, rest: float,
              obs: Observation | None = None) -> bool:
    """Replacing `s`'s workers by `c`'s saves more over `rest` seconds than the move
    costs: `c`'s cold start, during which the old worker runs on too."""
    saving = s.throughput * (dollars_per_row(cfg, s, obs) - dollars_per_row(cfg, c, obs))
    if saving <= 0:
        return False
    n = s.throughput / useful_rows_per_s(cfg, c)  # c's workers per worker of s
    cost = c.pool.cold_start_s * (n * c.pool.price_per_hour + s.pool.price_per_hour) / 3600
    return saving * max(rest - c.pool.cold_start_s, 0.0) > cost
