"""Ledger and metrics: the two append-only tables every component can read.

The ledger proves exactly-once consumption: each trainer step records the
version range of its trajectory table it consumed and what became of those
rows (used, dropped as stale, filtered). Ranges of consecutive steps must tile
the table's history with no gap and no overlap — `check_ledger` verifies that.

A trainer killed after its last checkpoint loses the steps since; it appends a
`rollback` row naming the first lost step, which voids every earlier row of that
step or later, and trains those rows again. `replay` applies rollbacks in commit
order and yields the effective ledger, so "trained exactly once" means once in it.

Metrics are long-format (component, policy, step, name, value) so that
`status`, plots and scaling policies all read one source without schema churn.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa

from astraflow.stores import _lance, retry
from astraflow.stores.objects import ObjectStore
from astraflow.stores.read import Cursor, Held, read_after, sql_str
from astraflow.stores.schema import CREATED_AT_VERSION

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
        pa.field("kind", pa.string(), nullable=False),
    ]
)

STEP, ROLLBACK = "step", "rollback"

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
    kind: str = STEP
    """`step`, or `rollback`: every earlier row of this step or later is void."""


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
    """The `ledger` and `metrics` tables and the progress files of one store location."""

    def __init__(self, uri: str | Path, *, retry_budget_s: float = retry.DEFAULT_BUDGET_S):
        self.uri = str(uri)
        self.budget_s = retry_budget_s
        self._objects = ObjectStore(uri, retry_budget_s=retry_budget_s)
        self._db = _lance.connect(uri, retry_budget_s)
        self.ledger = _lance.open_or_create(self._db, "ledger", LEDGER_SCHEMA, retry_budget_s)
        self.metrics = _lance.open_or_create(self._db, "metrics", METRICS_SCHEMA, retry_budget_s)
        self.metrics_every_s = 0.0
        """Metrics rows are committed at most once per this many seconds (0: each
        `log` commits; the first `log` after a quiet spell commits at once). A trainer
        or worker logging every step sets it (the flow's `store.metrics_every_s`) inside
        its loop and calls `flush_due` when it idles, `flush_metrics` when it stops. Why:
        each commit is a fragment every reader of the table (the dashboard, the sinks)
        opens; at several steps a second, one commit per step made metrics the
        dashboard's largest cost (0.6 ms per fragment read). A SIGKILL loses at most
        the last interval's metrics; the ledger rows that hold the exactly-once record
        are never buffered."""
        self._pending: list[dict] = []
        self._flushed_at = 0.0  # the first row after a quiet spell commits at once

    def _read(self, fn, what: str):
        return retry.call(fn, what=f"{what} at {self.uri}", budget_s=self.budget_s)

    def record(self, entry: LedgerEntry) -> None:
        if entry.rows_read != entry.rows_used + entry.rows_stale + entry.rows_filtered:
            raise ValueError(
                f"ledger entry for step {entry.step} does not add up: read {entry.rows_read} "
                f"!= used {entry.rows_used} + stale {entry.rows_stale} + filtered {entry.rows_filtered}"
            )
        row = asdict(entry)
        row["time"] = row["time"] or time.time()
        _lance.append(self.ledger, pa.Table.from_pylist([row], schema=LEDGER_SCHEMA),
                      where=self.uri, budget_s=self.budget_s)

    def rollback(self, policy: str, *, first_void_step: int, cursor: int, weight_version: int) -> None:
        """Void every recorded step >= `first_void_step` (lost with the process)."""
        self.record(LedgerEntry(
            policy=policy, step=first_void_step, cursor_start=cursor, cursor_end=cursor,
            rows_read=0, rows_used=0, rows_stale=0, rows_filtered=0, optimizer_step=False,
            weight_version=weight_version, kind=ROLLBACK))

    def write_progress(self, p: Progress) -> None:
        # Readers see the old or the new file, never half of one.
        self._objects.put_bytes(f"_progress/{p.policy}.json", json.dumps(asdict(p)).encode())

    def progress(self, policy: str) -> Progress | None:
        """The consumer's newest position, or None before its first step.

        A torn file (seen when an S3-compatible server stored half of a PUT that
        was cut off by an outage) is read again: the trainer rewrites it every step.
        """
        rel = f"_progress/{policy}.json"

        def read() -> Progress | None:
            try:
                return Progress(**json.loads(self._objects.get_bytes(rel)))
            except FileNotFoundError:
                return None

        return retry.call(read, what=f"reading {rel} at {self.uri}", budget_s=self.budget_s,
                          retry_if=lambda e: retry.transient(e) or isinstance(e, json.JSONDecodeError))

    def history(self, policy: str | None = None) -> list[LedgerEntry]:
        """Every ledger row, rollbacks included, in commit order."""
        flt = None if policy is None else f"policy = '{sql_str(policy)}'"

        def read() -> pa.Table:
            ds = _lance.latest_dataset(self.ledger)
            return ds.to_table(filter=flt, columns=[*LEDGER_SCHEMA.names, CREATED_AT_VERSION])

        rows = self._read(read, "reading the ledger").to_pylist()
        rows.sort(key=lambda r: (r[CREATED_AT_VERSION], r["time"]))
        return [LedgerEntry(**{k: r[k] for k in LEDGER_SCHEMA.names}) for r in rows]

    def entries(self, policy: str | None = None) -> list[LedgerEntry]:
        """The effective ledger (rollbacks applied), sorted by (policy, step)."""
        hist = self.history(policy)
        out: list[LedgerEntry] = []
        for pol in sorted({e.policy for e in hist}):
            out += replay([e for e in hist if e.policy == pol]).effective
        return out

    def last_entry(self, policy: str) -> LedgerEntry | None:
        """The newest effective step of `policy`."""
        entries = self.entries(policy)
        return entries[-1] if entries else None

    def log(self, component: str, policy: str, step: int, values: dict[str, float]) -> None:
        self.log_many(component, [(policy, step, values)])

    def log_many(self, component: str,
                 entries: list[tuple[str, int, dict[str, float]]],
                 more: list[tuple[str, str, int, dict[str, float]]] = ()) -> None:
        """Metrics of several policies, (policy, step, values) each, in one commit: a
        worker serving N policies writes one metrics commit per batch, not N. `more`:
        rows of other components in the same commit, (component, key, step, values)."""
        now = time.time()
        rows = [
            {"time": now, "component": comp, "policy": policy, "step": step,
             "name": k, "value": float(v)}
            for comp, policy, step, values in [*((component, *e) for e in entries), *more]
            for k, v in values.items()
        ]
        if not rows:
            return
        self._pending += rows
        self.flush_due()

    def flush_due(self) -> None:
        """`flush_metrics` if the last commit is `metrics_every_s` old: what `log` and an
        idle loop call, so a waiting component's last metrics show within that."""
        if self._pending and time.time() - self._flushed_at >= self.metrics_every_s:
            self.flush_metrics()

    def flush_metrics(self) -> None:
        """Commit the metrics rows `log` has buffered (each keeps the time it was logged)."""
        if not self._pending:
            return
        rows, self._pending = self._pending, []
        try:
            _lance.append(self.metrics, pa.Table.from_pylist(rows, schema=METRICS_SCHEMA),
                          where=self.uri, budget_s=self.budget_s)
        except BaseException:
            self._pending = rows + self._pending  # kept for the next try
            raise
        self._flushed_at = time.time()

    def read_metrics(self, *, since: float = 0.0, names: list[str] | None = None) -> pa.Table:
        flt = f"time > {since!r}"
        if names:
            flt += " AND name IN (" + ", ".join(f"'{sql_str(n)}'" for n in names) + ")"
        return self._read(lambda: _lance.latest_dataset(self.metrics).to_table(filter=flt),
                          "reading metrics")

    def metrics_after(self, cursor: Cursor, held: Held | None = None
                      ) -> tuple[Cursor, pa.Table | None]:
        """The metrics rows committed after `cursor`, with their commit version: (new
        cursor, rows), or (new cursor, None) when nothing is new (`read.read_after`: one
        read, of the fragments written since). `held`: the follower's `Held(self.metrics)`,
        for a cheaper poll."""
        table = held if held is not None else self.metrics
        return self._read(lambda: read_after(table, cursor, METRICS_SCHEMA.names),
                          "reading metrics")

    def maintain(self) -> None:
        _lance.maintain(self.ledger)
        _lance.maintain(self.metrics)


@dataclass
class Replay:
    effective: list[LedgerEntry]
    """Steps whose effect the model carries, by step."""
    voided: list[LedgerEntry]
    """Steps lost with a killed trainer (their rows were trained again later)."""
    rollbacks: int
    problems: list[str]


def replay(history: list[LedgerEntry]) -> Replay:
    """Apply one policy's rollbacks, in commit order, to its ledger history."""
    eff: dict[int, LedgerEntry] = {}
    voided: list[LedgerEntry] = []
    problems: list[str] = []
    rollbacks = 0
    for e in history:
        if e.kind == ROLLBACK:
            rollbacks += 1
            for s in sorted(s for s in eff if s >= e.step):
                voided.append(eff.pop(s))
        elif e.step in eff:
            problems.append(f"step {e.step} recorded twice without a rollback in between "
                            f"(ranges ({eff[e.step].cursor_start}, {eff[e.step].cursor_end}] and "
                            f"({e.cursor_start}, {e.cursor_end}])")
        else:
            eff[e.step] = e
    return Replay(sorted(eff.values(), key=lambda e: e.step), voided, rollbacks, problems)


def check_ledger(entries: list[LedgerEntry], first_cursor: int = 0) -> list[str]:
    """Problems with one policy's effective ledger: gaps, overlaps, missing steps, arithmetic."""
    problems: list[str] = []
    cursor, expected = first_cursor, 0
    for e in sorted(entries, key=lambda e: e.step):
        if e.step != expected:
            problems.append(f"steps {expected}..{e.step - 1} are missing from the ledger")
        expected = e.step + 1
        if e.cursor_start != cursor:
            kind = "gap" if e.cursor_start > cursor else "overlap"
            problems.append(f"step {e.step}: {kind}: starts at {e.cursor_start}, previous ended at {cursor}")
        if e.cursor_end < e.cursor_start:
            problems.append(f"step {e.step}: range ({e.cursor_start}, {e.cursor_end}] is reversed")
        if e.rows_read != e.rows_used + e.rows_stale + e.rows_filtered:
            problems.append(f"step {e.step}: rows do not add up")
        cursor = e.cursor_end
    return problems
