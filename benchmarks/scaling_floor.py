"""The scaling benchmark's research tools: the hindsight floor and the run plots.

`hindsight_floor` is a lower bound on any policy's rollout dollars on a scenario (a
policy that knew every trace in advance, paying for rows only); `plot_runs` draws
workers per pool, cost and trainer wait over time. benchmarks/scaling.py uses both.
"""

from __future__ import annotations

import math

from astraflow.policies import Scenario, SimRun


def hindsight_floor(scn: Scenario, *, max_wait: float = 0.05,
                    gpu_hours: float | None = None) -> tuple[float, float]:
    """A lower bound on the rollout dollars of ANY policy on `scn` whose trainer waits at
    most `max_wait` of its run (and, given `gpu_hours`, that bills at most that many
    rollout GPU-hours), and the GPU-hours of that cheapest schedule (the bound when it
    binds): (dollars, GPU-hours); (inf, inf) when no schedule can supply the rows.

    It knows the whole trace in advance and pays only for rows: no cold starts, no
    batches cut off, no blocked or surplus worker, fractional workers. The rows are the
    run's (steps x rows per step, less the backpressure bound, which a policy may produce
    ahead of the trainer's pace); at each moment of [0, steps x train_s / (1 - max_wait)]
    (the longest run that waits no more, started at once) at most the trainer's pace,
    from each pool at most its capacity (a traced spot pool's trace, otherwise
    `max_workers`) x its rows/s. The cheapest such rows, taken across all moments, are a
    linear programme; with a GPU-hour bound it is solved through its Lagrangian (rows
    priced $ + lam x GPU-h, lam by bisection) and the best dual value is returned, which
    is a lower bound whatever lam is. Rate-drawn preemptions are ignored (a bound)."""
    w = scn.workload
    pace = w.demand_rows_per_s
    rows = w.steps * w.batch_rows * w.batches_per_step - w.max_backlog_batches * w.batch_rows
    horizon = w.steps * w.train_s / (1.0 - max_wait)
    pools = [p for p in scn.pools if p.max_workers > 0]
    if rows <= 0 or not pools:
        return (0.0, 0.0) if rows <= 0 else (math.inf, math.inf)
    traced = {p.name: scn.traces[p.name] for p in pools if p.spot and p.name in scn.traces}
    cuts = {0.0, horizon}
    for tr in traced.values():
        cuts.update(k * tr.gap_s for k in range(1, int(horizon // tr.gap_s) + 1))
    cuts = sorted(c for c in cuts if c <= horizon)
    spans: dict[tuple[int, ...], float] = {}  # capacity of every pool -> seconds it holds
    for a, b in zip(cuts, cuts[1:], strict=False):
        caps = tuple(traced[p.name].capacity(a) if p.name in traced else p.max_workers
                     for p in pools)
        spans[caps] = spans.get(caps, 0.0) + (b - a)
    usd = [p.price_per_hour / 3600 / p.rows_per_s for p in pools]  # $ per row
    gph = [p.gpus / 3600 / p.rows_per_s for p in pools]  # GPU-hours per row

    def cheapest(lam: float) -> tuple[float, float]:
        order = sorted(range(len(pools)), key=lambda j: usd[j] + lam * gph[j])
        menu = []  # (price with lam, $ per row, GPU-h per row, rows)
        for caps, secs in spans.items():
            left = pace
            for j in order:
                r = min(caps[j] * pools[j].rows_per_s, left)
                if r > 0:
                    menu.append((usd[j] + lam * gph[j], usd[j], gph[j], r * secs))
                    left -= r
                if left <= 1e-12:
                    break
        menu.sort()
        need, dollars, gpu = float(rows), 0.0, 0.0
        for _, u, g, r in menu:
            take = min(r, need)
            dollars, gpu, need = dollars + take * u, gpu + take * g, need - take
            if need <= 1e-9:
                return dollars, gpu
        return math.inf, math.inf

    dollars, gpu = cheapest(0.0)
    if gpu_hours is None or gpu <= gpu_hours or math.isinf(dollars):
        return dollars, gpu
    best, lo, hi = -math.inf, 0.0, 1.0
    while True:  # the dual bound d(lam) + lam (g(lam) - budget), for every lam tried
        d, g = cheapest(hi)
        best = max(best, d + hi * (g - gpu_hours))
        if g <= gpu_hours or hi > 1e6:
            break
        lo, hi = hi, hi * 4
    if g > gpu_hours:  # even the fewest GPU-hours per row take more than the budget
        return math.inf, math.inf
    for _ in range(50):
        mid = (lo + hi) / 2
        d, g = cheapest(mid)
        best = max(best, d + mid * (g - gpu_hours))
        lo, hi = (mid, hi) if g > gpu_hours else (lo, mid)
    return best, gpu_hours



def plot_runs(runs: list[SimRun], path: str, title: str = "") -> None:
    """Workers per pool (stacked), cumulative cost and trainer wait over time, one
    column per policy. Needs matplotlib (imported here only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, len(runs), figsize=(4.2 * len(runs), 8), sharex="col",
                             squeeze=False)
    for j, r in enumerate(runs):
        t = [p["t"] / 3600 for p in r.timeline]
        pools = [n for n in r.worker_hours if r.worker_hours[n] > 0]
        if pools:
            axes[0][j].stackplot(t, *[[p["live"][n] for p in r.timeline] for n in pools],
                                 labels=pools, step="post")
            axes[0][j].legend(fontsize=6, loc="upper right")
        axes[0][j].set_title(f"{r.policy}: ${r.rollout_cost:.0f}, {r.gpu_hours:.0f} GPU-h",
                             fontsize=9)
        axes[1][j].plot(t, [p["cost"] for p in r.timeline])
        axes[2][j].plot(t, [p["wait"] for p in r.timeline])
        axes[2][j].set_ylim(0, 1)
        axes[2][j].set_xlabel("hours")
    axes[0][0].set_ylabel("rollout workers")
    axes[1][0].set_ylabel("rollout cost ($)")
    axes[2][0].set_ylabel("trainer wait (window)")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
