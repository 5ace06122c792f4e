"""`astraflow scale`: observe a run from its store, ask a scaling policy, act through a backend.

    every interval_s: store -> observe() (per policy: trainer wait share, demand, backlog;
    per pool: live workers and their rows/s) -> policy.plan(obs) -> backend.launch /
    backend.retire (SIGTERM: the worker commits its batch and exits) -> a `scale` row per pool

A launch the cloud cannot serve does not fail at once (a SkyPilot job waits in STARTING,
a Modal call queues): it is a worker that never gives a row. One with no row
`refuse_after_s` after its launch (default: three cold starts, at least 10 minutes)
while the backlog had room is a refused launch: retired, logged as `launch_refused`,
and counted in the pool's `launch_failures_1h`, as in the simulator.

Stateless: live workers are whatever the backend lists and the rest is read from the
store, so killing the autoscaler only pauses scaling; its workers keep running.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field

from astraflow.policies import Decision, Observation, Pool, PoolState, ScalingPolicy, TrainerState
from astraflow.scale.backends import Backend, new_worker_id
from astraflow.stores.retry import StoreError

log = logging.getLogger("astraflow.scale")

COMPONENT = "scale"  # metrics rows: component "scale", policy = the pool's name


@dataclass
class Autoscaler:
    ctx: object  # astraflow.context.RunContext
    policy: ScalingPolicy
    backend: Backend
    pools: list[Pool]
    interval_s: float = 10.0
    window_s: float = 30.0
    started: float = field(default_factory=time.time)
    refuse_after_s: float | None = None  # None: max(3 x the pool's cold start, 600 s); 0: never

    def refuse_after(self, pool: Pool) -> float:
        """Seconds without a row after which a launch in `pool` counts as refused (inf:
        never; for workers whose first batch can take longer, e.g. a large model's load)."""
        if self.refuse_after_s is not None:
            return self.refuse_after_s if self.refuse_after_s > 0 else math.inf
        return max(3.0 * pool.cold_start_s, 600.0)

    # -- observe -------------------------------------------------------------------
    def _trainer_state(self, policy: str, now: float) -> TrainerState:
        from astraflow.scale.pools import run_traffic

        flow, ledger = self.ctx.flow, self.ctx.ledger()
        batch = flow.batch_rows(policy)
        rows = [r for r in ledger.read_metrics(since=now - self.window_s,
                                               names=["trainer_wait_s", "step_time_s",
                                                      "rows_read"]).to_pylist()
                if r["component"] == "trainer" and r["policy"] == policy]
        by = defaultdict(float)
        for r in rows:
            by[r["name"]] += r["value"]
        prog = ledger.progress(policy)
        backlog = self.ctx.trajectories().count(policy) - (prog.rows_consumed if prog else 0)
        busy, waited = by["step_time_s"], by["trainer_wait_s"]
        if busy + waited > 0:
            # The window's steps: their waits over their wall time, plus the time since
            # the last step if the trainer has been waiting since.
            last = max((r["time"] for r in rows), default=now)
            idle = max(now - last, 0.0) if backlog < batch else 0.0
            wait = (waited + idle) / (busy + waited + idle)
        else:  # no step in the window: waiting unless rows are there for it
            wait = 1.0 if backlog < batch else 0.0
        demand = by["rows_read"] / busy if busy > 0 else None
        return TrainerState(policy, wait_fraction=min(max(wait, 0.0), 1.0),
                            backlog_rows=max(backlog, 0), batch_rows=batch,
                            max_backlog_rows=flow.rollout.max_backlog_batches * batch,
                            demand_rows_per_s=demand, steps_done=prog.step + 1 if prog else 0,
                            steps_target=flow.stop.max_steps, traffic=run_traffic(flow))

    def _rows_by_worker(self, now: float, since: float | None = None) -> dict[str, int]:
        """Rows each worker appended in the window (or since `since`): the `worker_rows`
        metrics rows a rollout worker logs with every batch (component `worker`, keyed by
        its id), so one filtered read of the metrics table instead of a scan of every
        trajectory table's worker column each tick."""
        out: dict[str, int] = defaultdict(int)
        start = now - self.window_s if since is None else since
        for r in self.ctx.ledger().read_metrics(since=start,
                                                names=["worker_rows"]).to_pylist():
            if r["component"] == "worker":  # keyed by the worker's id
                out[r["policy"]] += int(r["value"])
        return out

    @staticmethod
    def _rows_of(rows: dict[str, int], worker_id: str) -> int:
        """A worker's rows: they carry its id, or its id as a prefix (a sky job appends
        its own)."""
        return sum(n for k, n in rows.items() if k == worker_id or k.startswith(worker_id + "-"))

    def _refusals(self, now: float) -> dict[str, list[float]]:
        """When each pool's launches were refused in the last hour (`launch_refused` rows
        of this run's metrics: they outlive the autoscaler, as everything it knows)."""
        out: dict[str, list[float]] = defaultdict(list)
        for r in self.ctx.ledger().read_metrics(since=now - 3600.0,
                                                names=["launch_refused"]).to_pylist():
            if r["component"] == COMPONENT:
                out[r["policy"]] += [r["time"]] * int(r["value"])
        return out

    def refuse_stuck(self, obs: Observation) -> dict[str, int]:
        """Retire the workers that gave no row `refuse_after` their launch and count each
        as a refused launch of its pool (one `launch_refused` metrics row per pool). Not
        while a trainer's backlog is at its bound: a worker that waits on backpressure
        gives no row either."""
        if any(t.max_backlog_rows and t.backlog_rows >= t.max_backlog_rows
               for t in obs.trainers):
            return {}
        now = time.time()
        old = {pool.name: [w for w in self.backend.live(pool)  # started 0: unknown, skip
                           if w.started > 0 and now - w.started > self.refuse_after(pool)]
               for pool in self.pools if obs.pool(pool.name).starting}
        since = min((w.started for ws in old.values() for w in ws), default=None)
        if since is None:
            return {}
        ever = self._rows_by_worker(now, since=since - 1.0)  # since the oldest one's launch
        out = {}
        for pool in self.pools:
            stuck = [w for w in old.get(pool.name, []) if not self._rows_of(ever, w.worker_id)]
            if stuck:
                log.warning("scale: %d launch(es) in %s gave no row in %.0f s: refused "
                            "(no capacity?), retired", len(stuck), pool.name,
                            self.refuse_after(pool))
                self.backend.retire(pool, stuck)
                out[pool.name] = len(stuck)
        if out:
            led = self.ctx.ledger()
            led.log_many(COMPONENT, [(name, int(now), {"launch_refused": n})
                                     for name, n in out.items()])
            led.flush_metrics()
        return out

    def observe(self) -> Observation:
        now = time.time()
        trainers = tuple(self._trainer_state(p, now) for p in self.ctx.flow.policy_names())
        rows = self._rows_by_worker(now)
        refused = self._refusals(now)
        states = []
        for pool in self.pools:
            live = self.backend.live(pool)
            mine = {w.worker_id: self._rows_of(rows, w.worker_id) for w in live}
            productive = [w for w in live if mine[w.worker_id] > 0]
            span = [min(self.window_s, now - w.started) for w in productive]
            rate = (sum(mine[w.worker_id] for w in productive) / sum(span)
                    if productive and sum(span) > 0 else None)
            lost_1h, since_lost = self.backend.preemptions(pool, self.started)
            ref = refused.get(pool.name, [])
            # Quiet since a preemption or a refusal: known only where the preemption
            # clock is (a refusal alone does not say when the cloud last took a worker).
            quiet = None if since_lost is None else min([since_lost, *(now - t for t in ref)])
            states.append(PoolState(pool, live=len(live), starting=len(live) - len(productive),
                                    rows_per_s=rate, preemptions_1h=lost_1h,
                                    launch_failures_1h=len(ref), quiet_s=quiet,
                                    since_preemption_s=since_lost))
        left = None
        if self.ctx.flow.stop.max_minutes:
            left = self.started + self.ctx.flow.stop.max_minutes * 60 - now
        return Observation(now - self.started, trainers, tuple(states), left, self.interval_s)

    # -- act -------------------------------------------------------------------------
    def tick(self) -> Decision:
        obs = self.observe()
        if self.refuse_stuck(obs):
            obs = self.observe()  # the refusals are in it now
        plan = self.policy.plan(obs).clamp(obs)
        for pool in self.pools:
            target = plan.targets.get(pool.name)
            if target is None:
                continue
            live = self.backend.live(pool)
            if target > len(live):
                for _ in range(target - len(live)):
                    self.backend.launch(pool, new_worker_id(pool))
            elif target < len(live):
                # Not yet productive ones first (they give nothing yet), then the newest.
                order = sorted(live, key=lambda w: -w.started)
                self.backend.retire(pool, order[: len(live) - target])
        d = Decision(obs.time, dict(plan.targets), obs.live, plan.reason, obs.wait_fraction,
                     sum(t.backlog_rows for t in obs.trainers))
        self.ctx.ledger().log_many(COMPONENT, [
            (pool.name, int(time.time()), {
                "target": plan.targets.get(pool.name, obs.pool(pool.name).live),
                "live": obs.pool(pool.name).live, "wait_fraction": obs.wait_fraction,
                "backlog_rows": d.backlog_rows})
            for pool in self.pools])
        log.info("scale: %s -> %s (wait %.0f%%, backlog %d): %s", obs.live, plan.targets,
                 100 * obs.wait_fraction, d.backlog_rows, plan.reason)
        return d

    def trainers_done(self) -> bool:
        target = self.ctx.flow.stop.max_steps
        if target is None:
            return False
        led = self.ctx.ledger()
        return all((p := led.progress(pol)) is not None and p.step + 1 >= target
                   for pol in self.ctx.flow.policy_names())

    def run(self, *, should_stop=lambda: False, minutes: float | None = None,
            retire_at_end: bool = True, echo=print) -> list[Decision]:
        deadline = time.time() + minutes * 60 if minutes else None
        out: list[Decision] = []
        while not should_stop() and not (deadline and time.time() > deadline):
            if self.trainers_done():
                echo("every trainer reached stop.max_steps")
                break
            try:
                d = self.tick()
            except (OSError, StoreError) as err:  # a store read that failed now: next tick
                log.warning("scale: tick skipped, the store did not answer: %s", err)
                time.sleep(self.interval_s)
                continue
            out.append(d)
            echo(f"{d.time:6.0f}s live {d.live} -> {d.targets}  wait {d.wait_fraction:.0%} "
                 f"backlog {d.backlog_rows}: {d.reason}")
            end = time.time() + self.interval_s
            while time.time() < end and not should_stop():
                time.sleep(0.2)
        if retire_at_end and not should_stop():
            for pool in self.pools:
                self.backend.retire(pool, self.backend.live(pool))
        return out


def local_pool(name: str = "local", max_workers: int = 4, rows_per_s: float = 50.0) -> Pool:
    """The pool of local worker processes (free; bounded by this machine's cores)."""
    return Pool(name, backend="local", cloud="local", spot=False, price_per_hour=0.0,
                rows_per_s=rows_per_s, cold_start_s=10.0, max_workers=max_workers)


def backend_and_pools(ctx, target: str, backend: str, *, prices=None, max_workers: int = 4,
                      worker_minutes: float = 60.0) -> tuple[Backend, list[Pool]]:
    """The backend `--backend` names and the pools it scales: one free local pool, or
    the flow's `launch.rollout` pools of that backend, priced."""
    from astraflow.scale import backends as b

    if backend == "local":
        return b.LocalBackend(target, minutes=worker_minutes), [local_pool(max_workers=max_workers)]
    if backend not in ("modal", "sky"):
        raise ValueError(f"--backend must be local, modal or sky, not {backend!r}")
    from astraflow.scale.pools import cloud_pools

    pools = cloud_pools(ctx.flow, backend, prices=prices, max_workers=max_workers)
    if backend == "modal":
        return b.ModalBackend(ctx.store_uri, minutes=worker_minutes), pools
    return b.SkyBackend(ctx.store_uri, ctx.flow.name, minutes=worker_minutes), pools


def plot_scale(ctx, path) -> None:
    """Workers per pool (target and live), trainer wait and backlog over time, from the
    run's `scale` metrics rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in ctx.ledger().read_metrics(since=0.0).to_pylist()
            if r["component"] == COMPONENT]
    if not rows:
        return
    t0 = min(r["time"] for r in rows)
    series: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for r in sorted(rows, key=lambda r: r["time"]):
        series[r["policy"], r["name"]].append(((r["time"] - t0) / 60, r["value"]))
    fig, ax = plt.subplots(3, 1, figsize=(7, 7), sharex=True)
    for (pool, name), pts in series.items():
        if name in ("live", "target"):
            ax[0].step(*zip(*pts, strict=True), where="post", label=f"{pool} {name}",
                       linestyle="-" if name == "live" else ":")
    first = next(iter({p for p, _ in series}))
    ax[1].plot(*zip(*series[first, "wait_fraction"], strict=True))
    ax[2].plot(*zip(*series[first, "backlog_rows"], strict=True))
    ax[0].set_ylabel("autoscaled workers")
    ax[0].legend(fontsize=7)
    ax[1].set_ylabel("trainer wait (window)")
    ax[1].set_ylim(0, 1)
    ax[2].set_ylabel("backlog rows")
    ax[2].set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
