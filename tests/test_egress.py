"""Egress priced: list prices with their sources, the bytes a run moves, and placements
that save on GPUs but pay more in egress (issue 37). Deterministic: no clock, no network."""

from __future__ import annotations

import copy
import re
from dataclasses import replace

import pytest
import yaml

from astraflow.cloud.plan import plan
from astraflow.config.loader import parse_flow
from astraflow.policies import (
    Catalog,
    CostAware,
    Observation,
    Pool,
    PoolState,
    PriceRow,
    Scenario,
    Traffic,
    TrainerState,
    Workload,
    default_egress,
    load_prices,
    read_egress,
    simulate,
)

GB = 1e9
WHOLE = Traffic(version_bytes=0.724 * GB, row_bytes=8e3)  # SmolLM2-360M in bf16, whole copies
DELTAS = replace(WHOLE, delta_ratio=0.037, delta_chain=32)  # the measured bf16 delta ratio


def test_prices_are_loaded_with_their_sources_and_dates(tmp_path):
    table = default_egress()
    assert {r.cloud for r in table.rows} == {"aws", "gcp", "azure"}
    for r in table.rows:
        assert r.source.startswith("https://") and re.fullmatch(r"\d{4}-\d\d-\d\d", r.as_of)
        assert 0 < r.usd_per_gb < 0.2
    # One catalog holds GPUs and egress; the region pair picks the most specific row.
    cat = Catalog([PriceRow("aws", "us-east-1", "a", "g6.xlarge", "L4", 1, 0.8, 0.3)], "t")
    assert cat.egress_price("aws", "us-east-1", "aws", "us-east-1").usd_per_gb == 0.0
    assert cat.egress_price("aws", "us-east-1", "aws", "us-east-2").usd_per_gb == 0.01
    far = cat.egress_price("aws", "us-east-1", "aws", "eu-south-2")
    assert far.usd_per_gb == 0.02 and "aws.amazon.com" in far.why and "as of" in far.why
    assert cat.egress_price("aws", "ap-northeast-1", "aws", "us-east-1").usd_per_gb == 0.09
    # Leaving a cloud is the sender's internet rate, whichever cloud receives.
    assert cat.egress_price("aws", "us-east-1", "gcp", "us-east4").usd_per_gb == 0.09
    assert cat.egress_price("gcp", "us-east4", "aws", "us-east-1").usd_per_gb == 0.12
    assert cat.egress_price("azure", "eastus", "azure", "westeurope").usd_per_gb == 0.05
    assert cat.egress_price("aws", "nowhere-9", "aws", "us-east-1").usd_per_gb is None
    # A CSV given by hand carries the shipped egress table too.
    f = tmp_path / "p.csv"
    f.write_text("cloud,instance_type,accelerator,accelerator_count,region,zone,"
                 "price_ondemand_hr,price_spot_hr\naws,g6.xlarge,L4,1,us-east-1,a,0.8,0.3\n")
    assert load_prices(f).egress_price("aws", "us-east-1", "aws", "eu-west-1").usd_per_gb == 0.02
    # A price without its source or date is refused.
    bad = tmp_path / "e.csv"
    bad.write_text("cloud,from,to,usd_per_gb,as_of,source\naws,na,*,0.02,,\n")
    with pytest.raises(ValueError, match="source and as_of"):
        read_egress(bad)


def test_fetch_bytes_follow_the_chain():
    t = Traffic(version_bytes=100.0, delta_ratio=0.1, delta_chain=3)  # snapshots 0, 4, 8
    assert [t.snapshot(v) for v in range(6)] == [True, False, False, False, True, False]
    assert t.fetch_bytes(None, 2) == 100 + 2 * 10  # snapshot 0 and two deltas
    assert t.fetch_bytes(1, 3) == 2 * 10  # only the deltas after the version held
    assert t.fetch_bytes(3, 5) == 100 + 10  # a snapshot since: it and its chain
    assert t.fetch_bytes(5, 5) == 0.0
    assert t.mean_stored_bytes() == pytest.approx((100 + 3 * 10) / 4)
    whole = replace(t, delta_ratio=None)
    assert whole.fetch_bytes(1, 3) == 100.0 and whole.mean_stored_bytes() == 100.0
    # A worker reloading 60 times an hour while 180 versions are published.
    assert whole.worker_bytes_per_hour(180, 60) == 60 * 100
    assert t.worker_bytes_per_hour(180, 60) == pytest.approx(180 * 32.5)


