"""Spot and on-demand prices per cloud, region and accelerator.

Two sources, one shape (`PriceRow`):
  * SkyPilot's own catalog, where SkyPilot has fetched it: `~/.sky/catalogs/v8/<cloud>/vms.csv`
    (columns InstanceType, AcceleratorName, AcceleratorCount, Price, SpotPrice, Region,
    AvailabilityZone); read as CSV, so `import sky` is not needed;
  * a CSV you give, in that form or in ours:
    `cloud,instance_type,accelerator,accelerator_count,region,zone,price_ondemand_hr,
    price_spot_hr,price_basis` (what `../shared/data/gpu_prices.csv` holds).

GCP's catalog prices a GPU apart from its host VM (`price_basis: accelerator_only`);
`Catalog.price` says so in `basis` and never adds a host price it does not have. A
spot price equal to on-demand is kept (SkyPilot caps spot at on-demand where there
is no discount); an empty cell is None. Egress $/GB (`Catalog.egress`, egress.py):
the shipped list prices with their sources and dates, unless a table is given.
"""

from __future__ import annotations

import csv
import os
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from astraflow.policies.egress import EgressPrice, EgressTable, default_egress

SKY_CATALOG = Path("~/.sky/catalogs/v8")
SKY_CLOUDS = ("aws", "gcp", "azure", "lambda", "runpod")


@dataclass(frozen=True)
class PriceRow:
    cloud: str
    region: str
    zone: str
    instance_type: str
    accelerator: str
    accelerator_count: int
    ondemand: float | None  # $/h
    spot: float | None  # $/h
    basis: str = "instance"  # instance | accelerator_only | ...
    vcpus: float | None = None  # SkyPilot's form only
    memory_gib: float | None = None


def _num(s: str | None) -> float | None:
    s = (s or "").strip()
    return float(s) if s else None


def _count(s: str | None) -> int:
    s = (s or "").strip()
    return int(float(s)) if s else 0


def read_csv(path: str | Path, cloud: str | None = None, *,
             cpu: bool = False) -> list[PriceRow]:
    """Rows of a price CSV in our form or SkyPilot's `vms.csv` form (then `cloud` names
    the cloud, default: the name of the file's folder). Rows without an accelerator
    (CPU VMs, GCP host VMs in SkyPilot's form) are skipped unless `cpu` (SkyPilot's form:
    then they come with accelerator "" and count 0, for pricing CPU machines)."""
    path = Path(path)
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        cols = set(reader.fieldnames or [])
        rows: list[PriceRow] = []
        if {"price_ondemand_hr", "price_spot_hr"} <= cols:
            for r in reader:
                if not r.get("accelerator"):
                    continue
                rows.append(PriceRow(r["cloud"], r["region"], r.get("zone", ""),
                                     r.get("instance_type", ""), r["accelerator"],
                                     _count(r.get("accelerator_count")) or 1,
                                     _num(r["price_ondemand_hr"]), _num(r["price_spot_hr"]),
                                     r.get("price_basis") or "instance"))
        elif {"AcceleratorName", "Price", "SpotPrice", "Region"} <= cols:
            cl = cloud or path.parent.name
            for r in reader:
                name = r.get("AcceleratorName") or ""
                itype = r.get("InstanceType", "")
                if not name and not (cpu and itype):
                    continue
                rows.append(PriceRow(cl, r["Region"], r.get("AvailabilityZone", ""), itype,
                                     name, (_count(r.get("AcceleratorCount")) or 1) if name else 0,
                                     _num(r["Price"]), _num(r["SpotPrice"]),
                                     "instance" if itype else "accelerator_only",
                                     _num(r.get("vCPUs")), _num(r.get("MemoryGiB"))))
        else:
            raise ValueError(f"{path}: not a price CSV (want columns cloud, region, accelerator, "
                             f"price_ondemand_hr, price_spot_hr, or SkyPilot's vms.csv columns); "
                             f"got {sorted(cols)}")
    return rows


class Catalog:
    """Price rows with look-ups by (cloud, region, accelerator, count, spot)."""

    def __init__(self, rows: Iterable[PriceRow], source: str = "",
                 egress: EgressTable | None = None):
        self.rows = list(rows)
        self.source = source
        self.egress = egress if egress is not None else default_egress()
        if not self.rows:
            raise ValueError(f"no GPU price rows in {source or 'the given rows'}")

    def __len__(self) -> int:
        return len(self.rows)

    def select(self, *, cloud: str | None = None, region: str | None = None,
               accelerator: str | None = None, count: int | None = None,
               instance_type: str | None = None) -> list[PriceRow]:
        return [r for r in self.rows
                if (cloud is None or r.cloud == cloud) and (region is None or r.region == region)
                and (accelerator is None or r.accelerator == accelerator)
                and (count is None or r.accelerator_count == count)
                and (instance_type is None or r.instance_type == instance_type)]

    def price(self, cloud: str, region: str, accelerator: str, count: int = 1, *,
              spot: bool, instance_type: str | None = None, how: str = "min") -> float | None:
        """$/h in that region: the cheapest zone (`how="min"`, what SkyPilot would pick)
        or the median zone. None when no zone has a price."""
        vals = [v for r in self.select(cloud=cloud, region=region, accelerator=accelerator,
                                       count=count, instance_type=instance_type)
                if (v := (r.spot if spot else r.ondemand)) is not None]
        if not vals:
            return None
        return min(vals) if how == "min" else statistics.median(vals)

    def egress_price(self, src_cloud: str, src_region: str, dst_cloud: str,
                     dst_region: str) -> EgressPrice:
        """$/GB the sending cloud bills for bytes from one region to another
        (`EgressTable.price`)."""
        return self.egress.price(src_cloud, src_region, dst_cloud, dst_region)

    def regions(self, cloud: str, accelerator: str, count: int = 1) -> list[str]:
        return sorted({r.region for r in self.select(cloud=cloud, accelerator=accelerator,
                                                     count=count)})


def sky_catalog_dir() -> Path:
    return Path(os.environ.get("ASTRAFLOW_SKY_CATALOG", SKY_CATALOG)).expanduser()


def load_prices(path: str | Path | None = None, *, cpu: bool = False) -> Catalog:
    """Prices from `path` (a CSV), else from SkyPilot's fetched catalog
    (`~/.sky/catalogs/v8/*/vms.csv`, or `$ASTRAFLOW_SKY_CATALOG`); `cpu`: CPU machines
    too (read_csv)."""
    if path is not None:
        return Catalog(read_csv(path, cpu=cpu), str(path))
    root = sky_catalog_dir()
    files = [root / c / "vms.csv" for c in SKY_CLOUDS if (root / c / "vms.csv").exists()]
    if not files:
        raise FileNotFoundError(
            f"no SkyPilot price catalog under {root} (SkyPilot fetches it on first use, e.g. "
            f"`sky show-gpus`); or give a price CSV (--prices FILE, columns: cloud, region, "
            f"accelerator, accelerator_count, price_ondemand_hr, price_spot_hr)")
    rows: list[PriceRow] = []
    for f in files:
        rows += read_csv(f, cloud=f.parent.name, cpu=cpu)
    return Catalog(rows, str(root))
