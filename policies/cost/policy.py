"""The cost-aware scaling policy: fewest dollars per useful row that keeps every trainer fed.

Which pools: cheapest useful row first, among those whose rows take no more GPU-hours
than on-demand's (`economics`). How many: what the trainers consume, decided on the
backlog they have queued, so a fleet a fraction of a worker off the demand holds
instead of flipping a worker in and out. Where to: no spot pool past the share its
record earns, none grown for the hour after it lost or refused workers (`hedge`);
running workers move to a cheaper pool when the saving pays for the cold start.
Settings: `CostConfig`.
"""

from __future__ import annotations

import math

from astraflow.policies.api import Observation, Plan, Policy, PoolState
from astraflow.policies.cost import economics as eco
from astraflow.policies.cost import hedge
from astraflow.policies.cost.config import CostConfig, make_config


class CostAware(Policy):
    """Fewest dollars per useful row that keeps every trainer fed.

    `CostAware(config)` or `CostAware(**options)`: the options are `CostConfig`'s,
    validated (an unknown or out-of-range one raises ValueError saying how to fix it)."""

    name = "cost"
    Config = CostConfig

    def __init__(self, config: CostConfig | None = None, **options):
        if config is not None and options:
            raise ValueError("cost: pass a CostConfig or options, not both")
        self.config = config if config is not None else make_config(options)

    # -- the rules, for callers that judge a pool as the policy does ----------------
    def dollars_per_row(self, s: PoolState, obs: Observation | None = None) -> float:
        return eco.dollars_per_row(self.config, s, obs)

    @staticmethod
    def can_grow(s: PoolState) -> bool:
        return hedge.can_grow(s)

    def pool_share(self, s: PoolState, obs: Observation, demand: float) -> float:
        return hedge.pool_share(self.config, s, obs, demand)

    # -- the plan -----------------------------------------------------------------
    def plan(self, obs: Observation) -> Plan:
        """Grow, shrink, move or hold, decided on the backlog the trainers have queued:

            grow    when the backlog, at the present supply (starting workers counted),
                    would fall under `grow_margin` trainer steps before a worker launched
                    now could give rows (cold start + one interval): add the rows/s
                    missing plus a refill to `backlog_target`, cheapest useful row first;
            shrink  productive workers the trainers do not need, and one more once the
                    backlog passes `backlog_high` of the bound, dearest row first;
                    workers still starting never count, so a replacement comes first;
            move    workers to a cheaper pool with room, where the saving over the rest
                    of the run pays for the cold start (make before break); a pool held
                    back only by refused launches may be probed here;
            hold    otherwise: the backlog absorbs a supply a fraction of a worker off.
        """
        cfg = self.config
        pools = eco.eligible(cfg, obs)
        if not pools:
            raise ValueError("cost: the observation has no pools to plan for")

        def per_row(s: PoolState) -> float:
            return eco.dollars_per_row(cfg, s, obs)

        def usd(s: PoolState) -> str:
            """$/M rows, and the egress share of it where bytes cross a boundary."""
            e = eco.egress_per_hour(s, obs) / (3600.0 * eco.useful_rows_per_s(cfg, s))
            return f"${per_row(s) * 1e6:.1f}/M rows" + (f" incl. ${e * 1e6:.1f} egress"
                                                         if e else "")

        by_cost = sorted(pools, key=per_row)
        supply, starting = eco.supply(obs), sum(s.starting for s in obs.pools)
        # Before a trainer's first step its wait says nothing about its pace (it has waited
        # for everything): `bootstrap` workers' worth of the cheapest pool's rows, placed
        # as a measured demand would be, topped up only where launches failed. Later, a
        # window without a step is a starving trainer: `demand` infers its pace.
        booting = (not any(t.demand_rows_per_s for t in obs.trainers)
                   and all(t.steps_done == 0 for t in obs.trainers))
        if booting:
            first = next((s for s in by_cost if hedge.can_grow(s)), by_cost[0])
            demand = cfg.bootstrap * first.throughput
            how = f"bootstrap: {cfg.bootstrap} x {first.pool.name}'s rows/s, no step yet"
        else:
            demand, how = eco.demand(cfg, obs)
        coming = sum(s.starting * s.throughput for s in obs.pools)
        backlog = sum(t.backlog_rows for t in obs.trainers)
        bound = sum(t.max_backlog_rows for t in obs.trainers)
        low = sum(t.batch_rows for t in obs.trainers)  # one step: less and a trainer waits
        targets = dict(obs.live)
        ok = {s.pool.name for s in pools}
        used: list[str] = []
        budget, ref = eco.gpu_budget(cfg, obs)
        head = f"need {demand:.2f} rows/s ({how}); have {supply:.2f}" + \
            (f" + {coming:.2f} starting" if coming else "") + f"; backlog {backlog} rows" + \
            (f"; pools at most {budget * 3.6e9:.0f} GPU-h/M rows ({ref}'s"
             + (f" x {1 + cfg.gpu_slack:g}" if cfg.gpu_slack else "") + ")" if ref else "")

        def room(s: PoolState, moving: bool = False) -> int:
            """Workers `s` may add; `moving`: for the move rule, which may probe."""
            cap = s.pool.max_workers
            if not hedge.can_grow(s):
                cap = min(cap, hedge.probe_limit(s, obs.interval_s) if moving else 0)
            if s.pool.spot:  # the hedge: no spot pool past the share its record earns
                share = hedge.pool_share(cfg, s, obs, demand)
                cap = min(cap, max(1, math.ceil(share * demand / s.throughput - 1e-9)))
            return max(cap - targets[s.pool.name], 0)

        def add(rows: float, among: list[PoolState], moving: bool = False) -> float:
            for s in among:
                if rows <= 1e-6:
                    break
                per = eco.useful_rows_per_s(cfg, s)
                n = min(room(s, moving), math.ceil(rows / per - 1e-9))
                if n > 0:
                    targets[s.pool.name] += n
                    rows -= n * per
                    used.append(f"+{n} {s.pool.name} ({usd(s)})")
            return rows

        def short_note(short: float) -> str:
            return f"; {short:.2f} rows/s short (every pool at its cap)" if short > 1e-6 else ""

        if booting:
            short = add(demand - supply - coming, by_cost) if demand > supply + coming else 0.0
            return Plan(targets, (f"bootstrap: {head}; cheapest first: {', '.join(used)}"
                                  if used else f"waiting for the trainers' first steps to "
                                               f"measure their demand: {head}")
                        + short_note(short))
        # The deadline: on-demand is the floor that protects it.
        at_risk = eco.deadline_at_risk(cfg, obs, demand)
        if at_risk or cfg.ondemand_floor:
            share = max(cfg.ondemand_floor, 0.5 if at_risk else 0.0)
            od = [s for s in by_cost if not s.pool.spot]
            have = sum(targets[s.pool.name] * s.throughput for s in od)
            if od and have < share * demand:
                add(share * demand - have, od)
                head += f"; on-demand floor {share:.0%}" + \
                    (" (deadline at risk)" if share > cfg.ondemand_floor else "")
        lead = obs.interval_s + min((s.pool.cold_start_s for s in by_cost if room(s) > 0),
                                    default=0.0)
        drift = supply + coming - demand
        refill = max(cfg.backlog_target * bound - backlog, 0.0) / cfg.drain_s
        if backlog + drift * lead < cfg.grow_margin * low or (backlog < low and drift <= 0
                                                               and obs.wait_fraction):
            short = add(-drift + refill, by_cost)
            return Plan(targets, f"grow: {head}; it would fall under {cfg.grow_margin:g} "
                                 f"step(s) within {lead:.0f} s; "
                                 f"cheapest first: {', '.join(used) or 'none'}"
                        + short_note(short))
        # Shrink: dearest rows first (pools over the budget dearest of all).
        dear = sorted((s for s in obs.pools if s.live > s.starting),
                      key=lambda s: (s.pool.name in ok, -per_row(s)))
        full = bound and backlog >= cfg.backlog_high * bound
        left = supply
        for s in dear:
            n = 0
            while n < s.live - s.starting:
                if left - s.throughput >= demand + refill:
                    pass
                elif full and left > demand:
                    full = False  # one below the demand: the backlog covers it
                else:
                    break
                n, left = n + 1, left - s.throughput
            if n:
                targets[s.pool.name] -= n
                used.append(f"-{n} {s.pool.name} ({usd(s)})")
        if used:
            return Plan(targets, f"shrink: {head}" + (f" (>= {cfg.backlog_high:.0%} of "
                                                      f"{bound})" if left < demand else "")
                        + f"; dearest first: {', '.join(used)}")
        # Move: workers to a cheaper pool with room, where the saving over the rest of the
        # run pays for the move (both workers billed through the new one's cold start).
        if not starting:
            rest = eco.remaining_s(obs, demand)
            for s in sorted(obs.pools, key=lambda s: -per_row(s)):
                if s.live - s.starting <= 0:
                    continue
                add((s.live - s.starting) * s.throughput,
                    [c for c in by_cost if c is not s and room(c, moving=True) > 0
                     and eco.move_pays(cfg, s, c, rest, obs)], moving=True)
            if used:
                return Plan(targets, f"move: {head}; the replacements first, the dear "
                                     f"workers retire once they give rows: {', '.join(used)}")
        return Plan(targets, f"hold: {head}; it lasts past {lead:.0f} s and no worker is spare")