def _pools() -> tuple[Pool, Pool]:
    """A local pool and one an ocean away with GPUs at half the price (L40S spot,
    us-east-1 and eu-south-2 in the benchmark's catalog), both on demand here."""
    local = Pool("local", cloud="aws", region="us-east-1", price_per_hour=0.915, rows_per_s=3.84)
    far = Pool("far", cloud="aws", region="eu-south-2", price_per_hour=0.48, rows_per_s=3.84,
               weights_usd_per_gb=0.02, rows_usd_per_gb=0.02)
    return local, far


def test_the_cost_policy_counts_egress_in_its_dollars_per_row():
    local, far = _pools()

    def grow(traffic: Traffic) -> tuple[dict[str, int], str]:
        trainer = TrainerState("t", wait_fraction=0.3, backlog_rows=0, batch_rows=1024,
                               max_backlog_rows=4096, demand_rows_per_s=51.2, steps_done=5,
                               steps_target=1000, traffic=replace(traffic, worker_batch_rows=256))
        obs = Observation(600.0, (trainer,), (PoolState(local), PoolState(far)))
        p = CostAware().plan(obs)
        return p.targets, p.reason

    # Blind to bytes (none moved), the far pool's half-price GPUs win.
    targets, _ = grow(Traffic())
    assert targets["far"] > 0 and targets["local"] == 0
    # A 360M policy shipped whole: 0.72 GB a reload (54 an hour) across the ocean costs
    # more than the GPUs save, so the local pool is grown; the reason shows the egress.
    targets, why = grow(WHOLE)
    assert targets["local"] > 0 and targets["far"] == 0, why
    # Deltas (0.037x, a snapshot every 33 versions) bring the far pool back, and its row
    # price shows what of it is egress.
    targets, why = grow(DELTAS)
    assert targets["far"] > 0 and targets["local"] == 0, why
    assert re.search(r"far \(\$[\d.]+/M rows incl\. \$[\d.]+ egress\)", why), why


def test_the_simulator_bills_egress_and_the_policy_avoids_the_dear_placement():
    local, far = _pools()
    work = Workload(steps=150, train_s=20.0, traffic=WHOLE)
    scn = Scenario("ocean", work, (local, far))

    class Blind(CostAware):  # the same policy shown no egress prices
        def plan(self, obs):
            pools = tuple(replace(s, pool=replace(s.pool, weights_usd_per_gb=0.0,
                                                  rows_usd_per_gb=0.0)) for s in obs.pools)
            return super().plan(replace(obs, pools=pools))

    aware, blind = simulate(scn, CostAware(bootstrap=11)), simulate(scn, Blind(bootstrap=11))
    assert aware.steps == blind.steps == 150
    # Blind, it rents the cheaper GPUs and pays for every fetch across the ocean.
    assert blind.worker_hours["far"] > 0 and blind.rollout_cost < aware.rollout_cost
    assert blind.egress_gb["weights"] > 100 and blind.egress_cost > 1.0
    assert blind.rollout_cost + blind.egress_cost > aware.rollout_cost + aware.egress_cost
    assert aware.worker_hours["far"] == 0 and aware.egress_cost == 0.0
    assert aware.total_cost == pytest.approx(aware.rollout_cost + aware.trainer_cost)
    # Shipped as deltas, the far pool pays for itself and the policy uses it.
    d = simulate(replace(scn, workload=replace(work, traffic=DELTAS)), CostAware(bootstrap=11))
    assert d.worker_hours["far"] > d.worker_hours["local"]
    assert 0 < d.egress_cost and d.rollout_cost + d.egress_cost < aware.rollout_cost
    # A replica in the far region: each version crosses once, whoever reads it.
    rep = replace(scn, workload=replace(work, traffic=DELTAS),
                  pools=(local, replace(far, replica=True)))
    r = simulate(rep, CostAware(bootstrap=11))
    assert r.egress_gb["weights"] == 0 and r.egress_gb["replica"] > 0
    assert r.egress_gb["replica"] == pytest.approx(sum(
        DELTAS.stored_bytes(v) for v in range(r.steps + 1)) / GB)


