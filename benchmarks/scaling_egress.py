"""The ocean scenario: cheap GPUs an ocean away from the store, with egress priced.

    python benchmarks/scaling.py --set ocean      # (this module's `run`)

The store and the trainer are in AWS us-east-1. Rollout pools: L40S on demand and spot
in us-east-1 (no egress), and L40S spot in eu-south-2 (Spain) at about half the spot
price, where every weight fetch and every row crosses the Atlantic at AWS's
inter-region list price (`policies/egress_prices.csv`). For each model size and way
of shipping weights (whole versions; deltas at the measured bf16 ratio with a
snapshot every `delta_chain` + 1 versions; deltas through a replica in eu-south-2),
three runs of the same simulated workload:

    cost        the cost policy, egress counted in its dollars per row
    cost-blind  the same policy shown the pools without their egress prices
                (what it did before egress was priced); the bytes are billed all the same
    local-only  the cost policy on the us-east-1 pools alone (the ocean pool removed)

No spot trace drives these pools (no preemption; capacity as asked), so the choice is
the prices' alone. ASSUMED: rows/s per accelerator as in scaling_data.SPEED; a row's
bytes (ROW_BYTES); the delta ratio of SmolLM2-135M (docs/weights.md) for every size.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from scaling_data import A100_ROWS_PER_S, COLD_START_S, SPEED, load_catalog, workload

from astraflow.policies import (
    Catalog,
    CostAware,
    Observation,
    Plan,
    Pool,
    Scenario,
    SimRun,
    Traffic,
    simulate,
)

STORE = ("aws", "us-east-1")
#: Bytes of one version in bfloat16 (2 bytes a parameter) per model.
MODELS = {"SmolLM2-135M": 135e6 * 2, "SmolLM2-360M": 362e6 * 2, "SmolLM2-1.7B": 1.71e9 * 2,
          "8B": 8.0e9 * 2}
DELTA_RATIO = 0.037  # XOR + zstd, SmolLM2-135M in bf16, median per step (docs/weights.md)
ROW_BYTES = 8_000.0  # ASSUMED: ~1,000 tokens of ids and log-probs, with the text
#: How weights travel: (label, delta ratio or None, delta_chain, a replica in eu-south-2).
MODES = (("whole versions", None, 8, False), ("deltas, chain 8", DELTA_RATIO, 8, False),
         ("deltas, chain 32", DELTA_RATIO, 32, False),
         ("deltas, chain 8, replica", DELTA_RATIO, 8, True))


class Blind(CostAware):
    """The cost policy shown pools without their egress prices (billed all the same)."""

    name = "cost-blind"

    def plan(self, obs: Observation) -> Plan:
        pools = tuple(replace(s, pool=replace(s.pool, weights_usd_per_gb=0.0,
                                              rows_usd_per_gb=0.0)) for s in obs.pools)
        return super().plan(replace(obs, pools=pools))


def pool(cat: Catalog, name: str, region: str, *, spot: bool, replica: bool = False) -> Pool:
    price = cat.price("aws", region, "L40S", 1, spot=spot, instance_type="g6e.xlarge")
    if price is None:
        raise SystemExit(f"no {'spot' if spot else 'on-demand'} L40S price in aws {region}")
    out = cat.egress_price(*STORE, "aws", region).usd_per_gb
    back = cat.egress_price("aws", region, *STORE).usd_per_gb
    if out is None or back is None:
        raise SystemExit(f"no egress price between {STORE} and aws {region}")
    return Pool(name, cloud="aws", region=region, accelerator="L40S", spot=spot,
                price_per_hour=price, rows_per_s=A100_ROWS_PER_S * SPEED["L40S"],
                cold_start_s=COLD_START_S["aws"], weights_usd_per_gb=out,
                rows_usd_per_gb=back, replica=replica)


def runs(data: Path, steps: int) -> tuple[list[dict], str]:
    cat = load_catalog(data)
    trainer_price = cat.price("aws", "us-east-1", "A100", 8, spot=False) or 0.0
    local = [pool(cat, "l40s-use1-od", "us-east-1", spot=False),
             pool(cat, "l40s-use1-spot", "us-east-1", spot=True)]
    ocean = pool(cat, "l40s-eus2-spot", "eu-south-2", spot=True)
    head = ("store and trainer: aws us-east-1; pools: " + ", ".join(
        f"{p.name} ${p.price_per_hour:.3f}/h" for p in [*local, ocean])
        + f"; eu-south-2 egress ${ocean.weights_usd_per_gb:g}/GB out, "
          f"${ocean.rows_usd_per_gb:g}/GB back ("
        + cat.egress_price(*STORE, "aws", "eu-south-2").why + ")")
    out = []
    for model, nbytes in MODELS.items():
        for label, ratio, chain, rep in MODES:
            traffic = Traffic(version_bytes=nbytes, delta_ratio=ratio, delta_chain=chain,
                              row_bytes=ROW_BYTES)
            work = replace(workload(steps, 20.0, trainer_price), traffic=traffic)
            far = replace(ocean, replica=rep)
            boot = {"bootstrap": 11}  # need - 1, as in scaling.py
            scn = Scenario(f"{model}, {label}", work, (*local, far))
            near = Scenario(f"{model}, local only", work, tuple(local))
            res = [simulate(scn, CostAware(**boot), "cost"),
                   simulate(scn, Blind(**boot), "cost-blind"),
                   simulate(near, CostAware(**boot), "local-only")]
            out.append({"model": model, "mode": label, "runs": [summary(r, far.name)
                                                                for r in res]})
    return out, head


def summary(r: SimRun, far: str) -> dict:
    rows = {k: v for k, v in r.worker_hours.items()}
    return {"policy": r.policy, "steps": r.steps, "finished": r.finished,
            "gpu_usd": r.rollout_cost, "egress_usd": r.egress_cost,
            "total_usd": r.rollout_cost + r.egress_cost, "egress_gb": r.egress_gb,
            "far_share": rows.get(far, 0.0) / max(sum(rows.values()), 1e-9),
            "wait": r.trainer_wait_fraction}


def run(data: Path, steps: int, out: Path) -> int:
    res, head = runs(data, steps)
    print(head)
    print(f"{steps} trainer steps of 4 x 256 rows, 20 s each (180 versions/h); row "
          f"{ROW_BYTES / 1e3:g} kB; delta {DELTA_RATIO}x a whole version (bf16)")
    print(f"\n{'model':<14}{'weights':<26}{'policy':<12}{'ocean':>7}{'GPU $':>9}{'egress $':>10}"
          f"{'total $':>9}{'wait':>7}  egress GB (weights/replica/rows)")
    for case in res:
        best = min(case["runs"], key=lambda r: r["total_usd"])["policy"]
        for r in case["runs"]:
            g = r["egress_gb"]
            print(f"{case['model']:<14}{case['mode']:<26}{r['policy']:<12}{r['far_share']:>7.0%}"
                  f"{r['gpu_usd']:>9.1f}{r['egress_usd']:>10.1f}{r['total_usd']:>9.1f}"
                  f"{r['wait']:>7.1%}  {g.get('weights', 0):.0f}/{g.get('replica', 0):.0f}/"
                  f"{g.get('rows', 0):.0f}" + ("  <- cheapest" if r["policy"] == best else ""))
    out.mkdir(parents=True, exist_ok=True)
    (out / "scaling-ocean.json").write_text(json.dumps(res, indent=1))
    print(f"\nocean: share of rollout worker-hours in eu-south-2; total $: rollout GPUs + "
          f"egress (the trainer's machine, the same in every run, left out). "
          f"figures: {out / 'scaling-ocean.json'}")
    return 0
