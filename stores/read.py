"""The store's public read API: follow an append-only table, reading only what is new.

Every row carries the table version that created it (`CREATED_AT_VERSION`, in
`stores.schema`). A follower (status, the dashboard, the metric sinks) keeps a `Cursor`
and its table `Held` between polls; `read_after` then reads only the commits after the
cursor, from the fragments written since, so a poll late in a long run costs what one
early in it does. `sql_str` quotes a value for the SQL filters of `TrajectoryStore.scan`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from astraflow.stores import _lance
from astraflow.stores.schema import CREATED_AT_VERSION


@dataclass(frozen=True)
class Cursor:
    """Where a follower of a table stopped: the table version it read up to, and the
    highest fragment id that version held.

    Why the fragment id: a filter on `_row_created_at_version` alone still scans every
    fragment of the table, so a follower polling a long run would pay for its whole
    history on each poll. Lance never reuses fragment ids and writes every new row
    (append, or a compaction's rewrite) to a fragment with a fresh, higher id, so the
    rows created after `version` all sit in fragments above `fragment`; the filter then
    drops the old rows a compaction may have rewritten into those fragments.
    """

    version: int = 0
    fragment: int = -1


class Held:
    """One table's Lance dataset, held by a follower between its reads.

    Why: finding the newest version lists the table's `_versions` (one entry per
    commit kept, thousands on a busy table), and `latest_dataset` pays for that
    listing more than once and then opens the dataset anew. A held dataset asks
    for the newest version number once and loads that manifest only when it moved:
    a poll that finds nothing new costs one listing.
    """

    def __init__(self, table: Any):
        self.table = table
        self._ds: Any = None

    def hold(self, ds: Any) -> None:
        """Hold `ds` (a version this process just committed and so knows to be current)."""
        self._ds = ds

    def latest(self) -> Any:
        """The newest committed version's dataset (call inside `retry.call`)."""
        if self._ds is None:
            self.table.checkout_latest()
            self._ds = self.table.to_lance()
            return self._ds
        try:
            top = self._ds.latest_version
            if top != self._ds.version:
                self._ds = self._ds.checkout_version(top)
        except Exception:
            self._ds = None  # a retry opens the table afresh
            raise
        return self._ds


def read_after(table: Any, cursor: Cursor, columns: list[str], *,
               tail: tuple[list[str], int] | None = None) -> tuple[Cursor, pa.Table | None]:
    """The rows committed to `table` (a LanceDB table, or a `Held` one) after `cursor`,
    with their creating version in `CREATED_AT_VERSION`: (the new cursor, rows), or
    (new cursor, None) when no row is new. One read of the table, touching only its
    fragments written since the cursor that hold rows created after it, each once (call
    inside `retry.call`).

    Each new fragment's metadata says which commits created its rows (`row_runs`): a
    compaction's rewrite of rows the cursor already passed is not read at all, and
    the filter on `CREATED_AT_VERSION` (about a third of a scan of small fragments) is
    applied only when a fragment mixes old rows with new ones (a rewrite that took in
    unread commits) or its metadata does not say; plain appends, the usual case, are
    read whole.

    `tail=(more, n)`: the newest fragments, as many as hold `n` new rows, are read with
    the columns `more` as well (null in the other rows). Why: a follower that shows the
    newest few rows in full (token lists) need not read every new row's tokens.
    """
    ds = table.latest() if isinstance(table, Held) else _lance.latest_dataset(table)
    top = int(ds.version)
    if top <= cursor.version:
        return cursor, None
    frags = sorted((f for f in ds.get_fragments() if f.fragment_id > cursor.fragment),
                   key=lambda f: f.fragment_id)
    if not frags:  # commits that wrote no rows (a delete, a cleanup)
        return Cursor(top, cursor.fragment), None
    new = Cursor(top, frags[-1].fragment_id)
    read: list[tuple[Any, int, bool]] = []  # (fragment, new rows, all its rows are new)
    for f in frags:
        fresh = _lance.new_rows(f, cursor.version)
        if fresh is None:
            read.append((f, f.count_rows(), False))
        elif fresh:  # no deletions (new_rows says None then): physical rows are its rows
            read.append((f, fresh, fresh == f.metadata.physical_rows))
    if not read:  # only rewrites of rows already read; `fragments=[]` would mean every
        return new, None  # fragment to a scanner
    flt = f"{CREATED_AT_VERSION} > {cursor.version} AND {CREATED_AT_VERSION} <= {top}"
    cols = list(dict.fromkeys([*columns, CREATED_AT_VERSION]))

    def scan(part: list[tuple[Any, int, bool]], cols: list[str]) -> pa.Table:
        whole = all(clean for _, _, clean in part)  # rows above `top` are not in `ds`
        return ds.scanner(columns=cols, fragments=[f for f, _, _ in part],
                          filter=None if whole else flt).to_table()

    if tail is None:
        return new, scan(read, cols)
    more, n = tail
    k, held = 0, 0
    while k < len(read) and held < n:
        k += 1
        held += read[-k][1]
    parts = [scan(read[-k:], list(dict.fromkeys([*cols, *more])))]
    if k < len(read):
        parts.insert(0, scan(read[:-k], cols))
    return new, pa.concat_tables(parts, promote_options="default")


def sql_str(s: str) -> str:
    """`s` quoted for a Lance SQL string literal."""
    return s.replace("'", "''")
