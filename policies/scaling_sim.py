"""Replay a run under a scaling policy: cost, GPU-hours, trainer wait, staleness.

On the discrete-event engine of `events`, every `interval_s` the controller builds an
Observation (`window_s` of history), asks the policy and acts: a spot launch beyond the
pool's traced capacity is refused (counted); a retired worker finishes its batch. A
worker is billed from launch: cold start, then batches of `batch_rows / rows_per_s`
while the backlog is under `max_backlog_batches`; preempted (trace capacity below its
pool's live count, newest first, or a drawn lifetime from `preemptions_per_hour`), its
batch in flight is lost. The trainer takes `batches_per_step` batches per step of
`train_s` until `steps` steps (or the horizon). Egress (`Workload.traffic`, pools' $/GB): before each batch a remote worker fetches its
version's deltas to the newest, or a snapshot and chain (`Traffic.fetch_bytes`); a
replica region gets each version as stored; rows go back to the store. Deterministic for
a seed. Left out: network and store time, the trainer's own preemptions, price changes,
and speed differences within a pool.
"""

from __future__ import annotations

import math
import random
from collections.abc import Generator
from dataclasses import dataclass, field, replace

from astraflow.policies.api import (
    Decision,
    Observation,
    Pool,
    PoolState,
    ScalingPolicy,
    TrainerState,
)
from astraflow.policies.egress import GB, Traffic
from astraflow.policies.events import Engine, Wait
from astraflow.policies.traces import SpotTrace


@dataclass(frozen=True)
class Workload:
    """The trainer's side of the run and the worker's batch (the same for every policy)."""

    batch_rows: int = 256  # rows in one worker batch (one commit)
    batches_per_step: int = 4  # batches one trainer step consumes
    train_s: float = 30.0  # one trainer step, once its batches are there
    max_backlog_batches: int = 16  # workers block at this many unconsumed batches
    steps: int = 600  # stop when the trainer has taken this many steps
    horizon_s: float = 48 * 3600.0  # give up here (a policy that never gets there)
    deadline_s: float | None = None  # shown to policies (deadline protection)
    trainer_price_per_hour: float = 0.0  # the trainer's machine, the same under every policy
    trainer_gpus: int = 0
    traffic: Traffic = Traffic()  # bytes per version and per row (egress; 0: not counted)

    @property
    def demand_rows_per_s(self) -> float:
        return self.batch_rows * self.batches_per_step / self.train_s


@dataclass(frozen=True)
class Scenario:
    name: str
    workload: Workload
    pools: tuple[Pool, ...]
    traces: dict[str, SpotTrace] = field(default_factory=dict)  # pool name -> capacity trace
    preemptions_per_hour: dict[str, float] = field(default_factory=dict)  # per worker
    interval_s: float = 60.0  # how often the policy is asked
    window_s: float = 300.0  # how much history an observation summarises
    worker_poll_s: float = 5.0
    seed: int = 0

    def __post_init__(self) -> None:
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"scenario {self.name}: pool names repeat: {names}")
        for k in [*self.traces, *self.preemptions_per_hour]:
            if k not in names:
                raise ValueError(f"scenario {self.name}: trace or rate for unknown pool {k!r}")


@dataclass
class _Worker:
    pool: Pool
    launched: float
    death: float = math.inf  # drawn lifetime (rate preemption)
    productive: float | None = None
    held: int | None = None  # the weight version it serves
    ended: float | None = None
    retiring: bool = False
    preempted: bool = False
    blocked_s: float = 0.0
    rows: int = 0

    @property
    def alive(self) -> bool:
        return self.ended is None


