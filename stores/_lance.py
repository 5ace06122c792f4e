"""Thin LanceDB plumbing shared by every append-only table of the store.

Why a module of its own: trajectories, the ledger and metrics all follow one
contract — append whole Arrow batches, one commit each, retried on commit
conflicts; read rows by the table version that created them; compact as
maintenance. Keeping that contract in one place keeps the three honest.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import lancedb
import pyarrow as pa
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

log = logging.getLogger(__name__)

#: Row-creation version column Lance maintains when stable row ids are on.
CREATED_AT_VERSION = "_row_created_at_version"


class StoreError(RuntimeError):
    """The store refused or failed an operation; the message names the table."""


class SchemaMismatch(StoreError, ValueError):
    """A batch does not match the table's contract; the message names the column."""


def connect(uri: str | Path, storage_options: dict[str, str] | None = None) -> Any:
    """Open a LanceDB connection that always sees other processes' commits."""
    if isinstance(uri, Path) or "://" not in str(uri):
        Path(uri).mkdir(parents=True, exist_ok=True)
    return lancedb.connect(
        str(uri),
        read_consistency_interval=timedelta(0),
        storage_options=storage_options or None,
    )


def open_or_create(db: Any, name: str, schema: pa.Schema) -> Any:
    """Open table `name`, creating it with stable row ids if it does not exist.

    Stable row ids make `_row_created_at_version` the commit version of each
    row and keep it through compaction, which is what our cursors rely on.
    Two processes may race to create the table; the loser opens it.
    """
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


def _retryable(exc: BaseException) -> bool:
    # Our own validation errors are final; anything from the storage layer
    # (commit conflicts, transient IO) is worth another try.
    return not isinstance(exc, SchemaMismatch | TypeError)


def append(table: Any, batch: pa.Table, *, attempts: int = 10, max_wait_s: float = 2.0) -> int:
    """Append `batch` as one commit, retrying conflicts with jittered backoff.

    Lance retries commit conflicts internally but can still give up under many
    concurrent writers; we retry on top of that and, if every try fails, raise —
    a batch is never dropped silently. Returns the table version after commit.
    """
    try:
        for attempt in Retrying(
            retry=retry_if_exception(_retryable),
            stop=stop_after_attempt(attempts),
            wait=wait_random_exponential(multiplier=0.05, max=max_wait_s),
            reraise=False,
        ):
            with attempt:
                if attempt.retry_state.attempt_number > 1:
                    log.warning(
                        "retrying append to %s (attempt %d)",
                        table.name,
                        attempt.retry_state.attempt_number,
                    )
                table.add(batch)
    except RetryError as err:
        raise StoreError(
            f"append of {batch.num_rows} rows to table {table.name!r} failed after "
            f"{attempts} attempts: {err.last_attempt.exception()}"
        ) from err.last_attempt.exception()
    return int(table.version)


def latest_dataset(table: Any) -> Any:
    """The Lance dataset of the newest committed version of `table`."""
    table.checkout_latest()
    return table.to_lance()


def maintain(table: Any, retain: timedelta = timedelta(minutes=10)) -> None:
    """Compact small fragments; drop versions older than `retain`.

    Readers hold a version for at most one read, far less than `retain`, so a
    reader never loses the version it is reading.
    """
    table.optimize(cleanup_older_than=retain)
