"""The cost-aware scaling policy: fewest dollars per useful row that keeps every trainer fed.

Three rules, each with the reason it exists:

  * Which pools: price per useful row (rows/s net of the cold starts and lost batches
    its recent preemptions cost), cheapest first, but only in pools whose rows take no
    more GPU-hours than the on-demand pool's that is cheapest per row (`gpu_ref`). A
    cheap slow accelerator (a spot L4 at 0.3 of an A100's rows/s) saves dollars by
    spending GPU-hours; spot is meant to replace on-demand at a discount, not to buy
    the same rows with more GPUs. `gpu_ref="none"` minimises dollars alone.
  * How many: what the trainers consume, decided on the backlog they have queued. Grow
    when the backlog would fall under one trainer step (`grow_margin`) before a worker
    launched now could give rows (cold start + one interval); "run dry", as the code
    read until issue 13's second round, let the trainers wait through the lead time
    whenever a preemption or a retirement took the supply under the demand. Shrink
    productive workers the demand does not need, and one more once the backlog nears its
    bound (it would only block). Between the two the backlog absorbs a supply a fraction
    of a worker off the demand, so the fleet does not launch and retire a worker every
    few intervals (each launch bills a cold start).
    Workers still starting are not counted when shrinking: a replacement comes first.
  * Before the trainers' first step (no demand measured): `bootstrap` workers' worth of
    the cheapest pool's rows, placed by the same rules as a measured demand. Until issue
    13's fourth round it was 2 workers in the cheapest pool, and the trainer waited a
    cold start on their rows once its first step sized the fleet: 0.8 points of wait
    on every benchmark scenario, where the baselines start with the need.
  * Where to: a spot pool that just preempted workers or refused a launch is not grown,
    so new workers go to the next region or accelerator; no spot pool supplies more
    than `max_pool_share` of the demand, a third by default (a hedge: losing any one
    pool leaves two thirds of the demand supplied while replacements start, and fewer
    workers to relaunch), except in the cheap tier (`tier_share`, below); optionally
    (`share_doubling_s`) a pool earns a larger share by
    going without preemptions and falls back to the third at the next one; running
    workers move to a cheaper pool when the
    saving over the rest of the run pays for the new one's cold start; on-demand fills
    what spot cannot and is the floor when the deadline is at risk.
  * The cheap tier (`tier_share`): when the cheapest eligible rows are spot rows and the
    next dearer eligible pool costs `tier_gap` x as much per row or more (spot L40S
    against spot A100 in the benchmark: about 2.5x), the pools below that step may
    together supply `tier_share` of the demand (3/4), and one of them that has gone
    `tier_quiet_s` (2 h) without a preemption may take what the rest of the tier leaves
    of it, beyond the third. A third there bought the same hedge at
    2-3x the dollars per row whenever one cheap pool had no capacity (the other kept
    its third, the rest came from spot A100); the quiet time keeps pools that lose
    workers often at the third, where a larger loss would cost wait and cold starts.
    Unknown quiet time: the third (the local and Modal backends of `astraflow scale`;
    the SkyPilot backend reports the preemption clock, `SkyBackend.preemptions`).
  * Which quiet time earns a share (`share_clock`): the time since the pool's last
    preemption. A refused launch says the pool has no room for one more worker now, not
    that the workers it runs are at risk, and the share is a hedge against losing
    running workers. Until issue 13's third round a refusal restarted the clock too
    (`share_clock="any"`), so a pool that refused launches while it filled up, or while
    a grow asked for one worker more than it had, stayed at the third for two hours
    more with no worker lost. In the benchmark's AWS-alone scenario the cheaper spot
    L40S pool refused launches in its first hour while its capacity rose (3, 9, then
    16), so it held 5 of 16 through the hour after its twin was preempted, with 8-10
    on-demand workers beside it; on the preemption clock it took the tier's 3/4 at 2 h
    and on-demand L40S fell from 52 to 33 worker-hours. Growth still stops for the hour
    after a refusal (`can_grow`); where a backend reports only `quiet_s` (since
    either), that is the clock.
  * Probing (`probe_refused`): a refused launch costs nothing and says only that the
    pool had no capacity then; capacity that comes back shows only to a launch. So a
    spot pool held back by refusals alone (no preemption in the last hour), and none in
    the last interval, may take moves: one worker beyond what it has, then double while
    no launch is refused (TCP's slow start). These workers are never counted on to feed
    the trainers (growth still goes where launches succeed): they replace dearer workers
    through the move rule, make before break, so a refused probe costs a plan nothing.
    Without it, a cheap pool whose capacity returned minutes after a refusal sat unused
    for the rest of the hour while dearer pools ran. A preempted pool keeps its hour:
    a preemption costs a batch, a cold start and the trainers' wait, and the traces
    show a pool that drops capacity tends to drop it again.
"""