@dataclass
class SimRun:
    """One policy on one scenario."""

    policy: str
    scenario: str
    steps: int
    wall_s: float
    finished: bool  # reached the step target within the horizon
    rollout_cost: float  # $ for rollout workers (cold starts and idle time included)
    trainer_cost: float
    gpu_hours: float  # rollout GPU-hours
    trainer_wait_fraction: float  # of the trainer's wall time, first row to last step
    staleness_mean: float  # trainer versions between a batch's start and its consumption
    preemptions: int
    launch_failures: int
    rows_lost: int  # in batches cut off by preemption
    worker_hours: dict[str, float]  # per pool
    gpu_hours_use: dict[str, float]  # rollout GPU-hours by use: rows, cold, blocked, lost
    # rollout $ by kind and use: "spot rows", "spot cold", ..., "on-demand lost"
    cost_use: dict[str, float]
    timeline: list[dict]  # per control tick: t, live per pool, cost, wait, backlog
    decisions: list[Decision]
    egress_cost: float = 0.0  # $ for bytes crossing a region or cloud boundary
    # GB and $ by what crossed: "weights" (to workers), "replica" (to replicas), "rows"
    egress_gb: dict[str, float] = field(default_factory=dict)
    egress_usd: dict[str, float] = field(default_factory=dict)

    @property
    def total_cost(self) -> float:
        return self.rollout_cost + self.trainer_cost + self.egress_cost


