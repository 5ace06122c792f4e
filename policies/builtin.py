"""Built-in scaling policies: fixed, dead band on trainer wait, cost-aware.

    fixed     N workers in one pool, whatever happens (the baseline).
    deadband  the AstraFlow paper's: one pool; add `step` workers when the trainer
              waited more than `high` of the window, retire `step` when it waited
              less than `low` and the backlog is past `backlog_high` of the
              backpressure bound (workers about to block). Hold otherwise.
    cost      supply the rows/s the trainers would consume if never waiting (plus
              `headroom`, minus a backlog being drained), from the pools with the
              fewest dollars per useful row: price / (rows/s x the share of time a
              worker is productive, net of preemptions and cold starts). Spot first;
              a pool that just preempted workers or refused a launch is not grown (so
              new workers go to the next region or accelerator); on-demand fills what
              spot cannot and is the floor when the deadline is at risk.
              Two objectives, weighed by `gpu_slack`: dollars per row and GPU-hours
              per row (at the benchmark's assumed speeds a spot L4 row costs fewer
              dollars than a spot A100 row but 3.3x the GPU-hours). `gpu_slack=None`
              minimises dollars alone (the default); a number
              caps the fleet's GPU-hours per useful row at (1 + gpu_slack) x the
              fewest any pool offers, and buys the cheapest rows within that cap
              (a cheap slow pool is mixed with a fast one as far as the cap allows).
              Workers are sized to what the trainers consume; the preemption hedge is
              the measured loss of each pool (`productive_share`), not a fixed surplus.
"""

from __future__ import annotations

import math

from astraflow.policies.api import Observation, Plan, Policy, PoolState


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


