"""Thin LanceDB plumbing shared by every append-only table of the store.

Why a module of its own: trajectories, the ledger and metrics all follow one
contract — append whole Arrow batches, one commit each, retried on commit
conflicts; read rows by the table version that created them; compact as
maintenance. Keeping that contract in one place keeps the three honest.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import lancedb
import pyarrow as pa

from astraflow.stores import retry
from astraflow.stores.schema import CREATED_AT_VERSION
from astraflow.stores.uri import is_remote, lance_storage_options

log = logging.getLogger(__name__)

def connect(uri: str | Path, budget_s: float = retry.DEFAULT_BUDGET_S) -> Any:
    """Open a LanceDB connection that always sees other processes' commits.

    For s3:// the storage options (endpoint, region, keys) come from the
    environment (`stores.uri`); they live only in this process's memory.
    """
    if not is_remote(uri):
        Path(uri).mkdir(parents=True, exist_ok=True)
    return retry.call(lambda: lancedb.connect(
        str(uri),
        read_consistency_interval=timedelta(0),
        storage_options=lance_storage_options(uri),
    ), what=f"connecting to store {uri}", budget_s=budget_s)


def open_or_create(db: Any, name: str, schema: pa.Schema,
                   budget_s: float = retry.DEFAULT_BUDGET_S, *,
                   stable_row_ids: bool = True) -> Any:
    """Open table `name`, creating it with stable row ids if it does not exist.

    Stable row ids make `_row_created_at_version` the commit version of each
    row and keep it through compaction, which is what our cursors rely on.
    Two processes may race to create the table; the loser opens it. A table no
    cursor follows (an archive) goes without: Lance then keeps no per-commit
    lineage in its manifest.
    """
    return retry.call(lambda: _open_or_create(db, name, schema, stable_row_ids),
                      what=f"opening table {name!r}", budget_s=budget_s)


def open_existing(db: Any, name: str, budget_s: float = retry.DEFAULT_BUDGET_S) -> Any | None:
    """Table `name`, or None when it does not exist (readers never create tables)."""
    def attempt() -> Any | None:
        try:
            return db.open_table(name)
        except (ValueError, FileNotFoundError):
            return None

    return retry.call(attempt, what=f"opening table {name!r}", budget_s=budget_s)


def _open_or_create(db: Any, name: str, schema: pa.Schema, stable_row_ids: bool = True) -> Any:
    try:
        return db.open_table(name)
    except (ValueError, FileNotFoundError):
        pass
    try:
        return db.create_table(
            name,
            schema=schema,
            exist_ok=True,
            storage_options={"new_table_enable_stable_row_ids": "true"} if stable_row_ids else None,
        )
    except Exception:  # a concurrent creator won the race: open what it made
        return db.open_table(name)


def append(table: Any, batch: pa.Table, *, where: str, budget_s: float = retry.DEFAULT_BUDGET_S,
           landed: Callable[[], bool] | None = None) -> int:
    """Append `batch` as one commit, retrying failures with jittered backoff.

    Lance retries commit conflicts internally but can still give up under many
    concurrent writers, and an unreachable store fails every try; we retry on
    top of that for up to `budget_s` and then raise StoreUnavailable — a batch
    is never dropped silently. When a try fails ambiguously (the commit may
    have landed before the error reached us), `landed()` is asked before the
    next try so the batch is not committed twice. `where` names the store in
    errors. Returns the table version.
    """
    tried = False

    def attempt() -> int:
        nonlocal tried
        if tried and landed is not None and landed():
            log.warning("append to %s had landed before its error; not committing it again",
                        table.name)
            table.checkout_latest()
            return int(table.version)
        tried = True
        table.add(batch)
        return int(table.version)

    return retry.call(attempt, budget_s=budget_s,
                      what=f"append of {batch.num_rows} rows to table {table.name!r} at {where}")


def latest_dataset(table: Any) -> Any:
    """The Lance dataset of the newest committed version of `table` (call inside `call`)."""
    table.checkout_latest()
    return table.to_lance()


#: How long a table version outlives its successor: far longer than any one read.
RETAIN = timedelta(minutes=10)
#: Rows per compacted fragment (about 256 MB of 1,000-token rows).
COMPACT_ROWS = 32_768


def compact(table: Any, marked_files: Callable[[Any], set[str]], *,
            retain: timedelta = RETAIN) -> dict[str, int]:
    """Maintenance of a staged-append table: bounded fragments and versions, cursors intact.

    Takes no lock and runs beside writers and the committer:
    1. plan the rewrite of small fragments on version D;
    2. drop from the plan every fragment holding a file that a staged-batch marker
       still names (`marked_files(D)`, listed after D was opened): the committer
       tells "already committed" by finding a marker's files in the table, so those
       files must stay until the marker is settled (`stores.staging`);
    3. rewrite and commit (a Rewrite rebases over concurrent Appends). With stable
       row ids a compacted row keeps its `_row_created_at_version`, so every cursor
       means the same rows before and after;
    4. drop versions older than `retain` (a reader holds a version for one read).
       Staged but uncommitted data files are unreferenced and young, and Lance's
       cleanup keeps young unreferenced files.
    """
    from lance.optimize import Compaction, CompactionOptions

    ds = latest_dataset(table)
    plan = Compaction.plan(ds, CompactionOptions(target_rows_per_fragment=COMPACT_ROWS))
    keep = marked_files(ds) if plan.tasks else set()
    held = {f.fragment_id for f in ds.get_fragments()
            if any(df.path in keep for df in f.metadata.files)}
    tasks = [t for t in plan.tasks if not {f.id for f in t.fragments} & held]
    if tasks:
        Compaction.commit(ds, [t.execute(ds) for t in tasks])
    ds = latest_dataset(table)
    removed = ds.cleanup_old_versions(older_than=retain)
    ds = latest_dataset(table)
    return {"fragments": len(ds.get_fragments()), "versions": len(ds.versions()),
            "versions_removed": int(removed.old_versions), "rows": int(ds.count_rows()),
            "fragments_held": len(held)}


def maintain(table: Any, retain: timedelta = RETAIN) -> None:
    """Compact small fragments; drop versions older than `retain`.

    Readers hold a version for at most one read, far less than `retain`, so a
    reader never loses the version it is reading.
    """
    table.optimize(cleanup_older_than=retain)


def _varint(b: bytes, i: int) -> tuple[int, int]:
    x = shift = 0
    while True:
        c = b[i]
        i += 1
        x |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return x, i


def _fields(b: bytes):
    """(field number, value) of a protobuf message (varint and length-delimited only)."""
    i = 0
    while i < len(b):
        key, i = _varint(b, i)
        if key & 7 == 0:
            v, i = _varint(b, i)
        elif key & 7 == 2:
            n, i = _varint(b, i)
            v, i = b[i:i + n], i + n
        else:
            raise ValueError(f"protobuf wire type {key & 7}")
        yield key >> 3, v


def row_runs(meta: Any) -> list[tuple[int, int]] | None:
    """(rows, creating version) runs of a fragment's `_row_created_at_version`, in row
    order, from its metadata (`fragment.metadata`) alone.

    Lance keeps each fragment's row creation versions as runs (protobuf
    `RowDatasetVersionSequence { repeated Run runs = 1 }`, `Run { span = 1;
    version = 2 }`, the span a `U64Segment`), inline in the manifest. None when it is
    not inline or not a plain range (then the fragment is simply read, and filtered)."""
    meta = meta.created_at_version_meta
    if meta is None:
        return None
    try:
        raw = json.loads(meta.json()).get("inline")
        if raw is None:
            return None
        out = []
        for f, run in _fields(bytes(raw)):
            if f != 1:
                continue
            d = dict(_fields(run))
            out.append((_segment_len(d[1]), int(d[2])))
        return out
    except (ValueError, IndexError, TypeError, KeyError):
        return None


def _segment_len(seg: bytes) -> int:
    """Rows in a `U64Segment`: `Range range = 1` ({start = 1, end = 2}, end exclusive)
    is the only form Lance writes for a run's span; any other raises ValueError."""
    fields = dict(_fields(seg))
    if set(fields) != {1}:
        raise ValueError("a run span that is not a range")
    r = dict(_fields(fields[1]))
    return int(r.get(2, 0)) - int(r.get(1, 0))