def simulate(scn: Scenario, policy: ScalingPolicy, name: str | None = None) -> SimRun:
    w, eng = scn.workload, Engine()
    rng = random.Random(scn.seed)
    workers: list[_Worker] = []
    pools = {p.name: p for p in scn.pools}
    backlog: list[tuple[float, int]] = []  # (produced at, trainer version at batch start)
    st = {"steps": 0, "wait": 0.0, "first": None, "busy_since": None, "done_at": None}
    wait_spans: list[tuple[float, float]] = []
    preempt_t: dict[str, list[float]] = {p: [] for p in pools}
    fail_t: dict[str, list[float]] = {p: [] for p in pools}
    produced: list[tuple[float, str, int]] = []  # (time, pool, rows)
    stale: list[int] = []
    lost = [0]
    timeline: list[dict] = []
    decisions: list[Decision] = []
    traffic = replace(w.traffic, versions_per_hour=3600.0 / w.train_s,
                      worker_batch_rows=w.batch_rows)
    gb = {"weights": 0.0, "replica": 0.0, "rows": 0.0}
    usd = dict.fromkeys(gb, 0.0)
    replicas = {(p.cloud, p.region): p.weights_usd_per_gb for p in scn.pools
                if p.replica and p.weights_usd_per_gb}

    def bill(what: str, nbytes: float, usd_per_gb: float) -> None:
        if nbytes and usd_per_gb:
            gb[what] += nbytes / GB
            usd[what] += nbytes / GB * usd_per_gb

    def published(version: int) -> None:
        """A version is out: every replica region receives it as stored."""
        for price in replicas.values():
            bill("replica", traffic.stored_bytes(version), price)

    def finished() -> bool:
        return st["steps"] >= w.steps or eng.now >= w.horizon_s

    def end(k: _Worker, t: float) -> None:
        k.ended = t

    def preempt(k: _Worker, t: float) -> None:
        """A worker lost to the cloud at `t`, by its drawn lifetime or its trace:
        ended, counted, and in its pool's record (`preemptions_1h`, `quiet_s`)."""
        k.preempted = True
        end(k, t)
        preempt_t[k.pool.name].append(t)

    def worker(k: _Worker) -> Generator[float | Wait, None, None]:
        p = k.pool
        yield min(p.cold_start_s, max(k.death - eng.now, 0.0))
        if eng.now >= k.death:
            return preempt(k, k.death)
        if k.ended is not None:
            return
        k.productive = eng.now
        batch_s = w.batch_rows / p.rows_per_s
        while True:
            t0 = eng.now
            yield Wait(lambda: (len(backlog) < w.max_backlog_batches or k.retiring
                                 or k.ended is not None or eng.now >= k.death or finished()),
                        scn.worker_poll_s)
            k.blocked_s += eng.now - t0
            if eng.now >= k.death:
                return preempt(k, min(max(k.death, t0), eng.now))
            if k.ended is not None:
                return
            if k.retiring or finished():
                return end(k, eng.now)
            v0 = st["steps"]
            if not p.replica:
                bill("weights", traffic.fetch_bytes(k.held, v0), p.weights_usd_per_gb)
            k.held = v0
            yield min(batch_s, max(k.death - eng.now, 0.0))
            if k.ended is not None or eng.now >= k.death:  # preempted mid-batch: lost
                lost[0] += w.batch_rows
                if k.ended is None:
                    preempt(k, k.death)
                return
            backlog.append((eng.now, v0))
            bill("rows", w.batch_rows * traffic.row_bytes, p.rows_usd_per_gb)
            k.rows += w.batch_rows
            produced.append((eng.now, p.name, w.batch_rows))
            if k.retiring or finished():
                return end(k, eng.now)

    def trainer() -> Generator[float | Wait, None, None]:
        while st["steps"] < w.steps:
            t0 = eng.now
            yield Wait(lambda: len(backlog) >= w.batches_per_step or eng.now >= w.horizon_s,
                        1.0)
            if eng.now >= w.horizon_s:
                return
            if st["first"] is None:
                st["first"] = eng.now
            else:
                wait_spans.append((t0, eng.now))
            for _ in range(w.batches_per_step):
                _, v0 = backlog.pop(0)
                stale.append(st["steps"] - v0)
            yield w.train_s
            st["steps"] += 1
            published(st["steps"])
        st["done_at"] = eng.now

    def live(pool: str) -> list[_Worker]:
        return [k for k in workers if k.alive and k.pool.name == pool and not k.retiring]

    def launch(p: Pool) -> None:
        tr = scn.traces.get(p.name)
        if p.spot and tr is not None and len(live(p.name)) >= tr.capacity(eng.now):
            fail_t[p.name].append(eng.now)
            return
        rate = scn.preemptions_per_hour.get(p.name, 0.0) if p.spot else 0.0
        death = eng.now + rng.expovariate(rate / 3600.0) if rate > 0 else math.inf
        k = _Worker(p, eng.now, death)
        workers.append(k)
        eng.spawn(worker(k))

    def retire(pool: str, n: int) -> None:
        # Not yet productive first (they cost and give nothing), then the newest.
        cands = sorted(live(pool), key=lambda k: (k.productive is not None, -k.launched))
        for k in cands[:n]:
            k.retiring = True
            if k.productive is None:  # still booting: terminate now
                end(k, eng.now)

    def capacity(pool: str, tr: SpotTrace) -> Generator[float | Wait, None, None]:
        while not finished():
            cap = tr.capacity(eng.now)
            alive = sorted(live(pool), key=lambda k: -k.launched)
            for k in alive[:max(len(alive) - cap, 0)]:
                preempt(k, eng.now)  # a batch in flight is counted lost when it returns
            yield tr.gap_s - (eng.now % tr.gap_s) if eng.now % tr.gap_s else tr.gap_s

    def cost_so_far(t: float) -> float:
        return sum(((k.ended if k.ended is not None else t) - k.launched)
                   * k.pool.price_per_hour / 3600 for k in workers) + sum(usd.values())

    def observe() -> Observation:
        now, since = eng.now, eng.now - scn.window_s
        span = min(scn.window_s, now) or 1.0
        waited = sum(max(0.0, min(b, now) - max(a, since)) for a, b in wait_spans)
        if st["first"] is None:  # not one step yet: all of it was waiting
            waited = span
        states = []
        for p in scn.pools:
            mine = [k for k in workers if k.pool.name == p.name]
            lv = [k for k in mine if k.alive and not k.retiring]
            measured = any(k.productive is not None for k in mine)
            states.append(PoolState(
                p, live=len(lv), starting=sum(k.productive is None for k in lv),
                rows_per_s=p.rows_per_s if measured else None,
                preemptions_1h=sum(t > now - 3600 for t in preempt_t[p.name]),
                launch_failures_1h=sum(t > now - 3600 for t in fail_t[p.name]),
                quiet_s=now - max(preempt_t[p.name] + fail_t[p.name], default=0.0),
                since_preemption_s=now - max(preempt_t[p.name], default=0.0)))
        tr = TrainerState("trainer", wait_fraction=min(waited / span, 1.0),
                          backlog_rows=len(backlog) * w.batch_rows,
                          batch_rows=w.batch_rows * w.batches_per_step,
                          max_backlog_rows=w.max_backlog_batches * w.batch_rows,
                          demand_rows_per_s=w.demand_rows_per_s if st["first"] is not None
                          else None,
                          steps_done=st["steps"], steps_target=w.steps, traffic=traffic)
        left = None if w.deadline_s is None else w.deadline_s - now
        return Observation(now, (tr,), tuple(states), left, scn.interval_s)

    def controller() -> Generator[float | Wait, None, None]:
        while not finished():
            obs = observe()
            plan = policy.plan(obs).clamp(obs)
            for pname, target in plan.targets.items():
                n = len(live(pname))
                if target > n:
                    for _ in range(target - n):
                        launch(pools[pname])
                elif target < n:
                    retire(pname, n - target)
            decisions.append(Decision(eng.now, dict(plan.targets), obs.live, plan.reason,
                                      obs.wait_fraction, obs.trainers[0].backlog_rows))
            timeline.append({"t": eng.now, "live": {p: len(live(p)) for p in pools},
                             "cost": cost_so_far(eng.now), "wait": obs.wait_fraction,
                             "backlog": len(backlog), "steps": st["steps"]})
            yield scn.interval_s

    published(0)
    eng.spawn(controller())
    eng.spawn(trainer())
    for pname, tr in scn.traces.items():
        if pools[pname].spot:
            eng.spawn(capacity(pname, tr))
    eng.run(finished, max_events=20_000_000)
    t_end = eng.now
    for k in workers:
        if k.ended is None:
            end(k, t_end)
    run_s = t_end - (st["first"] or t_end)
    uses = ("rows", "cold", "blocked", "lost")
    use = dict.fromkeys(uses, 0.0)
    dollars = {f"{kind} {u}": 0.0 for kind in ("spot", "on-demand") for u in uses}
    for k in workers:  # where each billed GPU-hour and dollar went (lost: cut off, the tail)
        ready = k.productive if k.productive is not None else k.ended
        rows_s = k.rows / k.pool.rows_per_s
        secs = {"cold": ready - k.launched, "rows": rows_s, "blocked": k.blocked_s,
                "lost": max((k.ended - ready) - rows_s - k.blocked_s, 0.0)}
        kind = "spot" if k.pool.spot else "on-demand"
        for u, v in secs.items():
            use[u] += v * k.pool.gpus / 3600
            dollars[f"{kind} {u}"] += v * k.pool.price_per_hour / 3600
    hours = {p: sum((k.ended - k.launched) for k in workers if k.pool.name == p) / 3600
             for p in pools}
    return SimRun(
        policy=name or getattr(policy, "name", type(policy).__name__), scenario=scn.name,
        steps=st["steps"], wall_s=t_end, finished=st["steps"] >= w.steps,
        rollout_cost=sum(hours[p] * pools[p].price_per_hour for p in pools),
        trainer_cost=t_end / 3600 * w.trainer_price_per_hour,
        gpu_hours=sum(hours[p] * pools[p].gpus for p in pools),
        trainer_wait_fraction=(sum(b - a for a, b in wait_spans) / run_s) if run_s > 0 else 0.0,
        staleness_mean=sum(stale) / len(stale) if stale else 0.0,
        preemptions=sum(k.preempted for k in workers),
        launch_failures=sum(len(v) for v in fail_t.values()),
        rows_lost=lost[0], worker_hours=hours, gpu_hours_use=use, cost_use=dollars,
        timeline=timeline, decisions=decisions, egress_cost=sum(usd.values()),
        egress_gb=gb, egress_usd=usd)


def format_runs(runs: list[SimRun]) -> str:
    """A table of runs; an `egress $` column where any run paid for crossing bytes."""
    eg = any(r.egress_cost for r in runs)
    head = (f"{'policy':<15}{'steps':>7}{'hours':>7}{'rollout $':>11}"
            + (f"{'egress $':>10}" if eg else "") + f"{'total $':>10}"
            f"{'GPU-h':>9}{'wait':>7}{'stale':>7}{'preempt':>9}{'no-cap':>8}")
    lines = [head]
    for r in runs:
        lines.append(f"{r.policy:<15}{r.steps:>7}{r.wall_s / 3600:>7.2f}{r.rollout_cost:>11.2f}"
                     + (f"{r.egress_cost:>10.2f}" if eg else "") +
                     f"{r.total_cost:>10.2f}{r.gpu_hours:>9.1f}{r.trainer_wait_fraction:>7.1%}"
                     f"{r.staleness_mean:>7.2f}{r.preemptions:>9}{r.launch_failures:>8}")
    return "\n".join(lines)
