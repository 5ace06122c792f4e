"""What bytes crossing a region or cloud boundary cost, and how many a run moves.

Weights go from the store's region to every remote worker (or once per version to a
replica in the worker's region); trajectory rows come back to the store's region. The
cloud that sends the bytes bills them per GB: by region pair within a cloud, at its
internet rate when they leave for another cloud; within a region it is free (zone
crossings are not counted). The prices are public list prices, one row per (cloud,
from, to), each with its source page and the date it was taken as of
(`egress_prices.csv` beside this module; a row says where a figure is ASSUMED).

`Traffic` is one policy's side: a whole version's bytes in the served dtype, the
delta's share of it with `store.delta_chain`, rows' bytes. A worker holding version v
fetches the deltas after v, or the newest snapshot and its deltas once a snapshot
was published since (as `WeightStore.load` does); `fetch_bytes` is that count.
"""

from __future__ import annotations

import csv
import functools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PRICES_CSV = Path(__file__).with_name("egress_prices.csv")
GB = 1e9

#: Region-name prefixes per continent ("na", "eu", "asia", "oceania", "sa", "mea").
_PREFIXES = {
    "aws": (("us-", "na"), ("ca-", "na"), ("mx-", "na"), ("eu-", "eu"), ("sa-", "sa"),
            ("ap-southeast-2", "oceania"), ("ap-southeast-4", "oceania"), ("ap-", "asia"),
            ("me-", "mea"), ("af-", "mea"), ("il-", "mea")),
    "gcp": (("us-", "na"), ("northamerica-", "na"), ("europe-", "eu"), ("asia-", "asia"),
            ("australia-", "oceania"), ("southamerica-", "sa"), ("me-", "mea"),
            ("africa-", "mea")),
    "azure": (("australia", "oceania"), ("brazil", "sa"), ("canada", "na"), ("mexico", "na"),
              ("uk", "eu"), ("france", "eu"), ("germany", "eu"), ("norway", "eu"),
              ("sweden", "eu"), ("switzerland", "eu"), ("poland", "eu"), ("italy", "eu"),
              ("spain", "eu"), ("northeurope", "eu"), ("westeurope", "eu"),
              ("japan", "asia"), ("korea", "asia"), ("centralindia", "asia"),
              ("southindia", "asia"), ("westindia", "asia"), ("eastasia", "asia"),
              ("southeastasia", "asia"), ("uae", "mea"), ("qatar", "mea"),
              ("southafrica", "mea"), ("israel", "mea"), ("eastus", "na"), ("westus", "na"),
              ("centralus", "na"), ("northcentralus", "na"), ("southcentralus", "na"),
              ("westcentralus", "na")),
}


def continent(cloud: str, region: str) -> str:
    """The continent a region's name places it on; "" when the name is not known."""
    for prefix, where in _PREFIXES.get(cloud, ()):
        if region.startswith(prefix):
            return where
    return ""


@dataclass(frozen=True)
class EgressRow:
    """One list price: bytes leaving `cloud` from `src` for `dst`, $ per GB.

    `src`: a region or a continent; `dst`: a region, a continent, `*` (any other region
    of the same cloud) or `internet` (leaving the cloud, e.g. for another cloud)."""

    cloud: str
    src: str
    dst: str
    usd_per_gb: float
    as_of: str
    source: str
    note: str = ""


@dataclass(frozen=True)
class EgressPrice:
    usd_per_gb: float | None  # None: no row prices this path
    why: str  # the row's note and source, or why it is free or unknown


