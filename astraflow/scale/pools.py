"""The pools a cloud run can scale into: its flow's `launch.rollout` pools, priced.

A sky pool becomes one `Pool` per (accelerator, infra) it lists, spot as the flow says,
plus an on-demand twin of each spot one (the floor a cost-aware policy falls back on).
A Modal pool is one `Pool` (Modal places containers itself). Prices come from the
SkyPilot catalog or a CSV (`astraflow.policies.load_prices`); a pool with no price
in it is refused, naming it, rather than treated as free. Where the flow names its
store's region (`launch.store_region`), each sky pool carries the egress $/GB between
it and the store, and the run's `Traffic` (`launch.traffic`) goes to the policy, so
`cost` counts the bytes; a Modal pool's region is Modal's, and its egress is not priced.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from astraflow.cloud.egress import traffic
from astraflow.policies import Catalog, Pool, Traffic, load_prices


def _slug(*parts: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", "-".join(p for p in parts if p).lower()).strip("-")[:40]


def cloud_pools(flow, backend: str, *, prices: str | Path | None = None,
                max_workers: int = 8, catalog: Catalog | None = None) -> list[Pool]:
    specs = [p for p in (flow.launch.rollout if flow.launch else []) if p.backend == backend]
    if not specs:
        raise ValueError(f"the flow's launch.rollout has no {backend} pool to scale "
                         f"(add one: {{name: x, backend: {backend}, ...}})")
    cat = catalog or load_prices(prices)
    out: list[Pool] = []
    for spec in specs:
        accs = spec.accelerators or ["L4:1"]
        infras = spec.infra or ([f"modal/{spec.region}" if spec.region else "modal"]
                                if backend == "modal" else ["aws"])
        for acc in accs:
            name, _, n = acc.partition(":")
            count = int(float(n)) if n else 1
            for infra in infras:
                cloud, _, rest = infra.partition("/")
                region = rest.split("/")[0]
                for spot in ([spec.spot, False] if spec.spot and backend == "sky" else [spec.spot]):
                    rows = cat.select(cloud=cloud, region=region or None, accelerator=name,
                                      count=count)
                    vals = [v for r in rows if (v := (r.spot if spot else r.ondemand)) is not None]
                    if not vals:
                        raise ValueError(f"no {'spot' if spot else 'on-demand'} price for "
                                         f"{cloud} {region or '(any region)'} {acc} in "
                                         f"{cat.source}: give a price CSV (--prices)")
                    out.append(Pool(_slug(spec.name, name, region, "" if spot else "od"),
                                    backend=backend, cloud=cloud, region=region,
                                    accelerator=name, accelerator_count=count, spot=spot,
                                    price_per_hour=min(vals), max_workers=max_workers,
                                    cold_start_s=spec.cold_start_s,
                                    **_egress(flow, cat, spec, backend, cloud, region)))
    return out


def _egress(flow, cat: Catalog, spec, backend: str, cloud: str, region: str) -> dict:
    """A sky pool's egress prices to and from the store's region (none without
    `launch.store_region`); a pool whose infra names no region cannot be priced."""
    store = flow.launch.store_region if flow.launch else None
    if not store or backend != "sky":
        return {}
    if not region:
        raise ValueError(f"launch.rollout pool {spec.name!r}: infra {cloud!r} names no region, "
                         f"so its egress to the store ({store}) cannot be priced; name one "
                         f"(e.g. {cloud}/us-east-1) or drop launch.store_region")
    s_cloud, _, s_region = store.partition("/")
    out = cat.egress_price(s_cloud, s_region, cloud, region)
    back = cat.egress_price(cloud, region, s_cloud, s_region)
    for p in (out, back):
        if p.usd_per_gb is None:
            raise ValueError(f"launch.rollout pool {spec.name!r}: {p.why}")
    return {"weights_usd_per_gb": out.usd_per_gb, "rows_usd_per_gb": back.usd_per_gb,
            "replica": spec.region is not None}


def run_traffic(flow) -> Traffic:
    """The bytes the policy prices (`launch.traffic`), a worker reloading weights once
    per batch of `prompts_per_batch` x `samples_per_prompt` rows."""
    return replace(traffic(flow), worker_batch_rows=flow.rollout.prompts_per_batch
                   * flow.rollout.samples_per_prompt)
