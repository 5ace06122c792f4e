"""Trajectory tables: one LanceDB table per policy, read by version cursor.

Contract (DESIGN.md, "Trajectory tables"):

    writer:  append(rows)            -> one commit per batch, retried, never dropped
    reader:  read_after(cursor, ...) -> rows with cursor < _row_created_at_version <= V
                                        read on a checkout of V; the new cursor is V

A consumer that remembers only its cursor (a table version) can restart at any
time and continue exactly where it stopped: no row twice, none skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from astraflow.stores import _lance
from astraflow.stores.schema import TRAJECTORY_SCHEMA, to_table


def table_name(policy: str) -> str:
    return f"traj_{policy}"


@dataclass(frozen=True)
class Slice:
    """Rows created in the version range (start, end] of a trajectory table."""

    start: int
    end: int
    rows: pa.Table

    @property
    def num_rows(self) -> int:
        return self.rows.num_rows


class TrajectoryStore:
    """All trajectory tables of one store location (a directory or bucket URI)."""

    def __init__(self, uri: str | Path, storage_options: dict[str, str] | None = None):
        self.uri = str(uri)
        self._db = _lance.connect(uri, storage_options)
        self._tables: dict[str, Any] = {}

    def table(self, policy: str) -> Any:
        if policy not in self._tables:
            self._tables[policy] = _lance.open_or_create(
                self._db, table_name(policy), TRAJECTORY_SCHEMA
            )
        return self._tables[policy]

    def append(self, policy: str, rows: list[dict[str, Any]] | pa.Table) -> int:
        """Validate and append one batch as one commit; returns its version."""
        batch = to_table(rows)
        wrong = set(batch.column("policy").to_pylist()) - {policy}
        if wrong:
            raise _lance.SchemaMismatch(
                f"column 'policy' holds {sorted(wrong)} but the batch goes to table "
                f"{table_name(policy)!r}"
            )
        return _lance.append(self.table(policy), batch)

    def latest_version(self, policy: str) -> int:
        table = self.table(policy)
        table.checkout_latest()
        return int(table.version)

    def count(self, policy: str) -> int:
        """All rows of the policy's table (metadata only: cheap enough to poll)."""
        table = self.table(policy)
        table.checkout_latest()
        return int(table.count_rows())

    def count_after(self, policy: str, cursor: int) -> int:
        """Rows committed after `cursor` (a consumer's backlog)."""
        ds = _lance.latest_dataset(self.table(policy))
        if int(ds.version) <= cursor:
            return 0
        return int(ds.count_rows(filter=f"{_lance.CREATED_AT_VERSION} > {int(cursor)}"))

    def read_after(
        self,
        policy: str,
        cursor: int,
        *,
        min_rows: int = 1,
        max_rows: int | None = None,
        columns: list[str] | None = None,
    ) -> Slice | None:
        """Rows of whole commits after `cursor`, on the newest version.

        Takes commits in version order until at least `min_rows` rows are
        gathered (stopping before exceeding `max_rows` when possible), so a
        slice always ends on a commit boundary and the returned `end` is an
        exact new cursor. Returns None when fewer than `min_rows` rows are new.
        """
        ds = _lance.latest_dataset(self.table(policy))
        top = int(ds.version)
        if top <= cursor:
            return None
        cols = list(columns or TRAJECTORY_SCHEMA.names)
        rows = ds.to_table(
            columns=[*cols, _lance.CREATED_AT_VERSION],
            filter=f"{_lance.CREATED_AT_VERSION} > {int(cursor)} "
            f"AND {_lance.CREATED_AT_VERSION} <= {top}",
        )
        if rows.num_rows < min_rows:
            return None
        versions = rows.column(_lance.CREATED_AT_VERSION)
        rows = rows.take(pc.sort_indices(versions))
        versions = rows.column(_lance.CREATED_AT_VERSION).to_numpy()
        end = top
        if max_rows is not None and rows.num_rows > max_rows:
            # Cut on the commit boundary at or after min_rows, never mid-commit.
            boundaries = [i for i in range(1, len(versions)) if versions[i] != versions[i - 1]]
            cut = next((b for b in boundaries if b >= min_rows), len(versions))
            rows = rows.slice(0, cut)
            end = int(versions[cut - 1]) if cut < len(versions) else top
        return Slice(start=int(cursor), end=end, rows=rows)

    def read_range(self, policy: str, start: int, end: int, columns: list[str] | None = None) -> pa.Table:
        """Rows with start < created version <= end (for audits and replays)."""
        ds = _lance.latest_dataset(self.table(policy))
        cols = list(columns or TRAJECTORY_SCHEMA.names)
        return ds.to_table(
            columns=[*cols, _lance.CREATED_AT_VERSION],
            filter=f"{_lance.CREATED_AT_VERSION} > {int(start)} "
            f"AND {_lance.CREATED_AT_VERSION} <= {int(end)}",
        )

    def maintain(self, policy: str) -> None:
        _lance.maintain(self.table(policy))
