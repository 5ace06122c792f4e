"""Ledger and metrics: the two append-only tables every component can read.

The ledger proves exactly-once consumption: each trainer step records the
version range of its trajectory table it consumed and what became of those
rows (used, dropped as stale, filtered). Ranges of consecutive steps must tile
the table's history with no gap and no overlap — `check_ledger` verifies that.

Metrics are long-format (component, policy, step, name, value) so that
`status`, plots and scaling policies all read one source without schema churn.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa

from astraflow.stores import _lance

LEDGER_SCHEMA = pa.schema(
    [
        pa.field("policy", pa.string(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("cursor_start", pa.int64(), nullable=False),
        pa.field("cursor_end", pa.int64(), nullable=False),
        pa.field("rows_read", pa.int64(), nullable=False),
        pa.field("rows_used", pa.int64(), nullable=False),
        pa.field("rows_stale", pa.int64(), nullable=False),
        pa.field("rows_filtered", pa.int64(), nullable=False),
        pa.field("optimizer_step", pa.bool_(), nullable=False),
        pa.field("weight_version", pa.int64(), nullable=False),
        pa.field("time", pa.float64(), nullable=False),
    ]
)

METRICS_SCHEMA = pa.schema(
    [
        pa.field("time", pa.float64(), nullable=False),
        pa.field("component", pa.string(), nullable=False),
        pa.field("policy", pa.string(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
    ]
)


@dataclass(frozen=True)
class LedgerEntry:
    policy: str
    step: int
    cursor_start: int
    cursor_end: int
    rows_read: int
    rows_used: int
    rows_stale: int
    rows_filtered: int
    optimizer_step: bool
    weight_version: int
    time: float = 0.0


@dataclass(frozen=True)
class Progress:
    """A consumer's position, mirrored from its newest ledger row into one small file.

    Rollout workers poll it many times a second for backpressure; reading one
    small file costs far less than scanning the ledger table. The ledger stays
    the source of truth (the trainer rewrites this after every ledger row).
    """

    policy: str
    step: int
    cursor: int
    rows_consumed: int
    weight_version: int
    time: float


class Ledger:
    """The `ledger` and `metrics` tables of one store location."""

    def __init__(self, uri: str | Path, storage_options: dict[str, str] | None = None):
        self._progress_dir = Path(str(uri)) / "_progress"
        self._db = _lance.connect(uri, storage_options)
        self.ledger = _lance.open_or_create(self._db, "ledger", LEDGER_SCHEMA)
        self.metrics = _lance.open_or_create(self._db, "metrics", METRICS_SCHEMA)

    def record(self, entry: LedgerEntry) -> None:
        if entry.rows_read != entry.rows_used + entry.rows_stale + entry.rows_filtered:
            raise ValueError(
                f"ledger entry for step {entry.step} does not add up: read {entry.rows_read} "
                f"!= used {entry.rows_used} + stale {entry.rows_stale} + filtered {entry.rows_filtered}"
            )
        row = asdict(entry)
        row["time"] = row["time"] or time.time()
        _lance.append(self.ledger, pa.Table.from_pylist([row], schema=LEDGER_SCHEMA))

    def write_progress(self, p: Progress) -> None:
        self._progress_dir.mkdir(parents=True, exist_ok=True)
        path = self._progress_dir / f"{p.policy}.json"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(p)))
        os.replace(tmp, path)  # readers see the old or the new file, never half of one

    def progress(self, policy: str) -> Progress | None:
        try:
            return Progress(**json.loads((self._progress_dir / f"{policy}.json").read_text()))
        except FileNotFoundError:
            return None

    def entries(self, policy: str | None = None) -> list[LedgerEntry]:
        ds = _lance.latest_dataset(self.ledger)
        flt = None if policy is None else f"policy = '{_sql_str(policy)}'"
        rows = ds.to_table(filter=flt).to_pylist()
        return sorted((LedgerEntry(**r) for r in rows), key=lambda e: (e.policy, e.step))

    def last_entry(self, policy: str) -> LedgerEntry | None:
        """The newest step of `policy` (its cursor is what consumers compare to)."""
        entries = self.entries(policy)
        return entries[-1] if entries else None

    def log(self, component: str, policy: str, step: int, values: dict[str, float]) -> None:
        now = time.time()
        rows = [
            {"time": now, "component": component, "policy": policy, "step": step,
             "name": k, "value": float(v)}
            for k, v in values.items()
        ]
        _lance.append(self.metrics, pa.Table.from_pylist(rows, schema=METRICS_SCHEMA))

    def read_metrics(self, *, since: float = 0.0, names: list[str] | None = None) -> pa.Table:
        ds = _lance.latest_dataset(self.metrics)
        flt = f"time > {since!r}"
        if names:
            flt += " AND name IN (" + ", ".join(f"'{_sql_str(n)}'" for n in names) + ")"
        return ds.to_table(filter=flt)

    def maintain(self) -> None:
        _lance.maintain(self.ledger)
        _lance.maintain(self.metrics)


def _sql_str(s: str) -> str:
    return s.replace("'", "''")


def check_ledger(entries: list[LedgerEntry], first_cursor: int = 0) -> list[str]:
    """Problems with one policy's ledger: gaps, overlaps, bad arithmetic."""
    problems: list[str] = []
    cursor = first_cursor
    for e in sorted(entries, key=lambda e: e.step):
        if e.cursor_start != cursor:
            kind = "gap" if e.cursor_start > cursor else "overlap"
            problems.append(f"step {e.step}: {kind}: starts at {e.cursor_start}, previous ended at {cursor}")
        if e.cursor_end < e.cursor_start:
            problems.append(f"step {e.step}: range ({e.cursor_start}, {e.cursor_end}] is reversed")
        if e.rows_read != e.rows_used + e.rows_stale + e.rows_filtered:
            problems.append(f"step {e.step}: rows do not add up")
        cursor = e.cursor_end
    return problems
