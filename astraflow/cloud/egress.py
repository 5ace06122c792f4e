"""The launch estimate's egress: what the bytes crossing to each placement cost per hour.

Weights go from the store's region to every rollout worker placed elsewhere (once per
version to a pool's replica instead, where the pool names one) and from each trainer
to the store; rows go from the workers to the store and from the store to the
trainers. Each crossing is priced per GB by the sending cloud's list price
(`astraflow.policies.egress`), from `launch.store_region` and `launch.traffic`.
SkyPilot picks a job's placement by its hourly price alone, so a placement whose GPUs
are cheaper may cost more once its bytes cross an ocean: each job shows the egress of
SkyPilot's pick, and, where another of its placements is cheaper with egress counted,
that one and how to pin it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from astraflow.cloud.prices import _candidates
from astraflow.policies.egress import GB, Traffic

if TYPE_CHECKING:
    from astraflow.cloud.jobs import SkyJob
    from astraflow.cloud.plan import LaunchPlan
    from astraflow.config.flow import FlowSpec
    from astraflow.policies.prices import Catalog


def traffic(flow: FlowSpec) -> Traffic:
    """One policy's bytes: whole versions, or deltas where `store.delta_chain` > 0."""
    t = flow.launch.traffic if flow.launch else None
    if t is None:
        return Traffic()
    chain = flow.store.delta_chain
    return Traffic(version_bytes=t.version_gb * GB, delta_ratio=t.delta_ratio if chain else None,
                   delta_chain=chain or 8, row_bytes=t.row_kb * 1e3,
                   versions_per_hour=t.versions_per_hour)


class _Egress:
    """$/h of the crossings of one plan's jobs, by placement."""

    def __init__(self, plan: LaunchPlan, catalog: Catalog):
        flow = plan.flow
        cloud, _, region = (flow.launch.store_region or "").partition("/")
        self.store = (cloud, region)
        self.catalog = catalog
        self.spec = flow.launch.traffic
        self.tr = traffic(flow)
        self.policies = len(flow.policy_names())
        self.pools = {p.name: p for p in flow.launch.rollout}
        workers = sum(p.workers for p in flow.launch.rollout)
        self.rows_per_worker = self.spec.rows_per_hour * self.policies / max(workers, 1)

    def _price(self, src: tuple[str, str], dst: tuple[str, str]) -> float | None:
        return self.catalog.egress_price(*src, *dst).usd_per_gb

    def worker(self, place: tuple[str, str], replica: bool) -> tuple[float | None, str]:
        """$/h one worker at `place` adds, and what it is made of."""
        out, back = self._price(self.store, place), self._price(place, self.store)
        if out is None or back is None:
            return None, f"no egress price between {'/'.join(self.store)} and {'/'.join(place)}"
        w_gb = 0.0 if replica else self.policies * self.tr.worker_bytes_per_hour(
            self.spec.versions_per_hour, self.spec.reloads_per_hour) / GB
        r_gb = self.rows_per_worker * self.tr.row_bytes / GB
        usd = w_gb * out + r_gb * back
        return usd, (f"weights {w_gb:.1f} GB/h at ${out:g}/GB" if not replica else
                     "weights from its replica") + f", rows {r_gb:.2f} GB/h at ${back:g}/GB"

    def replica(self, place: tuple[str, str]) -> float | None:
        """$/h of mirroring every version into a replica at `place`."""
        out = self._price(self.store, place)
        if out is None:
            return None
        return out * self.policies * self.spec.versions_per_hour * self.tr.mean_stored_bytes() / GB

    def trainer(self, place: tuple[str, str]) -> float | None:
        """$/h of one trainer at `place`: its versions out, its policy's rows in."""
        out, back = self._price(place, self.store), self._price(self.store, place)
        if out is None or back is None:
            return None
        return (out * self.spec.versions_per_hour * self.tr.mean_stored_bytes()
                + back * self.spec.rows_per_hour * self.tr.row_bytes) / GB

    def job(self, job: SkyJob) -> tuple[float | None, list[str]]:
        """$/h at SkyPilot's pick (the cheapest by its hourly price) and the lines."""
        found = _candidates(job, self.catalog)
        if not found:
            return None, []
        count = job.num_nodes * job.num_jobs
        spec = self.pools.get(job.pool or "")
        rep = bool(spec and spec.region)
        scored = []
        for gpu, row, acc in found:
            place = (row.cloud, row.region)
            if job.role == "trainer":
                eg, why = self.trainer(place), "versions out, rows in"
                eg = None if eg is None else eg / count  # one trainer per job, not per node
            else:
                eg, why = self.worker(place, rep)
            scored.append((gpu, eg, why, place, acc))
        gpu, eg, why, place, acc = min(scored, key=lambda c: c[0])
        where = "/".join(place)
        if eg is None:
            return None, [f"    egress:    {why} (not estimated)"]
        lines = [f"    egress:    ~${eg * count:.2f}/h at {where} ({why})"]
        known = [c for c in scored if c[1] is not None]
        best = min(known, key=lambda c: c[0] + c[1])
        if best[0] + best[1] < gpu + eg - 1e-9:
            lines.append(f"    cheaper with egress: {'/'.join(best[3])} {best[4]} "
                         f"${best[0]:.4g}/h + ${best[1]:.4g}/h egress a worker, against "
                         f"{where} ${gpu:.4g}/h + ${eg:.4g}/h: SkyPilot picks by GPU price "
                         f"alone; pin infra to {'/'.join(best[3])}")
        return eg * count, lines


def egress_lines(plan: LaunchPlan, catalog: Catalog) -> tuple[dict[str, list[str]], list[str],
                                                              float]:
    """Per job name its egress lines, the plan-wide lines (replicas, totals) and the
    $/h of egress at SkyPilot's picks. Empty without `launch.store_region`."""
    launch = plan.flow.launch
    if launch is None or not launch.store_region:
        return {}, [], 0.0
    e = _Egress(plan, catalog)
    per_job: dict[str, list[str]] = {}
    total, missing, reps = 0.0, [], {}
    for j in plan.sky_jobs:
        usd, lines = e.job(j)
        per_job[j.name] = lines
        if usd is None:
            missing.append(j.name)
        else:
            total += usd
        spec = e.pools.get(j.pool or "")
        found = _candidates(j, catalog) if spec and spec.region else []
        if found:  # the replica sits where the pool's workers land
            row = min(found, key=lambda c: c[0])[1]
            reps.setdefault(spec.region, (row.cloud, row.region))
    out = []
    for name, place in reps.items():
        usd = e.replica(place)
        if usd is None:
            missing.append(f"replica {name}")
            continue
        total += usd
        out.append(f"  replica {name} at {'/'.join(place)}: ~${usd:.2f}/h egress (every version "
                   f"mirrored, {e.tr.mean_stored_bytes() / GB:.2f} GB a version on average)")
    how = ("deltas" if e.tr.delta_ratio is not None else "whole versions")
    out.insert(0, f"egress from store {launch.store_region}: ~${total:.2f}/h ({how}, "
                  f"{launch.traffic.version_gb:g} GB a whole version; list prices in "
                  f"{catalog.egress.source})" + (f"; not priced: {', '.join(missing)}"
                                                 if missing else ""))
    return per_job, out, total
