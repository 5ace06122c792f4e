"""Trajectory tables: one LanceDB table per policy, read by version cursor.
Contract:

    writer:  append(rows)            -> the batch committed whole in one table version,
                                        by the writer itself, or (when it lost the
                                        manifest race) staged and committed whole,
                                        exactly once, by the consumer (`stores.staging`);
                                        retried, never dropped
    reader:  read_after(cursor, ...) -> commits what is staged, then rows with
                                        cursor < _row_created_at_version <= V read on
                                        a checkout of V; the new cursor is V

A consumer that remembers only its cursor (a table version) can restart at any
time and continue exactly where it stopped: no row twice, none skipped (DESIGN.md,
"Trajectory tables"). Write modes: see `WriteMode`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from astraflow.stores import _lance, retry
from astraflow.stores.read import Cursor, Held, read_after, sql_str
from astraflow.stores.schema import CREATED_AT_VERSION, TRAJECTORY_SCHEMA, SchemaMismatch, to_table
from astraflow.stores.staging import Staging, crash_point
from astraflow.stores.uri import lance_storage_options

#: auto (the default): commit one's own batch, stage it when that loses a race;
#: staged (`store.write_mode: staged`, a flow's default on S3): always stage, and the
#: trainer's read commits every batch (fastest on S3); direct: one
#: `table.add` per batch retried through conflicts (the old path, `store.write_mode:
#: direct` in a flow). Readers commit staged batches whatever their own mode, so
#: writers of either mode may share a table.
WriteMode = Literal["auto", "staged", "direct"]


def table_name(policy: str) -> str:
    return f"traj_{policy}"


def archive_name(policy: str) -> str:
    """The table a policy's consumed rows retire to (`TrajectoryStore.retire`); its own
    prefix, so no policy's `traj_` table can share the name."""
    return f"retired_{policy}"


#: An archived row's `_row_created_at_version` in the hot table, as a real column (Lance
#: derives the hot one from per-commit lineage kept in the manifest; the archive keeps none).
ARCHIVED_VERSION = "_archived_version"
ARCHIVE_SCHEMA = TRAJECTORY_SCHEMA.append(pa.field(ARCHIVED_VERSION, pa.int64(), nullable=False))


@dataclass(frozen=True)
class Slice:
    """Rows created in the version range (start, end] of a trajectory table."""

    start: int
    end: int
    rows: pa.Table

    @property
    def num_rows(self) -> int:
        return self.rows.num_rows