def test_the_launch_estimate_prints_egress_and_the_cheaper_placement():
    data = yaml.safe_load(open("examples/cloud.yaml"))
    data["store"]["replicas"] = []
    data["launch"]["rollout"] = [{"name": "gpus", "backend": "sky", "workers": 4,
                                  "accelerators": ["L40S:1"],
                                  "infra": ["aws/us-east-1", "aws/eu-south-2"]}]
    rows = [PriceRow("aws", "us-east-1", "a", "g6e.xlarge", "L40S", 1, 1.861, 0.915),
            PriceRow("aws", "eu-south-2", "a", "g6e.xlarge", "L40S", 1, 1.961, 0.480),
            PriceRow("aws", "us-east-1", "a", "m6i.2xlarge", "", 0, 0.384, 0.2, vcpus=8,
                     memory_gib=32)]
    cat = Catalog(rows, "test rows")
    # Without the store's region: no egress, and the estimate says it is left out.
    text = plan(parse_flow(data), environ={}).describe(cat)
    assert "egress:" not in text and "not included: egress (set launch.store_region" in text
    data["launch"]["store_region"] = "aws/us-east-1"
    data["launch"]["traffic"] = {"version_gb": 3.4, "rows_per_hour": 10000}
    text = plan(parse_flow(data), environ={}).describe(cat)
    assert "egress:    ~$16.32/h at aws/eu-south-2 (weights 204.0 GB/h at $0.02/GB" in text, text
    assert "cheaper with egress: aws/us-east-1 L40S:1 $0.915/h + $0/h egress a worker" in text
    assert "estimated: ~$18.44/h while everything runs, from test rows ($2.12/h machines + " \
           "$16.32/h egress)" in text, text
    # Deltas: the far placement pays for itself; no pin suggested.
    deltas = copy.deepcopy(data)
    deltas["store"]["delta_chain"] = 32
    text = plan(parse_flow(deltas), environ={}).describe(cat)
    assert "egress:    ~$1.08/h at aws/eu-south-2" in text and "cheaper with egress" not in text


def test_autoscaler_pools_carry_egress_prices_and_the_run_traffic():
    """`astraflow scale`'s sky pools are priced for egress to and from the store's region
    (a pool reading a replica adds no weight bytes per worker); a pool whose infra
    names no region is refused rather than taken as free."""
    from astraflow.scale.pools import cloud_pools, run_traffic

    data = yaml.safe_load(open("examples/cloud.yaml"))
    data["launch"]["store_region"] = "aws/us-east-1"
    data["launch"]["traffic"] = {"version_gb": 0.27}
    data["store"]["delta_chain"] = 8
    data["launch"]["rollout"] = [
        {"name": "near", "backend": "sky", "accelerators": ["L40S:1"], "infra": ["aws/us-east-1"]},
        {"name": "far", "backend": "sky", "accelerators": ["L40S:1"], "infra": ["aws/eu-south-2"],
         "region": "eu-south-2"}]
    rows = [PriceRow("aws", r, "a", "g6e.xlarge", "L40S", 1, 1.9, sp)
            for r, sp in (("us-east-1", 0.915), ("eu-south-2", 0.48))]
    flow = parse_flow(data)
    pools = {p.name: p for p in cloud_pools(flow, "sky", catalog=Catalog(rows, "t"))}
    near, far = pools["near-l40s-us-east-1"], pools["far-l40s-eu-south-2"]
    assert (near.weights_usd_per_gb, near.rows_usd_per_gb, near.replica) == (0.0, 0.0, False)
    assert (far.weights_usd_per_gb, far.rows_usd_per_gb, far.replica) == (0.02, 0.02, True)
    t = run_traffic(flow)
    assert t.version_bytes == 0.27e9 and t.delta_ratio == 0.037 and t.delta_chain == 8
    assert t.worker_batch_rows == flow.rollout.prompts_per_batch * flow.rollout.samples_per_prompt
    data["launch"]["rollout"][0]["infra"] = ["aws"]
    with pytest.raises(ValueError, match="names no region"):
        cloud_pools(parse_flow(data), "sky", catalog=Catalog(rows, "t"))
