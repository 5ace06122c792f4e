"""Trajectory tables: one LanceDB table per policy, read by version cursor.

Contract (DESIGN.md, "Trajectory tables"):

    writer:  append(rows)            -> the batch committed whole in one table version,
                                        by the writer itself, or (when it lost the
                                        manifest race) staged and committed whole,
                                        exactly once, by the consumer (`stores.staging`);
                                        retried, never dropped
    reader:  read_after(cursor, ...) -> commits what is staged, then rows with
                                        cursor < _row_created_at_version <= V read on
                                        a checkout of V; the new cursor is V

A consumer that remembers only its cursor (a table version) can restart at any
time and continue exactly where it stopped: no row twice, none skipped.

`write_mode="auto"` (the default) is the staged design; `write_mode="direct"` is
the old one-`table.add`-per-batch path (numbers in README, "The trajectory
store at scale").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from astraflow.stores import _lance, retry
from astraflow.stores.schema import TRAJECTORY_SCHEMA, to_table
from astraflow.stores.staging import Staging
from astraflow.stores.uri import lance_storage_options

#: auto (the default): commit one's own batch, stage it when that loses a race;
#: staged: always stage (tests, and benchmarks of the committer); direct: one
#: `table.add` per batch retried through conflicts (the old path, `store.write_mode:
#: direct` in a flow). Readers commit staged batches whatever their own mode, so
#: writers of either mode may share a table.
WriteMode = Literal["auto", "staged", "direct"]


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

    def __init__(self, uri: str | Path, *, retry_budget_s: float = retry.DEFAULT_BUDGET_S,
                 write_mode: WriteMode = "auto"):
        self.uri = str(uri)
        self.budget_s = retry_budget_s
        self.write_mode = write_mode
        self._db = _lance.connect(uri, retry_budget_s)
        self._tables: dict[str, Any] = {}
        self._staging: dict[str, Staging] = {}
        self._facts: dict[str, _lance.FragmentFacts] = {}
        self._held: dict[str, _lance.Held] = {}

    def table(self, policy: str) -> Any:
        if policy not in self._tables:
            self._tables[policy] = _lance.open_or_create(
                self._db, table_name(policy), TRAJECTORY_SCHEMA, self.budget_s
            )
        return self._tables[policy]

    def fragment_facts(self, policy: str) -> _lance.FragmentFacts:
        """The table's per-fragment facts, kept between reads (`_lance.FragmentFacts`)."""
        if policy not in self._facts:
            self._facts[policy] = _lance.FragmentFacts()
        return self._facts[policy]

    def newest(self, policy: str) -> Any:
        """The newest committed version of the table's Lance dataset, through a dataset
        held between calls (`_lance.Held`): a poll that finds nothing new lists the
        versions once (one LIST on S3) instead of reopening the table
        (`_lance.latest_dataset`), and a new version loads only its manifest. Locally
        an idle `read_after` poll went from 1.0-1.2 to 0.15 ms of CPU (README, "Where a
        local long-row append's time goes"). Call inside `retry.call`."""
        return self._holder(policy).latest()

    def _holder(self, policy: str) -> _lance.Held:
        if policy not in self._held:
            self._held[policy] = _lance.Held(self.table(policy))
        return self._held[policy]

    def staging(self, policy: str) -> Staging:
        """The table's staged batches and their committer (`stores.staging`)."""
        if policy not in self._staging:
            self.table(policy)
            self._staging[policy] = Staging(
                self.uri.rstrip("/"), table_name(policy), lambda: self.newest(policy),
                storage_options=lance_storage_options(self.uri), budget_s=self.budget_s,
                facts=self.fragment_facts(policy))
        return self._staging[policy]

    def commit_staged(self, policy: str) -> int | None:
        """Commit every staged batch of the table now; the new version, or None when
        nothing was staged. Only the table's consumer may call this (`stores.staging`)."""
        return self.staging(policy).commit_pending()

    def pending(self, policy: str) -> int:
        """Rows staged but not yet committed (counted from marker names: one listing)."""
        return self.staging(policy).pending_rows()

    def _read(self, policy: str, fn, what: str):
        return retry.call(fn, what=f"{what} of table {table_name(policy)!r} at {self.uri}",
                          budget_s=self.budget_s)

    def append(self, policy: str, rows: list[dict[str, Any]] | pa.Table) -> int | None:
        """Validate and append one batch, all or nothing.

        Returns the table version that holds it, or None when it was staged: then
        it is in the table exactly once after the consumer's next `read_after`
        (`stores.staging`), and counted as backlog until then."""
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

        if self.write_mode == "direct":
            return _lance.append(table, batch, where=self.uri, budget_s=self.budget_s,
                                 landed=landed)
        return self._stage_or_commit(policy, batch, landed)

    def _stage_or_commit(self, policy: str, batch: pa.Table, landed) -> int | None:
        st = self.staging(policy)

        def newest() -> Any:
            return self._read(policy, lambda: _lance.latest_dataset(self.table(policy)), "opening")

        if st.current is None:
            st.current = newest()
        frags = st.write_data(st.current, batch, TRAJECTORY_SCHEMA)
        if self.write_mode == "auto" and st.should_try():
            tries = 0

            def attempt() -> int | None:
                nonlocal tries
                tries += 1
                if tries > 1 and landed():  # an ambiguous failure had committed it: not twice
                    return self.latest_version(policy)
                return st.try_commit_own(st.current if tries == 1 and st.current is not None
                                         else _lance.latest_dataset(self.table(policy)), frags)

            version = self._read(policy, attempt, f"commit of {batch.num_rows} rows")
            if version is not None:
                return version
            st.lost_race()
        st.mark(batch.num_rows, frags)
        return None

    def latest_version(self, policy: str) -> int:
        table = self.table(policy)

        def read() -> int:
            table.checkout_latest()
            return int(table.version)

        return self._read(policy, read, "latest version")

    def count(self, policy: str) -> int:
        """All rows of the policy's table, staged ones included (metadata and one
        listing: cheap enough to poll). Backpressure subtracts the consumer's rows
        from this, so staged rows count as not yet consumed. Markers are listed
        before the table is read, so a commit in between can only count a batch
        twice for a moment (too much backlog), never zero times."""
        table = self.table(policy)
        staged = self.pending(policy)

        def read() -> int:
            table.checkout_latest()
            return int(table.count_rows())

        return staged + self._read(policy, read, "row count")

    def count_after(self, policy: str, cursor: int) -> int:
        """Rows after `cursor`, staged ones included (a consumer's backlog)."""
        staged = self.pending(policy)

        def read() -> int:
            ds = self.newest(policy)
            if int(ds.version) <= cursor:
                return 0
            return _lance.scan_after(ds, cursor, columns=[_lance.CREATED_AT_VERSION],
                                     facts=self.fragment_facts(policy)).num_rows

        return staged + self._read(policy, read, "backlog count")

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

        Commits the table's staged batches first: the consumer is their only
        committer (`stores.staging`), so call this from the table's consumer only.
        """
        cols = list(columns or TRAJECTORY_SCHEMA.names)
        st = self.staging(policy)
        names = st.pending()
        fresh = None  # the version this poll committed: read on it without reopening
        if names and st.commit_pending(names) is not None:
            fresh = st.committed
            self._holder(policy).hold(fresh)  # the newest: the next poll need not reopen

        def read() -> tuple[int, pa.Table | None]:
            nonlocal fresh
            ds = fresh if fresh is not None else self.newest(policy)
            fresh = None  # a retry opens the newest
            top = int(ds.version)
            if top <= cursor:
                return top, None
            return top, _lance.scan_after(ds, cursor, columns=[*cols, _lance.CREATED_AT_VERSION],
                                          facts=self.fragment_facts(policy))

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

    def maintain(self, policy: str, retain: timedelta = _lance.RETAIN) -> dict[str, int]:
        """Compact small fragments, drop versions older than `retain`; never breaks a
        cursor nor a staged batch (see `_lance.compact`). Returns counts."""
        return _lance.compact(self.table(policy), self.staging(policy).committed_marked_files,
                              retain=retain)