class CostAware(Policy):
    """Fewest dollars per useful row that keeps every trainer fed (see module docstring)."""

    name = "cost"

    def __init__(self, headroom: float = 0.0, drain_s: float = 600.0, backlog_target: float = 0.5,
                 ondemand_floor: float = 0.0, hold_band: float = 0.05, bootstrap: int = 2,
                 preemption_loss_s: float | None = None, deadline_margin: float = 0.9,
                 gpu_slack: float | None = None):
        if gpu_slack is not None and not gpu_slack >= 0:
            raise ValueError(f"cost: gpu_slack must be None or >= 0, got {gpu_slack!r}")
        self.headroom, self.drain_s, self.backlog_target = headroom, drain_s, backlog_target
        self.ondemand_floor, self.hold_band, self.bootstrap = ondemand_floor, hold_band, bootstrap
        self.preemption_loss_s, self.deadline_margin = preemption_loss_s, deadline_margin
        self.gpu_slack = gpu_slack

    # -- what a row costs in each pool --------------------------------------------
    def productive_share(self, s: PoolState) -> float:
        """Share of a worker's billed time that yields rows, net of the cold starts and
        lost batches its pool's recent preemptions cost."""
        if s.preemptions_1h == 0:
            return 1.0
        per_worker_h = s.preemptions_1h / max(s.live, 1)
        loss = self.preemption_loss_s if self.preemption_loss_s is not None \
            else s.pool.cold_start_s + 60.0
        return max(0.05, 1.0 - per_worker_h * loss / 3600.0)

    def useful_rows_per_s(self, s: PoolState) -> float:
        return s.throughput * self.productive_share(s)

    def dollars_per_row(self, s: PoolState) -> float:
        return s.pool.price_per_hour / (3600.0 * self.useful_rows_per_s(s))

    def gpu_hours_per_row(self, s: PoolState) -> float:
        return s.pool.gpus / (3600.0 * self.useful_rows_per_s(s))

    def gpu_budget(self, obs: Observation) -> float:
        """The most GPU-hours per useful row the fleet may take (inf: no cap)."""
        if self.gpu_slack is None:
            return math.inf
        best = min((self.gpu_hours_per_row(s) for s in obs.pools if s.pool.max_workers > 0),
                   default=math.inf)
        return best * (1.0 + self.gpu_slack)

    def can_grow(self, s: PoolState) -> bool:
        """A spot pool that preempted workers or refused a launch in the last hour is
        short of capacity: keep what it has, grow elsewhere."""
        return not (s.pool.spot and (s.preemptions_1h or s.launch_failures_1h))

    # -- the plan -----------------------------------------------------------------
    @staticmethod
    def supply(obs: Observation) -> float:
        """Rows/s the productive workers give now."""
        return sum((s.live - s.starting) * s.throughput for s in obs.pools)

    def demand(self, obs: Observation) -> tuple[float, str]:
        """Rows/s to supply, and how it was worked out."""
        supply = self.supply(obs)
        total, how = 0.0, []
        for t in obs.trainers:
            if t.demand_rows_per_s:
                d, src = t.demand_rows_per_s, "measured"
            else:  # a trainer waiting a share w of the time would eat supply / (1 - w)
                d, src = supply / max(1.0 - t.wait_fraction, 0.2) / max(len(obs.trainers), 1), \
                    "from supply and wait"
            d *= 1.0 + self.headroom
            if t.max_backlog_rows:  # drain a backlog above target, refill one below it
                d -= (t.backlog_rows - self.backlog_target * t.max_backlog_rows) / self.drain_s
            if t.wait_fraction > 0.05 and t.demand_rows_per_s:  # starving now: catch up
                d *= 1.0 + min(t.wait_fraction, 0.25)
            total += max(d, 0.0)
            how.append(f"{t.policy} {d:.2f} rows/s ({src})")
        return total, "; ".join(how)

    def deadline_at_risk(self, obs: Observation, want: float) -> bool:
        """Even supplying `want` rows/s from now on would finish too close to the deadline."""
        if obs.deadline_s is None or want <= 0 or not all(t.demand_rows_per_s
                                                          for t in obs.trainers):
            return False  # judged on measured demand only
        need = sum((t.steps_target - t.steps_done) * t.batch_rows for t in obs.trainers
                   if t.steps_target is not None)
        return need / want > obs.deadline_s * self.deadline_margin

    def plan(self, obs: Observation) -> Plan:
        by_cost = sorted(obs.pools, key=self.dollars_per_row)
        supply, starting = self.supply(obs), sum(s.starting for s in obs.pools)
        if not any(t.demand_rows_per_s for t in obs.trainers) and supply == 0:
            if starting or sum(obs.live.values()):
                return Plan(obs.live, "waiting for the first workers' rows")
            budget = self.gpu_budget(obs)  # start within the GPU-hour cap too
            fits = [s for s in by_cost if self.gpu_hours_per_row(s) <= budget * (1 + 1e-9)]
            first = next((s for s in fits if self.can_grow(s)), fits[0])
            return Plan({first.pool.name: self.bootstrap},
                        f"no trainer demand measured yet: start {self.bootstrap} in the "
                        f"cheapest pool {first.pool.name}")
        want, how = self.demand(obs)
        waiting = obs.wait_fraction > 0.05
        # Hold while supply covers the need and the surplus is under one worker (retiring
        # any would leave the trainers short) or within `hold_band` (noise in the need).
        one = min((s.throughput for s in obs.pools if s.live > s.starting), default=0.0)
        if (not waiting and not starting and want <= supply
                and (supply - one < want or supply <= want * (1 + self.hold_band))):
            return Plan(obs.live, f"hold: supply {supply:.2f} rows/s covers need {want:.2f} "
                                  f"with less than one worker or {self.hold_band:.0%} to spare "
                                  f"({how})")
        floor = self.ondemand_floor
        risk = self.deadline_at_risk(obs, want)
        if risk:
            floor = max(floor, 0.5)
        targets = dict.fromkeys((s.pool.name for s in obs.pools), 0)
        used: list[str] = []

        def fill(s: PoolState, rows: float) -> float:
            cap = s.pool.max_workers if self.can_grow(s) else min(s.live, s.pool.max_workers)
            per = self.useful_rows_per_s(s)
            n = min(cap - targets[s.pool.name], math.ceil(rows / per - 1e-9))
            if n > 0:
                targets[s.pool.name] += n
                used.append(f"{n} x {s.pool.name} (${self.dollars_per_row(s) * 1e6:.1f}/M rows)")
                return rows - n * per
            return rows

        left = want
        if floor > 0:
            od = want * floor
            for s in (s for s in by_cost if not s.pool.spot):
                od = fill(s, od)
                if od <= 0:
                    break
            left = want - (want * floor - max(od, 0.0))
        budget = self.gpu_budget(obs)
        if math.isinf(budget):
            for s in by_cost:
                if left <= 0:
                    break
                left = fill(s, left)
        else:
            left = self._fill_within_gpu_budget(obs, by_cost, targets, left, budget, used)
        if starting:  # replacements not productive yet: retire nothing meanwhile
            targets = {k: max(v, obs.pool(k).live) for k, v in targets.items()}
        why = (f"need {want:.2f} rows/s ({how}); have {supply:.2f}"
               + (f"; deadline at risk: on-demand floor {floor:.0%}" if risk else "")
               + (f"; GPU-hours per row capped at {budget * 3600:.4f}/(rows/s)"
                  if not math.isinf(budget) else "")
               + f"; cheapest first: {', '.join(used) or 'none'}"
               + (f"; {left:.2f} rows/s short (every pool at its cap)" if left > 1e-9 else ""))
        return Plan(targets, why)

    def _fill_within_gpu_budget(self, obs: Observation, by_cost: list[PoolState],
                                targets: dict[str, int], left: float, budget: float,
                                used: list[str]) -> float:
        """Add workers one at a time: the cheapest per row whose addition keeps the fleet
        at most `budget` GPU-hours per useful row; when none does, the one with the fewest
        GPU-hours per row (it makes room under the cap for cheap slow rows next). So a
        cheap slow pool and a fast one are mixed as far as the cap allows."""
        rows = sum(n * self.useful_rows_per_s(obs.pool(k)) for k, n in targets.items())
        gpus = sum(n * obs.pool(k).pool.gpus for k, n in targets.items())
        added: dict[str, int] = {}
        while left > 1e-6:  # rows/s; a hair of backlog refill buys no extra worker
            room = [s for s in by_cost
                    if targets[s.pool.name] < (s.pool.max_workers if self.can_grow(s)
                                               else min(s.live, s.pool.max_workers))]
            if not room:
                break
            ok = [s for s in room if (gpus + s.pool.gpus)
                  <= budget * 3600.0 * (rows + self.useful_rows_per_s(s)) + 1e-12]
            s = ok[0] if ok else min(room, key=self.gpu_hours_per_row)
            r = self.useful_rows_per_s(s)
            targets[s.pool.name] += 1
            added[s.pool.name] = added.get(s.pool.name, 0) + 1
            rows, gpus, left = rows + r, gpus + s.pool.gpus, left - r
        for s in by_cost:
            if s.pool.name in added:
                used.append(f"{added[s.pool.name]} x {s.pool.name} "
                            f"(${self.dollars_per_row(s) * 1e6:.1f}/M rows, "
                            f"{self.gpu_hours_per_row(s) * 1e6:.0f} GPU-h/M rows)")
        return left


BUILTIN: dict[str, type[Policy]] = {"fixed": Fixed, "deadband": DeadBand, "cost": CostAware}
