"""The scenarios `benchmarks/scaling.py` runs, built from `../shared/data` (read it there).

Prices: SkyPilot catalog rows in `gpu_prices.csv` (AWS whole instances) and
`gcp_instance_prices_derived.csv` (GCP host VM + GPU; the GPU-only rows alone would
undercount). A pool's price is the cheapest zone of its region. Spot capacity: the
public traces under `spot_traces*`, each mapped onto one spot pool. The traces were
taken on other instance types (V100, A100 40GB x 8), so which trace drives which
pool is an ASSUMPTION, printed with every scenario.

One scenario is the TUNING one (the policy was developed while looking at it); the
others are HELD OUT, built to differ from it in one way each:

    tune            AWS + GCP pools, mapping A, every trace from its first tick
    windows s=1..3  the same pools and mapping, each trace started at a tick drawn by seed s
    other zones     AWS + GCP pools, mapping B: other traced zones drive each pool
    aws only        the AWS pools alone (L40S, A10G, L4; mapping A)
    gcp only        the GCP A100 pools alone (mapping A)
    trainer x2      a trainer twice as fast (10 s a step: twice the rows/s to supply)
    trainer x0.5    a trainer half as fast (40 s a step)

and a FRESH set, added before the hedge of issue 13 was revised and run only once,
after it (`--set fresh`), built by the same rules as the held-out ones:

    windows s=4..9  mapping A, each trace started at a tick drawn by seed s
    zones C         AWS + GCP pools, mapping C: for each pool a traced zone neither A nor
                    B gave it (AWS: the 1-node records, 8 workers per unit as in B)

and a second fresh set (`--set fresh2`), added by issue 13's helper h-13 before it
changed the policy and first run with the policy as it then was, by the same rules:

    windows s=10..15  mapping A, each trace started at a tick drawn by seed s
    zones D           AWS + GCP pools, mapping D: for each pool a traced zone none of A,
                      B and C gave it (AWS: a record of the pool's own region; GCP: the
                      GCP1 zones once more, each pool a new one, us-east1-b's all-zero
                      record unused as in B)

and a third fresh set (`--set fresh3`), added by issue 13's helper h-13 (second round)
before it changed the policy, and first run with the policy as it then was:

    windows s=16..21  mapping A, each trace started at a tick drawn by seed s
    zones E           AWS + GCP pools, mapping E: for each pool a traced zone none of A,
                      B, C and D gave it (AWS: 1-node records, 8 workers per unit, two of
                      them from record sets no earlier mapping used; GCP: the GCP1 zones
                      once more, each pool a new one, us-east1-b's record unused)
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path

from astraflow.policies import Catalog, Pool, Scenario, SpotTrace, Workload, load_trace, read_csv

#: ASSUMED rows/s of one worker per accelerator, relative to one A100-40GB (decode-bound
#: small-policy rollouts on vLLM); the base is one 256-row batch per minute on an A100.
SPEED = {"A100": 1.0, "L40S": 0.9, "A10G": 0.4, "L4": 0.3}
A100_ROWS_PER_S = 256 / 60.0
COLD_START_S = {"aws": 180.0, "gcp": 240.0}  # ASSUMED: VM + image + first weights
TRAIN_S = 20.0  # one trainer step (4 batches of 256 rows): 51.2 rows/s to supply

ST, SH = "spot_traces", "spot_traces_spothedge"
#: pool -> (trace file under the data folder, workers per trace unit). Mapping A is the
#: tuning one; B drives each pool with another traced zone (or another trace set).
MAP_A = {
    "l40s-use2-spot": (f"{ST}/availability/16-node/aws-08-27-2023/us-east-2b_v100_1.json", 1),
    "l40s-usw2-spot": (f"{ST}/availability/16-node/aws-08-27-2023/us-west-2a_v100_1.json", 1),
    "a10g-use2-spot": (f"{ST}/preemption/4-node/aws-08-03-2023/us-east-2a_v100_1.json", 2),
    "l4-usw2-spot": (f"{ST}/preemption/4-node/aws-08-03-2023/us-west-2c_v100_1.json", 2),
    "a100-usc1a-spot": (f"{SH}/GCP1/us-central1-a_a100_40gb_8.json", 2),
    "a100-usc1b-spot": (f"{SH}/GCP1/us-central1-b_a100_40gb_8.json", 2),
    "a100-euw4-spot": (f"{SH}/GCP1/europe-west4-a_a100_40gb_8.json", 2),
    "a100-use1-spot": (f"{SH}/GCP1/us-east1-b_a100_40gb_8.json", 2),
    "a100-usw1-spot": (f"{SH}/GCP1/us-west1-b_a100_40gb_8.json", 2),
}
MAP_B = {
    "l40s-use2-spot": (f"{ST}/availability/16-node/aws-08-27-2023/us-west-2c_v100_1.json", 1),
    "l40s-usw2-spot": (f"{ST}/availability/1-node/aws-10-26-2022/us-west-2b_v100_8.json", 8),
    "a10g-use2-spot": (f"{ST}/preemption/4-node/aws-08-03-2023/us-east-1f_v100_1.json", 2),
    "l4-usw2-spot": (f"{ST}/availability/1-node/aws-02-15-2023/us-west-2b_v100_1.json", 8),
    "a100-usc1a-spot": (f"{SH}/GCP1/us-central1-b_a100_40gb_8.json", 2),
    "a100-usc1b-spot": (f"{SH}/GCP1/us-central1-a_a100_40gb_8.json", 2),
    "a100-euw4-spot": (f"{SH}/GCP1/asia-northeast1-a_a100_40gb_8.json", 4),
    "a100-use1-spot": (f"{SH}/GCP1/us-west1-b_a100_40gb_8.json", 2),
    "a100-usw1-spot": (f"{SH}/GCP1/europe-west4-a_a100_40gb_8.json", 2),
}
#: Mapping C: each pool driven by a traced zone that neither A nor B gave it; a 1-node
#: AWS record gives 0 or 8 workers (as in B), asia-northeast1-a (0/1) 4 (as in B).
MAP_C = {
    "l40s-use2-spot": (f"{ST}/availability/1-node/aws-02-15-2023/us-east-2b_v100_1.json", 8),
    "l40s-usw2-spot": (f"{ST}/availability/1-node/aws-02-15-2023/us-west-2a_v100_1.json", 8),
    "a10g-use2-spot": (f"{ST}/availability/1-node/aws-02-15-2023/us-east-2a_v100_1.json", 8),
    "l4-usw2-spot": (f"{ST}/preemption/1-node/aws-04-22-2023/us-west-2c_v100_1.json", 8),
    "a100-usc1a-spot": (f"{SH}/GCP1/us-west1-b_a100_40gb_8.json", 2),
    "a100-usc1b-spot": (f"{SH}/GCP1/asia-northeast1-a_a100_40gb_8.json", 4),
    "a100-euw4-spot": (f"{SH}/GCP1/us-central1-a_a100_40gb_8.json", 2),
    "a100-use1-spot": (f"{SH}/GCP1/europe-west4-a_a100_40gb_8.json", 2),
    "a100-usw1-spot": (f"{SH}/GCP1/us-east1-b_a100_40gb_8.json", 2),
}
#: Mapping D (set fresh2): each pool driven by a traced zone none of A, B and C gave it;
#: scales as in B and C (a 1-node AWS record 8 workers, asia-northeast1-a 4).
MAP_D = {
    "l40s-use2-spot": (f"{ST}/availability/1-node/aws-02-15-2023/us-east-2a_v100_1.json", 8),
    "l40s-usw2-spot": (f"{ST}/availability/16-node/aws-08-27-2023/us-west-2c_v100_1.json", 1),
    "a10g-use2-spot": (f"{ST}/availability/16-node/aws-08-27-2023/us-east-2b_v100_1.json", 1),
    "l4-usw2-spot": (f"{ST}/preemption/1-node/aws-04-22-2023/us-west-2b_v100_1.json", 8),
    "a100-usc1a-spot": (f"{SH}/GCP1/europe-west4-a_a100_40gb_8.json", 2),
    "a100-usc1b-spot": (f"{SH}/GCP1/us-west1-b_a100_40gb_8.json", 2),
    "a100-euw4-spot": (f"{SH}/GCP1/us-central1-b_a100_40gb_8.json", 2),
    "a100-use1-spot": (f"{SH}/GCP1/asia-northeast1-a_a100_40gb_8.json", 4),
    "a100-usw1-spot": (f"{SH}/GCP1/us-central1-a_a100_40gb_8.json", 2),
}
#: Mapping E (set fresh3): each pool driven by a traced zone none of A, B, C and D gave
#: it; scales as in B, C and D (a 1-node AWS record 8 workers, asia-northeast1-a 4).
MAP_E = {
    "l40s-use2-spot": (f"{ST}/preemption/1-node/aws-04-22-2023/us-east-1f_v100_1.json", 8),
    "l40s-usw2-spot": (f"{ST}/availability/1-node/aws-10-26-2022/us-west-2a_v100_8.json", 8),
    "a10g-use2-spot": (f"{ST}/availability/1-node/aws-02-15-2023/us-east-1d_v100_1.json", 8),
    "l4-usw2-spot": (f"{ST}/availability/1-node/aws-02-15-2023/us-west-2c_v100_1.json", 8),
    "a100-usc1a-spot": (f"{SH}/GCP1/asia-northeast1-a_a100_40gb_8.json", 4),
    "a100-usc1b-spot": (f"{SH}/GCP1/europe-west4-a_a100_40gb_8.json", 2),
    "a100-euw4-spot": (f"{SH}/GCP1/us-west1-b_a100_40gb_8.json", 2),
    "a100-use1-spot": (f"{SH}/GCP1/us-central1-a_a100_40gb_8.json", 2),
    "a100-usw1-spot": (f"{SH}/GCP1/us-central1-b_a100_40gb_8.json", 2),
}
#: The sets `cases` builds: "old" (tune + held-out), "fresh", "fresh2", "fresh3", or "all".
SETS = ("all", "old", "fresh", "fresh2", "fresh3")


@dataclass(frozen=True)
class Case:
    """One scenario with what the report needs beside it."""

    label: str  # "tune" | "held-out" | "fresh" | "fresh2" | "fresh3"
    scenario: Scenario
    od_pool: str  # the on-demand pool cheapest per row: fixed-od's and the dead band's
    mapping: tuple[str, ...]  # which trace drives which pool (an assumption)

    @property
    def name(self) -> str:
        return self.scenario.name


def load_catalog(data: Path) -> Catalog:
    return Catalog([r for r in read_csv(data / "gpu_prices.csv") if r.basis == "instance"]
                   + read_csv(data / "gcp_instance_prices_derived.csv"), str(data))


def _pool(cat: Catalog, name: str, cloud: str, region: str, acc: str, *, spot: bool,
          itype: str | None = None) -> Pool:
    price = cat.price(cloud, region, acc, 1, spot=spot, instance_type=itype)
    if price is None:
        raise SystemExit(f"no {'spot' if spot else 'on-demand'} price for {cloud} {region} {acc}")
    return Pool(name, backend="sky", cloud=cloud, region=region, accelerator=acc,
                accelerator_count=1, spot=spot, price_per_hour=price,
                rows_per_s=A100_ROWS_PER_S * SPEED[acc], cold_start_s=COLD_START_S[cloud],
                max_workers=64)


def aws_pools(cat: Catalog) -> list[Pool]:
    return [
        _pool(cat, "l40s-use1-od", "aws", "us-east-1", "L40S", spot=False, itype="g6e.xlarge"),
        _pool(cat, "a10g-use1-od", "aws", "us-east-1", "A10G", spot=False),
        _pool(cat, "l4-use1-od", "aws", "us-east-1", "L4", spot=False),
        _pool(cat, "l40s-use2-spot", "aws", "us-east-2", "L40S", spot=True, itype="g6e.xlarge"),
        _pool(cat, "l40s-usw2-spot", "aws", "us-west-2", "L40S", spot=True, itype="g6e.xlarge"),
        _pool(cat, "a10g-use2-spot", "aws", "us-east-2", "A10G", spot=True),
        _pool(cat, "l4-usw2-spot", "aws", "us-west-2", "L4", spot=True),
    ]


def gcp_pools(cat: Catalog) -> list[Pool]:
    return [
        _pool(cat, "a100-euw4-od", "gcp", "europe-west4", "A100", spot=False),
        _pool(cat, "a100-usc1-od", "gcp", "us-central1", "A100", spot=False),
        _pool(cat, "a100-usc1a-spot", "gcp", "us-central1", "A100", spot=True),
        _pool(cat, "a100-usc1b-spot", "gcp", "us-central1", "A100", spot=True),
        _pool(cat, "a100-euw4-spot", "gcp", "europe-west4", "A100", spot=True),
        _pool(cat, "a100-use1-spot", "gcp", "us-east1", "A100", spot=True),
        _pool(cat, "a100-usw1-spot", "gcp", "us-west1", "A100", spot=True),
    ]


def workload(steps: int, train_s: float, trainer_price: float) -> Workload:
    return Workload(batch_rows=256, batches_per_step=4, train_s=train_s, max_backlog_batches=16,
                    steps=steps, deadline_s=steps * train_s * 1.5,
                    trainer_price_per_hour=trainer_price, trainer_gpus=8)


def _traces(data: Path, mapping: dict[str, tuple[str, int]], pools: list[Pool],
            seed: int) -> dict[str, SpotTrace]:
    """Each spot pool's trace; seed 0 starts every trace at its first tick, another seed
    at a tick drawn for each trace (a different window of the same record)."""
    rng = random.Random(seed)
    out = {}
    for p in pools:
        if p.name in mapping:
            path, scale = mapping[p.name]
            tr = load_trace(data / path, scale=scale)
            out[p.name] = tr.with_(offset=rng.randrange(len(tr.values))) if seed else tr
    return out


def _case(label: str, name: str, data: Path, pools: list[Pool], work: Workload,
          mapping: dict[str, tuple[str, int]], seed: int) -> Case:
    traces = _traces(data, mapping, pools, seed)
    scn = Scenario(name, work, tuple(pools), traces, interval_s=60.0, window_s=300.0, seed=seed)
    od = min((p for p in pools if not p.spot), key=lambda p: p.price_per_hour / p.rows_per_s)
    return Case(label, scn, od.name, tuple(
        f"{k} <- {v.name} (x{v.scale} workers per trace unit, {v.gap_s:.0f} s ticks"
        + (f", from tick {v.offset}" if v.offset else "") + ")" for k, v in traces.items()))


def cases(data: Path, steps: int, only: str | None = None,
          which: str = "all") -> tuple[list[Case], float]:
    """The tuning scenario and the held-out ones (`which`: "old"), the fresh ones
    ("fresh"), the second and third fresh ones ("fresh2", "fresh3") or all of them, those whose name contains `only`; and the trainer's $/h
    (one p4d.24xlarge, 8 x A100 on demand, under every policy)."""
    if which not in SETS:
        raise ValueError(f"scenario set must be one of {', '.join(SETS)}, got {which!r}")
    cat = load_catalog(data)
    trainer_price = cat.price("aws", "us-east-1", "A100", 8, spot=False) or 0.0
    aws, gcp = aws_pools(cat), gcp_pools(cat)
    work = workload(steps, TRAIN_S, trainer_price)
    out = [_case("tune", "aws+gcp", data, aws + gcp, work, MAP_A, 0)]
    out += [_case("held-out", f"aws+gcp, windows s={s}", data, aws + gcp, work, MAP_A, s)
            for s in (1, 2, 3)]
    out += [
        _case("held-out", "aws+gcp, other zones", data, aws + gcp, work, MAP_B, 0),
        _case("held-out", "aws only", data, aws, work, MAP_A, 0),
        _case("held-out", "gcp only", data, gcp, work, MAP_A, 0),
        _case("held-out", "aws+gcp, trainer x2", data, aws + gcp,
              replace(work, train_s=TRAIN_S / 2, deadline_s=steps * TRAIN_S / 2 * 1.5),
              MAP_A, 0),
        _case("held-out", "aws+gcp, trainer x0.5", data, aws + gcp,
              replace(work, train_s=TRAIN_S * 2, deadline_s=steps * TRAIN_S * 2 * 1.5),
              MAP_A, 0),
    ]
    if which in ("fresh", "fresh2", "fresh3"):
        out = []
    if which in ("all", "fresh"):
        out += [_case("fresh", f"aws+gcp, windows s={s}", data, aws + gcp, work, MAP_A, s)
                for s in (4, 5, 6, 7, 8, 9)]
        out += [_case("fresh", "aws+gcp, zones C", data, aws + gcp, work, MAP_C, 0)]
    if which in ("all", "fresh2"):
        out += [_case("fresh2", f"aws+gcp, windows s={s}", data, aws + gcp, work, MAP_A, s)
                for s in range(10, 16)]
        out += [_case("fresh2", "aws+gcp, zones D", data, aws + gcp, work, MAP_D, 0)]
    if which in ("all", "fresh3"):
        out += [_case("fresh3", f"aws+gcp, windows s={s}", data, aws + gcp, work, MAP_A, s)
                for s in range(16, 22)]
        out += [_case("fresh3", "aws+gcp, zones E", data, aws + gcp, work, MAP_E, 0)]
    return [c for c in out if only is None or only in c.name], trainer_price
