"""Scaling policies: the API, the built-ins, prices, traces and the simulator (no ../shared:
small fixture catalogs under tests/fixtures)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from astraflow.policies import (
    CostAware,
    DeadBand,
    Fixed,
    Observation,
    Plan,
    Policy,
    Pool,
    PoolState,
    Scenario,
    TrainerState,
    Workload,
    load_prices,
    load_trace,
    read_csv,
    resolve_policy,
    simulate,
)

FIX = Path(__file__).parent / "fixtures"


def test_import_pulls_no_torch_modal_or_sky():
    code = ("import sys, astraflow.policies, astraflow.policies.scaling_sim; "
            "print([m for m in ('torch', 'modal', 'sky', 'lancedb', 'matplotlib') "
            "if m in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def _obs(wait=0.0, backlog=0, live=None, pools=None, demand=None, **pool_kw):
    pools = pools or (Pool("od", price_per_hour=3.0, rows_per_s=4.0),
                      Pool("spot-a", spot=True, price_per_hour=1.0, rows_per_s=4.0),
                      Pool("spot-b", spot=True, price_per_hour=1.5, rows_per_s=4.0))
    live = live or {}
    states = tuple(PoolState(p, live=live.get(p.name, 0), **pool_kw.get(p.name, {}))
                   for p in pools)
    tr = TrainerState("solver", wait_fraction=wait, backlog_rows=backlog, batch_rows=64,
                      max_backlog_rows=256, demand_rows_per_s=demand)
    return Observation(100.0, (tr,), states)


def test_fixed_and_deadband():
    assert Fixed(3, "od").plan(_obs()).targets == {"od": 3}
    db = DeadBand("od", low=0.02, high=0.10)
    assert db.plan(_obs(wait=0.5, live={"od": 2})).targets == {"od": 3}
    # Fed, backlog past 75% of the bound: retire one. Fed, backlog low: hold.
    p = db.plan(_obs(wait=0.0, backlog=250, live={"od": 3}))
    assert p.targets == {"od": 2} and "retire" in p.reason
    assert db.plan(_obs(wait=0.05, backlog=10, live={"od": 3})).targets == {"od": 3}
    with pytest.raises(ValueError, match="low <= high"):
        DeadBand(low=0.5, high=0.1)


def test_cost_aware_prefers_spot_and_moves_when_preempted():
    pol = CostAware(headroom=0.0, backlog_target=0.5, drain_s=1e9)
    p = pol.plan(_obs(demand=10.0))
    assert p.targets == {"od": 0, "spot-a": 3, "spot-b": 0}, p.reason  # ceil(10 / 4)
    # spot-a just preempted its workers: keep what it has, grow the next cheapest.
    p = pol.plan(_obs(demand=10.0, live={"spot-a": 1}, **{"spot-a": {"preemptions_1h": 2}}))
    assert p.targets["spot-a"] <= 1 and p.targets["spot-b"] >= 2, p.reason
    # No spot capacity anywhere: on-demand fills the need.
    p = pol.plan(_obs(demand=10.0, **{"spot-a": {"launch_failures_1h": 1},
                                      "spot-b": {"launch_failures_1h": 3}}))
    assert p.targets == {"od": 3, "spot-a": 0, "spot-b": 0}, p.reason
    assert isinstance(p, Plan) and "od" in p.reason


def test_cost_aware_holds_in_band_and_bootstraps():
    pol = CostAware(headroom=0.0, hold_band=0.25, drain_s=1e9)
    p = pol.plan(_obs(demand=10.0, live={"spot-b": 3}))  # 12 rows/s for 10 needed: hold
    assert p.targets == {"od": 0, "spot-a": 0, "spot-b": 3} and p.reason.startswith("hold")
    p = pol.plan(_obs(wait=1.0))  # nothing measured, nothing running
    assert sum(p.targets.values()) == pol.bootstrap and p.targets["spot-a"] == pol.bootstrap


class Halve(Policy):
    """A custom policy: half the live workers of the first pool, at least one."""

    name = "halve"

    def plan(self, obs):
        s = obs.pools[0]
        return Plan({s.pool.name: max(1, s.live // 2)}, "halve")


def test_resolve_builtin_and_module_attr():
    assert isinstance(resolve_policy("cost", headroom=0.1), CostAware)
    assert resolve_policy("deadband", high=0.3).high == 0.3
    pol = resolve_policy("tests.test_policies_scaling:Halve")
    assert pol.plan(_obs(live={"od": 6})).targets == {"od": 3}
    with pytest.raises(ValueError, match="no built-in"):
        resolve_policy("nope")
    with pytest.raises(ValueError, match="cannot load"):
        resolve_policy("tests.nowhere:X")


def test_prices_from_csv_and_from_a_sky_catalog(monkeypatch):
    rows = read_csv(FIX / "prices_small.csv")
    cat = load_prices(FIX / "prices_small.csv")
    assert len(cat) == len(rows) == 6
    assert cat.price("aws", "us-east-1", "L4", spot=True) == pytest.approx(0.3653)  # cheapest zone
    assert cat.price("aws", "us-east-1", "L4", spot=False) == pytest.approx(0.8048)
    assert cat.price("aws", "us-east-1", "H100", spot=True) is None  # empty cell: no price
    [gcp] = cat.select(cloud="gcp")
    assert gcp.basis == "accelerator_only"
    # SkyPilot's catalog form (vms.csv per cloud); CPU rows skipped.
    monkeypatch.setenv("ASTRAFLOW_SKY_CATALOG", str(FIX / "skycat"))
    sky = load_prices()
    assert len(sky) == 2 and sky.price("aws", "us-east-2", "L4", spot=True) == pytest.approx(0.2599)
    monkeypatch.setenv("ASTRAFLOW_SKY_CATALOG", str(FIX / "missing"))
    with pytest.raises(FileNotFoundError, match="--prices"):
        load_prices()


def test_trace_capacity_and_preemptions():
    tr = load_trace(FIX / "trace_small.json", scale=2)
    assert tr.gap_s == 600 and tr.capacity(0) == 8 and tr.capacity(1300) == 4
    assert tr.capacity(1800) == 0 and tr.capacity(8 * 600) == 8  # wraps around
    assert tr.preemptions() == (4 - 2 + 2 - 0) * 2


def _scenario(**kw) -> Scenario:
    work = Workload(batch_rows=64, batches_per_step=2, train_s=10.0, max_backlog_batches=8,
                    steps=300)  # needs 12.8 rows/s: 4 workers of 3.2 rows/s
    pools = (Pool("od", price_per_hour=2.0, rows_per_s=3.2, cold_start_s=60),
             Pool("spot", spot=True, price_per_hour=0.6, rows_per_s=3.2, cold_start_s=60))
    return Scenario("t", work, pools, interval_s=30.0, window_s=120.0, **kw)


def test_simulator_compares_policies_at_equal_steps():
    scn = _scenario(traces={"spot": load_trace(FIX / "trace_small.json", scale=2)})
    fixed = simulate(scn, Fixed(4, "od"), "fixed")
    cost = simulate(scn, CostAware(), "cost")
    assert fixed.finished and cost.finished and fixed.steps == cost.steps == 300
    # Fixed on demand: no preemption, 4 x $2/h for the run.
    assert fixed.preemptions == 0 and fixed.trainer_wait_fraction < 0.05
    assert fixed.rollout_cost == pytest.approx(4 * 2.0 * fixed.wall_s / 3600, rel=0.01)
    # The trace takes spot capacity to 0 for 20 minutes: cost-aware is preempted, falls
    # back on demand, and still costs less and keeps the trainer mostly fed.
    assert cost.preemptions > 0 and cost.worker_hours["od"] > 0 and cost.worker_hours["spot"] > 0
    assert cost.rollout_cost < 0.9 * fixed.rollout_cost
    assert cost.trainer_wait_fraction < 0.15
    # Deterministic.
    again = simulate(scn, CostAware(), "cost")
    assert (again.rollout_cost, again.steps, again.preemptions) == \
        (cost.rollout_cost, cost.steps, cost.preemptions)


def test_simulator_rate_preemptions_and_deadband_adapts():
    scn = _scenario(preemptions_per_hour={"spot": 2.0}, seed=3)
    db = simulate(scn, DeadBand("od", start=1), "deadband")
    grew = max(p["live"]["od"] for p in db.timeline)
    assert db.finished and grew >= 4  # grew from 1 until the trainer stopped waiting
    rate = simulate(scn, Fixed(5, "spot"), "spot")
    assert rate.preemptions > 0 and rate.rows_lost >= 0


def test_plot_runs_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from astraflow.policies.scaling_sim import plot_runs

    scn = _scenario()
    runs = [simulate(scn, Fixed(4, "od"), "fixed"), simulate(scn, CostAware(), "cost")]
    plot_runs(runs, str(tmp_path / "p.png"), "t")
    assert (tmp_path / "p.png").stat().st_size > 5000


def _two_speeds(**live):
    """A fast pool and a cheap slow one (rows/s per GPU 4.0 vs 1.6; $/row 0.375 vs 0.25)."""
    pools = (Pool("fast", spot=True, price_per_hour=1.5, rows_per_s=4.0),
             Pool("slow", spot=True, price_per_hour=0.4, rows_per_s=1.6))
    return _obs(demand=20.0, pools=pools, live=live)


def test_cost_aware_weighs_gpu_hours_against_dollars():
    plan = CostAware(drain_s=1e9).plan(_two_speeds())  # dollars only: all slow
    assert plan.targets == {"fast": 0, "slow": 13}, plan.reason
    plan = CostAware(drain_s=1e9, gpu_slack=0.0).plan(_two_speeds())  # GPU-hours first: all fast
    assert plan.targets == {"fast": 5, "slow": 0}, plan.reason
    # In between: the cheapest rows whose fleet stays within 1.5x the fast pool's GPU-hours
    # per row: both pools, slow rows as far as the fast ones make room.
    pol = CostAware(drain_s=1e9, gpu_slack=0.5)
    plan = pol.plan(_two_speeds())
    f, s = plan.targets["fast"], plan.targets["slow"]
    assert f > 0 and s > 0, plan.reason
    assert 4.0 * f + 1.6 * s >= 20.0  # the need is covered
    assert (f + s) / (4.0 * f + 1.6 * s) <= 1.5 / 4.0 + 1e-9  # within the cap
    assert 1.5 * f + 0.4 * s < 1.5 * 5  # cheaper than all fast
    assert "GPU-hours per row capped" in plan.reason and "GPU-h/M rows" in plan.reason
    with pytest.raises(ValueError, match="gpu_slack"):
        CostAware(gpu_slack=-0.1)


def test_cost_aware_keeps_at_most_one_surplus_worker():
    pol = CostAware(headroom=0.0, drain_s=1e9)
    # 4 x 4 rows/s for 10 needed: two workers too many, retire them (3 x 4 = 12 covers it).
    p = pol.plan(_obs(demand=10.0, live={"spot-a": 4}))
    assert p.targets["spot-a"] == 3 and sum(p.targets.values()) == 3, p.reason
    # 3 x 4 = 12 for 10: one fewer would leave the trainer short: hold.
    p = pol.plan(_obs(demand=10.0, live={"spot-a": 3}))
    assert p.targets == {"od": 0, "spot-a": 3, "spot-b": 0} and p.reason.startswith("hold")


def test_simulated_gpu_cap_trades_dollars_for_gpu_hours():
    work = Workload(batch_rows=64, batches_per_step=2, train_s=10.0, max_backlog_batches=8,
                    steps=200)  # 12.8 rows/s
    pools = (Pool("od", price_per_hour=2.0, rows_per_s=3.2, cold_start_s=60),
             Pool("fast", spot=True, price_per_hour=1.2, rows_per_s=3.2, cold_start_s=60),
             Pool("slow", spot=True, price_per_hour=0.3, rows_per_s=1.28, cold_start_s=60))
    scn = Scenario("two speeds", work, pools, interval_s=30.0, window_s=120.0)
    dollars = simulate(scn, CostAware(), "dollars")
    capped = simulate(scn, CostAware(gpu_slack=0.0), "capped")
    assert dollars.steps == capped.steps == 200
    assert dollars.worker_hours["slow"] > 0 and capped.worker_hours["slow"] == 0
    assert dollars.rollout_cost < capped.rollout_cost and capped.gpu_hours < dollars.gpu_hours
    assert max(dollars.trainer_wait_fraction, capped.trainer_wait_fraction) < 0.1
