"""Hourly price estimates of a launch plan, read from SkyPilot's catalog.

`astraflow launch --dry-run` shows what each job would cost per hour before anything
is rented: the cheapest placement SkyPilot could pick among a job's `any_of` entries
(SkyPilot itself picks the cheapest it can get), times its nodes and jobs. The prices
are SkyPilot's catalog CSVs (`~/.sky/catalogs/v8/<cloud>/vms.csv`, fetched by SkyPilot
on first use, or `$ASTRAFLOW_SKY_CATALOG`) read by `policies.prices`, so no SkyPilot
import and no network. An estimate, not a bill: disks and the jobs controller are not
in it; egress is where the flow names its store's region (`egress.py`); GCP's catalog
prices a GPU apart from its host VM (said so).
Modal calls are not in SkyPilot's catalog and are left out, by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from astraflow.policies.prices import Catalog, PriceRow

if TYPE_CHECKING:
    from collections.abc import Iterable

    from astraflow.cloud.jobs import SkyJob


@dataclass(frozen=True)
class JobPrice:
    """The estimate for one plan entry (all of its nodes and jobs)."""

    per_hour: float | None
    """$/h of the whole entry; None where the catalog has no price for any placement."""
    detail: str


def _at_least(spec: str | None, value: float | None) -> bool:
    """SkyPilot's `8` (exactly) / `8+` (at least) against a catalog value."""
    if not spec:
        return True
    if value is None:
        return False
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(\+?)", spec)
    if not m:
        return True  # SkyPilot validates the form; do not guess here
    want = float(m.group(1))
    return value >= want if m.group(2) else value == want


def _candidates(job: SkyJob, catalog: Catalog) -> list[tuple[float, PriceRow, str]]:
    node = dict(job.node_resources)
    out = []
    for entry in job.any_of or ({},):
        cloud, _, rest = (entry.get("infra") or "").partition("/")
        region = rest.split("/")[0] or None
        acc = entry.get("accelerators")
        if acc:
            name, _, n = acc.partition(":")
            rows = catalog.select(cloud=cloud or None, region=region, accelerator=name,
                                  count=int(float(n)) if n else 1,
                                  instance_type=node.get("instance_type"))
        else:
            rows = [r for r in catalog.select(cloud=cloud or None, region=region,
                                              instance_type=node.get("instance_type"))
                    if not r.accelerator and _at_least(node.get("cpus"), r.vcpus)
                    and _at_least(node.get("memory"), r.memory_gib)]
        for r in rows:
            value = r.spot if job.use_spot else r.ondemand
            if value is not None:
                out.append((value, r, acc or ""))
    return out


def price_job(job: SkyJob, catalog: Catalog) -> JobPrice:
    """The cheapest placement of `job` in `catalog`, times its nodes and jobs."""
    kind = "spot" if job.use_spot else "on-demand"
    found = _candidates(job, catalog)
    if not found:
        what = (", ".join(e.get("accelerators") or e.get("infra", "") for e in job.any_of)
                or ", ".join(f"{k} {v}" for k, v in job.node_resources) or "its resources")
        return JobPrice(None, f"no {kind} price for {what} in {catalog.source}")
    value, row, acc = min(found, key=lambda c: c[0])
    count = job.num_nodes * job.num_jobs
    where = " ".join(x for x in (row.cloud, row.region, row.instance_type, acc) if x)
    times = f"{job.num_nodes} node(s) x " if job.num_nodes > 1 else ""
    times += f"{job.num_jobs} job(s) x " if job.num_jobs > 1 else ""
    host = " + its host VM (GCP prices the GPU alone)" if row.basis == "accelerator_only" else ""
    return JobPrice(value * count, f"~${value * count:.2f}/h = {times}${value:.4g}/h{host} "
                                   f"(cheapest: {where}, {kind})")


def price_jobs(jobs: Iterable[SkyJob], catalog: Catalog) -> dict[str, JobPrice]:
    """Estimates keyed by SkyPilot job name (a plan's `sky_jobs`; Modal calls have none)."""
    return {j.name: price_job(j, catalog) for j in jobs}