class EgressTable:
    """Egress list prices with a look-up from one (cloud, region) to another."""

    def __init__(self, rows: Iterable[EgressRow], source: str = ""):
        self.rows = list(rows)
        self.source = source

    def price(self, src_cloud: str, src_region: str, dst_cloud: str,
              dst_region: str) -> EgressPrice:
        """$ per GB that `src_cloud` bills for bytes from `src_region` to `dst_region`:
        0 within one region; the most specific row otherwise (a region beats a
        continent beats `*`); another cloud is the sender's `internet` row."""
        if src_cloud == dst_cloud and src_region == dst_region:
            return EgressPrice(0.0, "within one region: free (zone crossings not counted)")
        src_c = continent(src_cloud, src_region)
        leaving = src_cloud != dst_cloud
        dst_c = "" if leaving else continent(dst_cloud, dst_region)
        best: tuple[int, EgressRow] | None = None
        for r in self.rows:
            if r.cloud != src_cloud:
                continue
            s = 2 if r.src == src_region else 1 if r.src and r.src == src_c else \
                0 if r.src == "*" else -1
            if leaving:
                d = 1 if r.dst == "internet" else -1
            else:
                d = 3 if r.dst == dst_region else 2 if r.dst and r.dst == dst_c else \
                    1 if r.dst == "*" else -1
            if s < 0 or d < 0:
                continue
            score = s * 4 + d
            if best is None or score > best[0]:
                best = (score, r)
        where = f"{src_cloud}/{src_region} -> {dst_cloud}/{dst_region}"
        if best is None:
            return EgressPrice(None, f"no egress price for {where} in {self.source}")
        r = best[1]
        return EgressPrice(r.usd_per_gb, f"{where}: ${r.usd_per_gb:g}/GB ({r.note}; "
                                         f"{r.source}, as of {r.as_of})")


def read_egress(path: str | Path) -> EgressTable:
    """An egress table from a CSV: cloud, from, to, usd_per_gb, as_of, source[, note].
    A row without a source or a date is refused: a price must say where it is from."""
    path = Path(path)
    rows = []
    with path.open(newline="") as f:
        for i, r in enumerate(csv.DictReader(f), start=2):
            if not (r.get("source") or "").strip() or not (r.get("as_of") or "").strip():
                raise ValueError(f"{path}:{i}: an egress price needs its source and as_of date")
            rows.append(EgressRow(r["cloud"], r["from"], r["to"], float(r["usd_per_gb"]),
                                  r["as_of"], r["source"], r.get("note") or ""))
    return EgressTable(rows, str(path))


@functools.cache
def default_egress() -> EgressTable:
    """The list prices shipped beside this module (`egress_prices.csv`)."""
    return read_egress(PRICES_CSV)


@dataclass(frozen=True)
class Traffic:
    """What one policy's run moves across boundaries (0 bytes: nothing counted)."""

    version_bytes: float = 0.0  # one whole version in the dtype the workers serve
    delta_ratio: float | None = None  # a delta's bytes over a whole version; None: whole
    delta_chain: int = 8  # store.delta_chain: deltas in a row before a whole snapshot
    row_bytes: float = 0.0  # one trajectory row as the store holds it
    versions_per_hour: float | None = None  # the publishing rate expected, until measured
    worker_batch_rows: int = 0  # rows a worker gives between weight reloads (0: every version)

    @property
    def delta_bytes(self) -> float:
        return self.version_bytes * self.delta_ratio if self.delta_ratio is not None \
            else self.version_bytes

    def snapshot(self, version: int) -> bool:
        """Whether `version` is published whole (version 0 and every `delta_chain` + 1)."""
        return self.delta_ratio is None or version % (self.delta_chain + 1) == 0

    def stored_bytes(self, version: int) -> float:
        """Bytes published for `version` (what a replica receives)."""
        return self.version_bytes if self.snapshot(version) else self.delta_bytes

    def fetch_bytes(self, held: int | None, newest: int) -> float:
        """Bytes a worker holding `held` (None: nothing) fetches to hold `newest`."""
        if held is not None and held >= newest:
            return 0.0
        if self.delta_ratio is None:
            return self.version_bytes
        base = newest - newest % (self.delta_chain + 1)
        if held is not None and held >= base:
            return (newest - held) * self.delta_bytes
        return self.version_bytes + (newest - base) * self.delta_bytes

    def mean_stored_bytes(self) -> float:
        """Bytes per version over a chain: one snapshot and `delta_chain` deltas."""
        if self.delta_ratio is None:
            return self.version_bytes
        return (self.version_bytes + self.delta_chain * self.delta_bytes) / (self.delta_chain + 1)

    def worker_bytes_per_hour(self, versions_per_hour: float, reloads_per_hour: float) -> float:
        """Bytes a remote worker fetches per hour, reloading `reloads_per_hour` times
        while `versions_per_hour` are published: a whole version per reload, or every
        delta and every snapshot published, whichever is fewer."""
        whole = min(versions_per_hour, reloads_per_hour) * self.version_bytes
        if self.delta_ratio is None:
            return whole
        return min(whole, versions_per_hour * self.mean_stored_bytes())