from __future__ import annotations

import math

from astraflow.policies.api import Observation, Plan, Policy, PoolState


class CostAware(Policy):
    """Fewest dollars per useful row that keeps every trainer fed (see the module docstring).

    headroom          extra share of the measured demand to supply (0: exactly it)
    drain_s           a backlog below `backlog_target` is refilled over this many seconds
    backlog_target    share of the backpressure bound a growing fleet refills to
    backlog_high      share of the bound past which one worker below the demand is enough
    ondemand_floor    share of the demand always supplied on demand (0.5 when the
                      deadline is at risk: `deadline_margin` of it would be used)
    bootstrap         workers to run before the trainers' first step, when no demand
                      is measured yet: that many of the cheapest pool's rows/s, spread
                      over the pools as a measured demand would be (the hedge holds)
    preemption_loss_s seconds a preemption costs (default: the pool's cold start + 60 s)
    gpu_ref           whose GPU-hours per row bound the pools used: "ondemand" (the
                      on-demand pool cheapest per row), "fewest" (the fastest pool per
                      GPU) or "none" (dollars alone)
    gpu_slack         the bound is (1 + gpu_slack) x the reference's
    max_pool_share    most of the demand one spot pool may supply while it has no record
                      (just preempted, or the run just began)
    share_doubling_s  a spot pool's share doubles for every this many seconds it has gone
                      without a preemption (`share_clock`), up
                      to `max_share_quiet`; 0 (the default) keeps it at `max_pool_share`:
                      in the benchmark, 3600 brought the cost aim within reach where
                      spot is scarce but cost GPU-hours and wait elsewhere (README)
    max_share_quiet   most of the demand the quietest spot pool may supply (never less
                      than `max_pool_share`)
    probe_refused     probe spot pools held back only by refused launches through the
                      move rule (see the module docstring); needs `PoolState.quiet_s`
    tier_share        most of the demand the cheap tier supplies together, of which one
                      quiet pool may take what the others leave (0: no tier, the third)
    tier_gap          how much dearer per row the next eligible pool must be for the
                      pools below it to form the cheap tier
    tier_quiet_s      seconds without a preemption (`share_clock`) a tier pool needs
                      before it may pass `max_pool_share`
    grow_margin       grow when the backlog would fall below this many trainer steps
                      within a launch's lead time (0: only when it would run dry)
    share_clock       what restarts the quiet time a spot pool's share is earned by:
                      "preemption" (`PoolState.since_preemption_s`, else `quiet_s`) or
                      "any" (a preemption or a refused launch: `quiet_s`, as before)
    """

    name = "cost"
    GPU_REFS = ("ondemand", "fewest", "none")
    SHARE_CLOCKS = ("preemption", "any")

    def __init__(self, headroom: float = 0.0, drain_s: float = 600.0, backlog_target: float = 0.5,
                 ondemand_floor: float = 0.0, backlog_high: float = 0.75, bootstrap: int = 2,
                 preemption_loss_s: float | None = None, deadline_margin: float = 0.9,
                 gpu_ref: str = "ondemand", gpu_slack: float = 0.0,
                 max_pool_share: float = 1 / 3, share_doubling_s: float = 0.0,
                 max_share_quiet: float = 2 / 3, probe_refused: bool = True,
                 tier_share: float = 0.75, tier_gap: float = 1.5,
                 tier_quiet_s: float = 7200.0, grow_margin: float = 1.0,
                 share_clock: str = "preemption"):
        if gpu_ref not in self.GPU_REFS:
            raise ValueError(f"cost: gpu_ref must be one of {', '.join(self.GPU_REFS)}, "
                             f"got {gpu_ref!r}")
        if not gpu_slack >= 0:
            raise ValueError(f"cost: gpu_slack must be >= 0, got {gpu_slack!r}")
        self.headroom, self.drain_s, self.backlog_target = headroom, drain_s, backlog_target
        if not (isinstance(bootstrap, int) or float(bootstrap).is_integer()) or bootstrap < 1:
            raise ValueError(f"cost: bootstrap must be a whole number of workers >= 1, "
                             f"got {bootstrap!r}")
        self.ondemand_floor, self.backlog_high = ondemand_floor, backlog_high
        self.bootstrap = int(bootstrap)
        self.preemption_loss_s, self.deadline_margin = preemption_loss_s, deadline_margin
        if not 0 < max_pool_share <= 1:
            raise ValueError(f"cost: max_pool_share must be in (0, 1], got {max_pool_share!r}")
        if not 0 < max_share_quiet <= 1:
            raise ValueError(f"cost: max_share_quiet must be in (0, 1], got {max_share_quiet!r}")
        if not share_doubling_s >= 0:
            raise ValueError(f"cost: share_doubling_s must be >= 0, got {share_doubling_s!r}")
        self.gpu_ref, self.gpu_slack, self.max_pool_share = gpu_ref, gpu_slack, max_pool_share
        self.share_doubling_s, self.max_share_quiet = share_doubling_s, max_share_quiet
        self.probe_refused = bool(probe_refused)
        if not 0 <= tier_share <= 1:
            raise ValueError(f"cost: tier_share must be in [0, 1], got {tier_share!r}")
        if not tier_gap > 1:
            raise ValueError(f"cost: tier_gap must be > 1, got {tier_gap!r}")
        if not (tier_quiet_s >= 0 and grow_margin >= 0):
            raise ValueError(f"cost: tier_quiet_s and grow_margin must be >= 0, got "
                             f"{tier_quiet_s!r}, {grow_margin!r}")
        self.tier_share, self.tier_gap, self.tier_quiet_s = tier_share, tier_gap, tier_quiet_s
        self.grow_margin = grow_margin
        if share_clock not in self.SHARE_CLOCKS:
            raise ValueError(f"cost: share_clock must be one of {', '.join(self.SHARE_CLOCKS)}, "
                             f"got {share_clock!r}")
        self.share_clock = share_clock

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

    @staticmethod
    def gpu_hours_per_row(s: PoolState) -> float:
        """GPU-hours a row takes in this pool's accelerator (its speed, not its luck:
        preemption losses are priced in dollars per row and move work elsewhere)."""
        return s.pool.gpus / (3600.0 * s.throughput)

    def gpu_budget(self, obs: Observation) -> tuple[float, str]:
        """The most GPU-hours per row a pool may take, and the pool that sets it."""
        usable = [s for s in obs.pools if s.pool.max_workers > 0]
        od = [s for s in usable if not s.pool.spot]
        if self.gpu_ref == "none" or not usable:
            return math.inf, ""
        if self.gpu_ref == "ondemand" and od:
            ref = min(od, key=lambda s: s.pool.price_per_hour / s.throughput)
        else:  # "fewest", or no on-demand pool to compare with: the fastest per GPU
            ref = min(usable, key=self.gpu_hours_per_row)
        return self.gpu_hours_per_row(ref) * (1.0 + self.gpu_slack), ref.pool.name

    def eligible(self, obs: Observation) -> list[PoolState]:
        """The pools whose rows take no more GPU-hours than the budget allows."""
        budget, _ = self.gpu_budget(obs)
        return [s for s in obs.pools if self.gpu_hours_per_row(s) <= budget * (1 + 1e-9)]

    def can_grow(self, s: PoolState) -> bool:
        """A spot pool that preempted workers or refused a launch in the last hour is
        short of capacity: keep what it has, grow elsewhere."""
        return not (s.pool.spot and (s.preemptions_1h or s.launch_failures_1h))

    def probe_limit(self, s: PoolState, interval_s: float) -> int:
        """Most workers a spot pool that `can_grow` refuses may hold through moves: none
        unless only refused launches hold it back (no preemption in the last hour) and
        none was refused in the last interval (`quiet_s`; unknown: none); then what it
        has plus as many again, at least one (a probe, then doubling while launches
        succeed). Those workers replace dearer ones; growth never counts on them."""
        if (not self.probe_refused or not s.pool.spot or s.preemptions_1h
                or not s.launch_failures_1h or s.quiet_s is None or s.quiet_s < interval_s):
            return 0
        return s.live + max(1, s.live)

    def cheap_tier(self, obs: Observation) -> frozenset[str]:
        """The cheap tier: the eligible pools by $/row, cheapest first, before the first
        step of `tier_gap` x, if all of them are spot (none: no step, or on-demand below
        it)."""
        if not self.tier_share:
            return frozenset()
        ranked = sorted(self.eligible(obs), key=self.dollars_per_row)
        for i, (a, b) in enumerate(zip(ranked, ranked[1:], strict=False)):
            if not a.pool.spot:
                break
            if self.dollars_per_row(b) >= self.tier_gap * self.dollars_per_row(a):
                return frozenset(s.pool.name for s in ranked[:i + 1])
        return frozenset()

    def pool_share(self, s: PoolState, tier_left: float | None = None) -> float:
        """Most of the demand this pool may supply. On-demand: all of it. Spot: trust
        earned by evidence, as a back-off is: `max_pool_share` while the pool has no
        record, doubling for every `share_doubling_s` it goes without a preemption
        (`share_quiet_s`), up to `max_share_quiet`, and back to `max_pool_share` at the
        next one (its quiet time restarts). Unknown quiet time: the base share. A pool of
        the cheap tier (`cheap_tier`) quiet for `tier_quiet_s` may also take `tier_left`:
        the share of the demand the rest of the tier leaves of `tier_share`."""
        if not s.pool.spot:
            return 1.0
        quiet = self.share_quiet_s(s)
        if quiet is None or not self.share_doubling_s:
            share = self.max_pool_share
        else:
            share = min(max(self.max_share_quiet, self.max_pool_share), self.max_pool_share
                        * 2.0 ** (max(quiet, 0.0) / self.share_doubling_s))
        if tier_left is not None and quiet is not None and quiet >= self.tier_quiet_s:
            share = max(share, tier_left)
        return share

    def share_quiet_s(self, s: PoolState) -> float | None:
        """The quiet time a pool's share is earned by: since its last preemption
        (`share_clock="preemption"`, the default; a refused launch says the pool is full,
        not that the workers in it are at risk), or since its last preemption or refused
        launch ("any", as before issue 13's third round, and the fallback where a backend
        reports only `quiet_s`). None: unknown."""
        if self.share_clock == "preemption" and s.since_preemption_s is not None:
            return s.since_preemption_s
        return s.quiet_s

    # -- the plan -----------------------------------------------------------------
    @staticmethod
    def supply(obs: Observation) -> float:
        """Rows/s the productive workers give now."""
        return sum((s.live - s.starting) * s.throughput for s in obs.pools)

    def demand(self, obs: Observation) -> tuple[float, str]:
        """Rows/s the trainers consume when never waiting (plus `headroom`), and how it
        was worked out. Not measured yet: inferred from the supply and the wait."""
        supply = self.supply(obs)
        total, how = 0.0, []
        for t in obs.trainers:
            if t.demand_rows_per_s:
                d, src = t.demand_rows_per_s, "measured"
            else:  # a trainer waiting a share w of the time would eat supply / (1 - w)
                d, src = supply / max(1.0 - t.wait_fraction, 0.2) / max(len(obs.trainers), 1), \
                    "from supply and wait"
            d *= 1.0 + self.headroom
            total += d
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

    @staticmethod
    def remaining_s(obs: Observation, demand: float) -> float:
        """Seconds of rollout the run still needs at `demand` (inf: no step target)."""
        if demand <= 0 or any(t.steps_target is None for t in obs.trainers):
            return math.inf
        rows = sum((t.steps_target - t.steps_done) * t.batch_rows for t in obs.trainers)
        return max(rows, 0) / demand

    def move_pays(self, s: PoolState, c: PoolState, rest: float) -> bool:
        """Replacing `s`'s workers by `c`'s saves more over `rest` seconds than the move
        costs: `c`'s cold start, during which the old worker runs on too."""
        saving = s.throughput * (self.dollars_per_row(s) - self.dollars_per_row(c))  # $/s
        if saving <= 0:
            return False
        n = s.throughput / self.useful_rows_per_s(c)  # c's workers per worker of s
        cost = c.pool.cold_start_s * (n * c.pool.price_per_hour + s.pool.price_per_hour) / 3600
        return saving * max(rest - c.pool.cold_start_s, 0.0) > cost

    def plan(self, obs: Observation) -> Plan:
        """Grow, shrink, move or hold, decided on the backlog the trainers have queued:

            grow    when the backlog, at the present supply (starting workers counted),
                    would fall under `grow_margin` trainer steps (one) before a worker
                    launched now could give rows (its pool's cold start + one
                    interval): add the rows/s missing plus a refill of the backlog to
                    `backlog_target`, cheapest useful row first;
            shrink  productive workers the trainers do not need: while the others still
                    cover the demand, and one more once the backlog passes `backlog_high`
                    of the bound (it would only block), dearest row first. Workers still
                    starting are never counted, so a replacement comes before a retirement;
            move    on-demand workers (or ones in pools over the GPU-hour budget) to a
                    cheaper spot pool that can take them: launch the spot ones now, and
                    the shrink rule retires the dear ones once those give rows; a pool
                    held back only by refused launches may be probed here
                    (`probe_limit`), as nothing counts on these launches;
            hold    otherwise: the backlog absorbs a supply a fraction of a worker off the
                    demand, so a fleet never flips a worker in and out every interval.
        """
        pools = self.eligible(obs)
        if not pools:
            raise ValueError("cost: the observation has no pools to plan for")
        by_cost = sorted(pools, key=self.dollars_per_row)
        supply, starting = self.supply(obs), sum(s.starting for s in obs.pools)
        # Before a trainer's first step its wait says nothing about its pace (it has waited
        # for everything): the fleet is `bootstrap` workers' worth of the cheapest pool's
        # rows, placed as a measured demand would be (so the hedge holds from the start),
        # and topped up only where launches failed, never grown on the wait. Later, a
        # window without a step is a starving trainer: `demand` infers its pace from the
        # supply and the wait.
        booting = (not any(t.demand_rows_per_s for t in obs.trainers)
                   and all(t.steps_done == 0 for t in obs.trainers))
        if booting:
            first = next((s for s in by_cost if self.can_grow(s)), by_cost[0])
            demand = self.bootstrap * first.throughput
            how = f"bootstrap: {self.bootstrap} x {first.pool.name}'s rows/s, no step yet"
        else:
            demand, how = self.demand(obs)
        coming = sum(s.starting * s.throughput for s in obs.pools)
        backlog = sum(t.backlog_rows for t in obs.trainers)
        bound = sum(t.max_backlog_rows for t in obs.trainers)
        low = sum(t.batch_rows for t in obs.trainers)  # one step: less and a trainer waits
        targets = dict(obs.live)
        ok = {s.pool.name for s in pools}
        used: list[str] = []
        budget, ref = self.gpu_budget(obs)
        tier = self.cheap_tier(obs)
        head = f"need {demand:.2f} rows/s ({how}); have {supply:.2f}" + \
            (f" + {coming:.2f} starting" if coming else "") + f"; backlog {backlog} rows" + \
            (f"; pools at most {budget * 3.6e9:.0f} GPU-h/M rows ({ref}'s"
             + (f" x {1 + self.gpu_slack:g}" if self.gpu_slack else "") + ")" if ref else "")

        def room(s: PoolState, moving: bool = False) -> int:
            """Workers `s` may add; `moving`: for the move rule, which may probe."""
            cap = s.pool.max_workers
            if not self.can_grow(s):
                cap = min(cap, self.probe_limit(s, obs.interval_s) if moving else 0)
            if s.pool.spot:  # the hedge: no one spot pool supplies more than its share
                left = None  # of the cheap tier's share, what its other pools leave
                if s.pool.name in tier and demand > 0:
                    left = self.tier_share - sum(targets[n] * obs.pool(n).throughput
                                                 for n in tier if n != s.pool.name) / demand
                cap = min(cap, max(1, math.ceil(self.pool_share(s, left) * demand
                                                / s.throughput - 1e-9)))
            return max(cap - targets[s.pool.name], 0)

        def add(rows: float, among: list[PoolState], moving: bool = False) -> float:
            for s in among:
                if rows <= 1e-6:
                    break
                per = self.useful_rows_per_s(s)
                n = min(room(s, moving), math.ceil(rows / per - 1e-9))
                if n > 0:
                    targets[s.pool.name] += n
                    rows -= n * per
                    used.append(f"+{n} {s.pool.name} (${self.dollars_per_row(s) * 1e6:.1f}/M rows)")
            return rows

        if booting:
            short = add(demand - supply - coming, by_cost) if demand > supply + coming else 0.0
            return Plan(targets, (f"bootstrap: {head}; cheapest first: {', '.join(used)}"
                                  if used else f"waiting for the trainers' first steps to "
                                               f"measure their demand: {head}")
                        + (f"; {short:.2f} rows/s short (every pool at its cap)"
                           if short > 1e-6 else ""))
        # The deadline: on-demand is the floor that protects it.
        if self.deadline_at_risk(obs, demand) or self.ondemand_floor:
            share = max(self.ondemand_floor, 0.5 if self.deadline_at_risk(obs, demand) else 0.0)
            od = [s for s in by_cost if not s.pool.spot]
            have = sum(targets[s.pool.name] * s.throughput for s in od)
            if od and have < share * demand:
                add(share * demand - have, od)
                head += f"; on-demand floor {share:.0%} (deadline at risk)" \
                    if share > self.ondemand_floor else f"; on-demand floor {share:.0%}"
        lead = obs.interval_s + min((s.pool.cold_start_s for s in by_cost if room(s) > 0),
                                    default=0.0)
        drift = supply + coming - demand
        refill = max(self.backlog_target * bound - backlog, 0.0) / self.drain_s
        if backlog + drift * lead < self.grow_margin * low or (backlog < low and drift <= 0
                                                                and obs.wait_fraction):
            short = add(-drift + refill, by_cost)
            return Plan(targets, f"grow: {head}; it would fall under {self.grow_margin:g} "
                                 f"step(s) within {lead:.0f} s; "
                                 f"cheapest first: {', '.join(used) or 'none'}"
                        + (f"; {short:.2f} rows/s short (every pool at its cap)"
                           if short > 1e-6 else ""))
        # Shrink: dearest rows first (pools over the budget dearest of all).
        dear = sorted((s for s in obs.pools if s.live > s.starting),
                      key=lambda s: (s.pool.name in ok, -self.dollars_per_row(s)))
        full = bound and backlog >= self.backlog_high * bound
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
                used.append(f"-{n} {s.pool.name} (${self.dollars_per_row(s) * 1e6:.1f}/M rows)")
        if used:
            return Plan(targets, f"shrink: {head}" + (f" (>= {self.backlog_high:.0%} of "
                                                      f"{bound})" if left < demand else "")
                        + f"; dearest first: {', '.join(used)}")
        # Move: workers to a cheaper pool with room, where the saving over the rest of the
        # run pays for the move (both workers billed through the new one's cold start).
        if not starting:
            rest = self.remaining_s(obs, demand)
            for s in sorted(obs.pools, key=lambda s: -self.dollars_per_row(s)):
                if s.live - s.starting <= 0:
                    continue
                add((s.live - s.starting) * s.throughput,
                    [c for c in by_cost if c is not s and room(c, moving=True) > 0
                     and self.move_pays(s, c, rest)], moving=True)
            if used:
                return Plan(targets, f"move: {head}; the replacements first, the dear "
                                     f"workers retire once they give rows: {', '.join(used)}")
        return Plan(targets, f"hold: {head}; it lasts past {lead:.0f} s and no worker is spare")