def new_rows(fragment: Any, after: int) -> int | None:
    """Rows of a fragment created after version `after`, from its metadata alone; None
    when the metadata does not say (or the fragment has deletions)."""
    meta = fragment.metadata
    runs = row_runs(meta)
    if runs is None or meta.num_deletions or sum(n for n, _ in runs) != meta.physical_rows:
        return None  # not the layout we know: the caller reads and filters
    return sum(n for n, v in runs if v > after)


def newest_row_version(fragment: Any) -> int | None:
    """The highest `_row_created_at_version` in a fragment, from its metadata alone;
    None when the metadata does not say."""
    runs = row_runs(fragment.metadata)
    return max((v for _, v in runs), default=None) if runs else None


class FragmentFacts:
    """What the per-read path needs of each fragment of one table, read from its metadata
    once per process: its data files and the oldest and newest `_row_created_at_version`
    of its rows.

    Why: a compacted fragment's creation versions are one run per commit it took in (inline
    in the manifest), and `row_runs` parses them in Python, ~0.1 s for a fragment of 32k
    rows from 4-row commits. `scan_after` parsed every fragment on every read, so the next
    batch cost more the longer the table had lived (soak: p50 170 -> 600 ms over 76k
    commits) although the fragments stayed bounded. These facts are fixed when a fragment is
    committed (a deletion file or an added column changes none: its rows' creation
    versions stay, its first data files stay listed) and Lance never reuses a fragment id
    within a table (the next id comes from the manifest's `max_fragment_id`), so they are
    remembered by fragment id: a read parses only the fragments committed since the last.
    A fragment whose row count differs from the remembered one is read again, and a
    version below the highest seen (a table made anew under the same name) forgets all.

    `parsed` counts fragments whose metadata was read (tests: the work per read must
    not grow with the table's history).
    """

    def __init__(self) -> None:
        # fragment id -> (physical rows, data files, newest creation version or None,
        # oldest creation version or None)
        self._known: dict[int, tuple[int, tuple[str, ...], int | None, int | None]] = {}
        self._top = -1
        self.parsed = 0

    def of(self, ds: Any) -> list[tuple[Any, tuple[str, ...], int | None, int | None]]:
        """(fragment, its data files, its newest and its oldest row creation version)
        for every fragment of `ds`, in the dataset's order. The newest is None when
        the metadata does not say; the oldest also when its runs do not cover every
        physical row (then no one may conclude that all its rows are new)."""
        version = int(ds.version)
        known = {} if version < self._top else self._known
        self._top = version
        out, seen = [], {}
        for f in ds.get_fragments():
            fid, rows = f.fragment_id, f.physical_rows
            facts = known.get(fid)
            if facts is None or facts[0] != rows:
                self.parsed += 1
                meta = f.metadata
                runs = row_runs(meta)
                facts = (rows, tuple(df.path for df in meta.files),
                         max((v for _, v in runs), default=None) if runs else None,
                         min(v for _, v in runs)
                         if runs and sum(n for n, _ in runs) == rows else None)
            seen[fid] = facts
            out.append((f, *facts[1:]))
        self._known = seen  # only the fragments still there: bounded as the table is
        return out

    def files(self, ds: Any) -> set[str]:
        """Every data file `ds` references."""
        return {p for _, files, _, _ in self.of(ds) for p in files}