def _row_key(rows: pa.Table) -> pa.Array:
    """`traj_id@created version`: one row in both tables mid-retirement has the same key;
    a row committed twice (a bug the audit must see) has two versions, so two keys."""
    return pc.binary_join_element_wise(
        rows.column("traj_id"), pc.cast(rows.column(CREATED_AT_VERSION), pa.string()),
        "@").combine_chunks()


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
        self._archives: dict[str, Any] = {}
        self._held: dict[str, Held] = {}

    def table(self, policy: str) -> Any:
        if policy not in self._tables:
            self._tables[policy] = _lance.open_or_create(
                self._db, table_name(policy), TRAJECTORY_SCHEMA, self.budget_s
            )
        return self._tables[policy]

    def archive(self, policy: str, *, create: bool = False) -> Any | None:
        """The policy's archive of retired rows; None while nothing was ever retired
        (readers do not create it)."""
        if policy not in self._archives:
            name = archive_name(policy)
            arch = (_lance.open_or_create(self._db, name, ARCHIVE_SCHEMA, self.budget_s,
                                          stable_row_ids=False) if create
                    else _lance.open_existing(self._db, name, self.budget_s))
            if arch is None:
                return None
            self._archives[policy] = arch
        return self._archives[policy]

    def fragment_facts(self, policy: str) -> _lance.FragmentFacts:
        """The table's per-fragment facts, kept between reads (`_lance.FragmentFacts`)."""
        if policy not in self._facts:
            self._facts[policy] = _lance.FragmentFacts()
        return self._facts[policy]

    def newest(self, policy: str) -> Any:
        """The newest committed version of the table's Lance dataset, through a dataset
        held between calls (`read.Held`): a poll that finds nothing new lists the
        versions once (one LIST on S3) instead of reopening the table, and a new
        version loads only its manifest. Call inside `retry.call`."""
        return self._holder(policy).latest()

    def _holder(self, policy: str) -> Held:
        if policy not in self._held:
            self._held[policy] = Held(self.table(policy))
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
            raise SchemaMismatch(f"refusing an empty batch for table {table_name(policy)!r}")
        wrong = set(batch.column("policy").to_pylist()) - {policy}
        if wrong:
            raise SchemaMismatch(
                f"column 'policy' holds {sorted(wrong)} but the batch goes to table "
                f"{table_name(policy)!r}"
            )
        table = self.table(policy)
        first = batch.column("traj_id")[0].as_py()

        def landed() -> bool:  # the batch's first row is already in the table (or retired)
            flt = f"traj_id = '{sql_str(first)}'"
            if _lance.latest_dataset(table).count_rows(filter=flt) > 0:
                return True
            arch = self.archive(policy)  # read after the table: see `scan`
            return arch is not None and _lance.latest_dataset(arch).count_rows(filter=flt) > 0

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
        staged = self.pending(policy)

        def rows(table: Any) -> int:
            table.checkout_latest()
            return int(table.count_rows())

        live = self._read(policy, lambda: rows(self.table(policy)), "row count")
        # The archive after the table: a row retired in between is counted twice for a
        # moment (the archive takes it before the table lets it go), never zero times.
        arch = self.archive(policy)
        retired = 0 if arch is None else self._read(policy, lambda: rows(arch),
                                                    "retired row count")
        return staged + live + retired

    def count_after(self, policy: str, cursor: int) -> int:
        """Rows after `cursor`, staged ones included (a consumer's backlog)."""
        staged = self.pending(policy)

        def read() -> int:
            ds = self.newest(policy)
            if int(ds.version) <= cursor:
                return 0
            return _lance.scan_after(ds, cursor, columns=[CREATED_AT_VERSION],
                                     facts=self.fragment_facts(policy)).num_rows

        return staged + self._read(policy, read, "backlog count")

    def follow(self, policy: str, held: Held, cursor: Cursor, columns: list[str], *,
               tail: tuple[list[str], int] | None = None) -> tuple[Cursor, pa.Table | None]:
        """A follower's read of the live table through its own `held` one
        (`read.read_after`): the rows committed after `cursor`, with their version.
        Commits nothing staged: only the consumer's `read_after` does."""
        return self._read(policy, lambda: read_after(held, cursor, columns, tail=tail), "read")

    def retired(self, policy: str, columns: list[str], *, below: int | None = None
                ) -> pa.Table | None:
        """`columns` of the rows retired from the live table (`retire`), with their
        created version in ARCHIVED_VERSION, only those created before `below` when
        given; None when nothing was ever retired."""
        arch = self.archive(policy)
        if arch is None:
            return None
        flt = None if below is None else f"{ARCHIVED_VERSION} < {int(below)}"
        return self._read(policy, lambda: _lance.latest_dataset(arch).to_table(
            columns=[*columns, ARCHIVED_VERSION], filter=flt), "retired rows read")

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
            return top, _lance.scan_after(ds, cursor, columns=[*cols, CREATED_AT_VERSION],
                                          facts=self.fragment_facts(policy))

        top, rows = self._read(policy, read, "read")
        if rows is None or rows.num_rows < min_rows:
            return None
        versions = rows.column(CREATED_AT_VERSION)
        rows = rows.take(pc.sort_indices(versions))
        versions = rows.column(CREATED_AT_VERSION).to_numpy()
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
        matching `where` (a LanceDB SQL filter) when given; retired rows included."""
        cond = f"{CREATED_AT_VERSION} > {int(start)} AND {CREATED_AT_VERSION} <= {int(end)}"
        if where:
            cond = f"({cond}) AND ({where})"
        return self.scan(policy, columns, cond)

    def scan(self, policy: str, columns: list[str] | None = None,
             where: str | None = None, *, retry_reads: bool = True) -> pa.Table:
        """Every row of the policy, live or retired, matching `where` (a LanceDB SQL
        filter; `_row_created_at_version` means the same in both), with its
        `_row_created_at_version`. For audits, replays and inspection, not the per-step
        read (`read_after` touches only the live table).

        The live table is read first, then the archive, and archived rows the live
        read also returned are dropped (same `traj_id` and version): `retire` adds rows to the archive
        before it deletes them from the table, so a retirement in between shows a row
        in both reads, never in neither. `retry_reads=False`: a failure is raised at once
        (a user's filter that Lance refuses is not an outage to wait out)."""
        cols = list(columns or TRAJECTORY_SCHEMA.names)
        want = list(dict.fromkeys([*cols, "traj_id"]))

        def read(fn, what: str):
            return self._read(policy, fn, what) if retry_reads else fn()

        hot = read(lambda: _lance.latest_dataset(self.table(policy)).to_table(
            columns=[*want, CREATED_AT_VERSION], filter=where), "read")
        arch = self.archive(policy)
        if arch is not None:
            flt = where.replace(CREATED_AT_VERSION, ARCHIVED_VERSION) if where else None
            old = read(lambda: _lance.latest_dataset(arch).to_table(
                columns=[*want, ARCHIVED_VERSION], filter=flt), "retired rows read")
            if old.num_rows:
                old = old.rename_columns([*want, CREATED_AT_VERSION])
                old = old.filter(pc.invert(pc.is_in(_row_key(old), value_set=_row_key(hot))))
                hot = pa.concat_tables([old.cast(hot.schema), hot])
        return hot.select([*cols, CREATED_AT_VERSION])

    def retired_upto(self, policy: str) -> int:
        """The newest table version whose rows have all been retired (0: none)."""
        arch = self.archive(policy)
        if arch is None:
            return 0

        def read() -> int:
            col = _lance.latest_dataset(arch).to_table(columns=[ARCHIVED_VERSION]).column(0)
            return int(pc.max(col).as_py() or 0) if len(col) else 0

        return self._read(policy, read, "retired version")

    def retire(self, policy: str, upto: int) -> int:
        """Move the rows created at or before table version `upto` out of the live table
        into the policy's archive (`archive_name`); returns rows moved. Pass the consumer's
        cursor: it reads only after that, and `scan`/`read_range`/`count` include the
        archive, so nothing anyone reads changes.

        Why: Lance keeps each row's creating commit as runs in the manifest (what makes
        `_row_created_at_version` and the cursor work), so every commit's manifest, and the
        cost of writing and committing it, grows with all the commits whose rows the table
        still holds (a 100k-commit soak: 0.9 MB per manifest in its 9th "hour", 2.5 MB in
        its 24th; read-next-batch p50 138 -> 446 ms). Retired rows leave the live table's manifest; the archive has no
        lineage to keep.

        Crash-safe without any state of its own: (1) the archive's newest version `W`,
        (2) one append of the live rows in (W, upto] to the archive (all or nothing),
        (3) a delete of the live rows <= upto. Killed after (2), the next call finds
        W >= those rows and only deletes; an append that failed ambiguously is retried
        from (1), so a row is archived once. A reader never loses a row (see `scan`).
        """
        arch = self.archive(policy, create=True)
        moved = 0

        def move() -> None:
            nonlocal moved
            done = self.retired_upto(policy)
            if upto <= done:
                return
            ds = _lance.latest_dataset(self.table(policy))
            rows = _lance.scan_after(
                ds, done, columns=[*TRAJECTORY_SCHEMA.names, CREATED_AT_VERSION],
                facts=self.fragment_facts(policy))  # rows after `done`: cut at `upto` here
            rows = rows.filter(pc.less_equal(rows.column(CREATED_AT_VERSION), int(upto)))
            if rows.num_rows:
                rows = rows.rename_columns([*TRAJECTORY_SCHEMA.names, ARCHIVED_VERSION])
                arch.add(rows.cast(ARCHIVE_SCHEMA))
                moved = rows.num_rows

        self._read(policy, move, f"retiring rows up to version {upto}")
        crash_point("archived")

        def delete() -> None:
            ds = _lance.latest_dataset(self.table(policy))
            # Lance commits a delete that matches nothing too: a maintenance round with
            # nothing to drop would add a version and race the writers for nothing.
            if any(old is None or old <= upto
                   for _, _, _, old in self.fragment_facts(policy).of(ds)):
                ds.delete(f"{CREATED_AT_VERSION} <= {int(upto)}")

        self._read(policy, delete, f"dropping retired rows up to version {upto}")
        return moved

    def maintain(self, policy: str, retain: timedelta = _lance.RETAIN, *,
                 retire_upto: int | None = None) -> dict[str, int]:
        """Retire the rows created at or before `retire_upto` (the consumer's cursor;
        None: none), compact small fragments, drop versions older than `retain`; never
        breaks a cursor nor a staged batch (see `_lance.compact`). Returns counts."""
        retired = self.retire(policy, retire_upto) if retire_upto else 0
        out = _lance.compact(self.table(policy), self.staging(policy).committed_marked_files,
                             retain=retain)
        return {**out, "retired": retired}
