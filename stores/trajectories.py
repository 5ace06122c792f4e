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

from astraflow.stores import _lance, retry
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

    def __init__(self, uri: str | Path, *, retry_budget_s: float = retry.DEFAULT_BUDGET_S):
        self.uri = str(uri)
        self.budget_s = retry_budget_s
        self._db = _lance.connect(uri, retry_budget_s)
        self._tables: dict[str, Any] = {}

    def table(self, policy: str) -> Any:
        if policy not in self._tables:
            self._tables[policy] = _lance.open_or_create(
                self._db, table_name(policy), TRAJECTORY_SCHEMA, self.budget_s
            )
        return self._tables[policy]

    def _read(self, policy: str, fn, what: str):
        return retry.call(fn, what=f"{what} of table {table_name(policy)!r} at {self.uri}",
                          budget_s=self.budget_s)

    def append(self, policy: str, rows: list[dict[str, Any]] | pa.Table) -> int:
        """Validate and append one batch as one commit; returns its version."""
        batch = to_table(rows)
        if batch.num_rows == 0:
            raise _lance.SchemaMismatch(f"refusing an empty batch for table {table_name(policy)!r}")
        wrong = set(batch.column("policy").to_pylist()) - {policy}
        if wrong:
            raise _lance.SchemaMismatch(
                f"column 'policy' holds {sorted(wrong)} but the batch goes to table "
                f"{table_name(policy)!r}"
            )
        table = self.table(policy)
        first = batch.column("traj_id")[0].as_py()

        def landed() -> bool:  # the batch's first row is already in the table
            ds = _lance.latest_dataset(table)
            return ds.count_rows(filter=f"traj_id = '{_lance.sql_str(first)}'") > 0

        return _lance.append(table, batch, where=self.uri, budget_s=self.budget_s, landed=landed)

    def latest_version(self, policy: str) -> int:
        table = self.table(policy)

        def read() -> int:
            table.checkout_latest()
            return int(table.version)

        return self._read(policy, read, "latest version")

    def count(self, policy: str) -> int:
        """All rows of the policy's table (metadata only: cheap enough to poll)."""
        table = self.table(policy)

        def read() -> int:
            table.checkout_latest()
            return int(table.count_rows())

        return self._read(policy, read, "row count")

    def count_after(self, policy: str, cursor: int) -> int:
        """Rows committed after `cursor` (a consumer's backlog)."""
        def read() -> int:
            ds = _lance.latest_dataset(self.table(policy))
            if int(ds.version) <= cursor:
                return 0
            return int(ds.count_rows(filter=f"{_lance.CREATED_AT_VERSION} > {int(cursor)}"))

        return self._read(policy, read, "backlog count")

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
        cols = list(columns or TRAJECTORY_SCHEMA.names)

        def read() -> tuple[int, pa.Table | None]:
            ds = _lance.latest_dataset(self.table(policy))
            top = int(ds.version)
            if top <= cursor:
                return top, None
            return top, ds.to_table(
                columns=[*cols, _lance.CREATED_AT_VERSION],
                filter=f"{_lance.CREATED_AT_VERSION} > {int(cursor)} "
                f"AND {_lance.CREATED_AT_VERSION} <= {top}",
            )

        top, rows = self._read(policy, read, "read")
        if rows is None or rows.num_rows < min_rows:
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

    def read_range(self, policy: str, start: int, end: int, columns: list[str] | None = None,
                   where: str | None = None) -> pa.Table:
        """Rows with start < created version <= end (for audits and replays), and
        matching `where` (a LanceDB SQL filter) when given."""
        cols = list(columns or TRAJECTORY_SCHEMA.names)
        cond = f"{_lance.CREATED_AT_VERSION} > {int(start)} AND {_lance.CREATED_AT_VERSION} <= {int(end)}"
        if where:
            cond = f"({cond}) AND ({where})"
        return self._read(policy, lambda: _lance.latest_dataset(self.table(policy)).to_table(
            columns=[*cols, _lance.CREATED_AT_VERSION], filter=cond), "range read")

    def maintain(self, policy: str) -> None:
        _lance.maintain(self.table(policy))