def scan_after(ds: Any, cursor: int, *, columns: list[str] | None,
               facts: FragmentFacts | None = None) -> pa.Table:
    """The rows of `ds` created after version `cursor` (`CREATED_AT_VERSION > cursor`),
    read from only the fragments holding such rows (their metadata says so): the next
    batch costs the same on a day-old table as on a new one, however many compacted
    fragments lie behind the cursor, when the caller keeps `facts` between reads (each
    fragment's metadata is then parsed once).

    The version filter is applied only when a fragment read may also hold older rows (a
    compaction that took in unread commits, or metadata that does not say); plain
    appends, the usual case, are read whole (one new 64-row fragment, traj_id + version,
    local, on a loaded machine: 3.3 ms CPU filtered, 1.3 ms whole). Rows created after `ds`'s
    own version are never in `ds`, so no upper bound is needed."""
    facts = facts if facts is not None else FragmentFacts()
    chosen = [(f, old) for f, _, new, old in facts.of(ds) if new is None or new > cursor]
    # `fragments=[]` would mean every fragment to a scanner: the filter must stay then
    whole = bool(chosen) and all(old is not None and old > cursor for _, old in chosen)
    flt = None if whole else (f"{CREATED_AT_VERSION} > {int(cursor)} "
                              f"AND {CREATED_AT_VERSION} <= {int(ds.version)}")
    return ds.scanner(columns=columns, filter=flt, fragments=[f for f, _ in chosen]).to_table()
