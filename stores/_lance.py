"""Thin LanceDB plumbing shared by every append-only table of the store.

Why a module of its own: trajectories, the ledger and metrics all follow one
contract — append whole Arrow batches, one commit each, retried on commit
conflicts; read rows by the table version that created them; compact as
maintenance. Keeping that contract in one place keeps the three honest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import lancedb
import pyarrow as pa

from astraflow.stores import retry
from astraflow.stores.retry import StoreError
from astraflow.stores.uri import is_remote, lance_storage_options

log = logging.getLogger(__name__)

#: Row-creation version column Lance maintains when stable row ids are on.
CREATED_AT_VERSION = "_row_created_at_version"


class SchemaMismatch(StoreError, ValueError):
    """A batch does not match the table's contract; the message names the column."""


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
                   budget_s: float = retry.DEFAULT_BUDGET_S) -> Any:
    """Open table `name`, creating it with stable row ids if it does not exist.

    Stable row ids make `_row_created_at_version` the commit version of each
    row and keep it through compaction, which is what our cursors rely on.
    Two processes may race to create the table; the loser opens it.
    """
    return retry.call(lambda: _open_or_create(db, name, schema), what=f"opening table {name!r}",
                budget_s=budget_s)


def _open_or_create(db: Any, name: str, schema: pa.Schema) -> Any:
    try:
        return db.open_table(name)
    except (ValueError, FileNotFoundError):
        pass
    try:
        return db.create_table(
            name,
            schema=schema,
            exist_ok=True,
            storage_options={"new_table_enable_stable_row_ids": "true"},
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


def read_after(table: Any, cursor: Cursor, columns: list[str], *,
               tail: tuple[list[str], int] | None = None) -> tuple[Cursor, pa.Table | None]:
    """The rows committed to `table` after `cursor`, with their creating version in
    `CREATED_AT_VERSION`: (the new cursor, rows), or (new cursor, None) when no row is
    new. One read of the table, touching only its fragments written since the cursor,
    each once (call inside `retry.call`).

    `tail=(more, n)`: the newest fragments, as many as hold `n` rows, are read with the
    columns `more` as well (null in the other rows). Why: a follower that shows the
    newest few rows in full (token lists) need not read every new row's tokens.
    """
    ds = latest_dataset(table)
    top = int(ds.version)
    if top <= cursor.version:
        return cursor, None
    frags = sorted((f for f in ds.get_fragments() if f.fragment_id > cursor.fragment),
                   key=lambda f: f.fragment_id)
    if not frags:  # commits that wrote no rows (a delete, a cleanup); `fragments=[]`
        return Cursor(top, cursor.fragment), None  # would mean every fragment to a scanner
    new = Cursor(top, frags[-1].fragment_id)
    cols = list(dict.fromkeys([*columns, CREATED_AT_VERSION]))
    flt = f"{CREATED_AT_VERSION} > {cursor.version} AND {CREATED_AT_VERSION} <= {top}"
    if tail is None:
        return new, ds.scanner(columns=cols, fragments=frags, filter=flt).to_table()
    more, n = tail
    k, held = 0, 0
    while k < len(frags) and held < n:
        k += 1
        held += frags[-k].count_rows()
    parts = [ds.scanner(columns=list(dict.fromkeys([*cols, *more])), fragments=frags[-k:],
                        filter=flt).to_table()]
    if k < len(frags):
        parts.insert(0, ds.scanner(columns=cols, fragments=frags[:-k], filter=flt).to_table())
    return new, pa.concat_tables(parts, promote_options="default")


def maintain(table: Any, retain: timedelta = timedelta(minutes=10)) -> None:
    """Compact small fragments; drop versions older than `retain`.

    Readers hold a version for at most one read, far less than `retain`, so a
    reader never loses the version it is reading.
    """
    table.optimize(cleanup_older_than=retain)


def sql_str(s: str) -> str:
    """`s` quoted for a Lance SQL string literal."""
    return s.replace("'", "''")
