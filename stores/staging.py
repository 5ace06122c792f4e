"""Appends that never wait in a commit race: commit your own batch, or stage it.

Why: with one Lance commit per batch every writer races for the same manifest, so
adding writers made the store slower. Here a writer tries one short commit of its
own batch and, if it loses the race, hands the batch to the table's committer
instead of retrying (`auto`), or never tries (`staged`: on S3 a writer's own commit
is two more sequential requests). The committer is the table's consumer (its
trainer, rank 0) in `read_after`: the only process that commits other writers'
batches, so there is no lock, no lease and no clock. The protocol, idempotent at
every step, is in `Staging`'s docstring.

A marker means "this batch is in the table, or will be exactly once", so
backpressure and the audit count staged rows as not yet consumed.
`ASTRAFLOW_STORE_CRASH_AT=<point>[:<n>]` SIGKILLs the process the n-th time it
reaches a named point (`POINTS`), so tests kill writers and committers at exact places.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from astraflow.stores import retry
from astraflow.stores._lance import FragmentFacts
from astraflow.stores.objects import ObjectStore

STAGED = "_staged"
#: Most staged batches one commit takes (a bound on one transaction's size).
MAX_PER_COMMIT = 1024
#: Retries of a lost manifest race a writer allows its own commit before staging.
DIRECT_RETRIES = 1
#: Batches a writer stages without trying to commit after it lost a race.
BACKOFF = 8
#: Where `ASTRAFLOW_STORE_CRASH_AT` may kill: after the data files (no marker, no
#: commit), after the marker (staged, not committed), after the committer's commit
#: (markers still there), after deleting the first of a commit's markers.
POINTS = ("staged_data", "staged_marker", "committed", "settling")

_hits: dict[str, int] = {}


def crash_point(name: str) -> None:
    """SIGKILL this process here if `ASTRAFLOW_STORE_CRASH_AT` names this point (test hook)."""
    spec = os.environ.get("ASTRAFLOW_STORE_CRASH_AT")
    if not spec:
        return
    point, _, nth = spec.partition(":")
    if point != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class Staged:
    """One staged batch: its marker's name and the data files it commits."""

    name: str
    rows: int
    files: tuple[str, ...]
    fragments: tuple[dict, ...] = ()


def marker_rows(name: str) -> int:
    return int(name.rsplit(".", 1)[0].rsplit("-", 1)[1])


def files_of(fragments: Iterable[dict]) -> tuple[str, ...]:
    return tuple(df["path"] for f in fragments for df in f["files"])


class Staging:
    """The staged batches of one table: write, stage, list, commit.

        writer   1. write the batch as Lance data files, uncommitted
                    (`lance.fragment.write_fragments`: invisible to every reader)
                 2. commit them as one `Append`, allowing `DIRECT_RETRIES` retries of
                    a lost manifest race (alone, the first try wins: one writer pays
                    what a plain `table.add` pays);
                 3. lost: write a marker `_staged/traj_<policy>/<time>-<id>-<rows>.json`
                    naming those files, and return. The batch exists exactly when
                    its marker does (written last, atomically; a writer killed
                    before it leaves only unreferenced files). A writer that lost
                    stages its next `BACKOFF` batches without trying (count-based,
                    not timed: under contention a try is mostly a wasted round trip)

        committer  the table's consumer (its trainer, rank 0), in `read_after`: it
                 is the only process that commits other writers' batches, so there
                 is no lock, no lease and no clock. Idempotent after a crash at any
                 instant:
                 a. list markers; open the newest table version
                 b. a marker whose files the table already references was committed
                    by a committer killed before its cleanup: delete it, commit nothing
                 c. commit all the others' fragments as ONE `Append` (one table
                    version: a batch is all-or-nothing, a cursor moves by whole commits)
                 d. delete their markers (on S3 one bulk request for all but the
                    first: `ObjectStore.delete_many`)

    Step (b) needs the committed files of a marker to stay in the table until the
    marker is gone, so compaction leaves those fragments alone (`compact`
    reads the markers after the version it plans on). Two live committers of one
    table would break (b); the trainer is one process per policy whose restarts
    the supervisor serialises, as its ledger and checkpoints already require.
    """

    def __init__(self, root: str, table: str, dataset: Callable[[], Any], *,
                 storage_options: dict[str, str] | None, budget_s: float,
                 facts: FragmentFacts | None = None):
        self.objects = ObjectStore(root, retry_budget_s=budget_s)
        self.rel = f"{STAGED}/{table}"
        self.table = table
        self.dataset = dataset  # the newest version of the table's Lance dataset
        self.opts = storage_options or None
        self.budget_s = budget_s
        #: The table's per-fragment data files, parsed once per fragment (`_lance`).
        self.facts = facts if facts is not None else FragmentFacts()
        self._skip = 0
        #: The dataset this writer's last commit returned (or last opened): a writer
        #: alone reuses it instead of opening the newest version per append (one
        #: listing and manifest read, 20-50 ms measured here). A commit on an older
        #: version is still exact: Lance rebases an Append over the Appends after it.
        self.current: Any = None
        #: The dataset the committer's last commit returned (None: none this call).
        self.committed: Any = None

    def _call(self, fn: Callable[[], Any], what: str) -> Any:
        return retry.call(fn, what=f"{what} of table {self.table!r} at {self.objects.uri}",
                          budget_s=self.budget_s)

    # -- writer side ------------------------------------------------------------
    def write_data(self, ds: Any, batch: pa.Table, schema: pa.Schema) -> tuple[dict, ...]:
        """Write `batch` as uncommitted Lance data files; their fragment metadata."""
        from lance.fragment import write_fragments

        frags = self._call(lambda: write_fragments(batch, ds, schema=schema,
                                                   storage_options=self.opts),
                           "writing data files")
        crash_point("staged_data")
        return tuple(f.to_json() for f in frags)

    def try_commit_own(self, ds: Any, fragments: tuple[dict, ...]) -> int | None:
        """Commit our own data files as one Append; None if the manifest race was lost.

        A lost race (`CommitConflictError`) means Lance wrote no manifest, so the
        batch is certainly not in the table and may be staged. Any other error is
        ambiguous and propagates to the caller's retry, which checks first.
        """
        from lance import LanceDataset, LanceOperation
        from lance.commit import CommitConflictError
        from lance.fragment import FragmentMetadata

        op = LanceOperation.Append([FragmentMetadata.from_json(json.dumps(f)) for f in fragments])
        self.current = None  # until this commit answers: a failed try reopens the newest
        try:
            new = LanceDataset.commit(ds, op, read_version=ds.version, max_retries=DIRECT_RETRIES,
                                      storage_options=self.opts)
        except CommitConflictError:
            return None
        self.current = new
        return int(new.version)

    def should_try(self) -> bool:
        """Whether this writer tries its own commit now (see `BACKOFF`)."""
        if self._skip > 0:
            self._skip -= 1
            return False
        return True

    def lost_race(self) -> None:
        self._skip = BACKOFF

    def mark(self, rows: int, fragments: tuple[dict, ...]) -> Staged:
        """Write the marker that makes written data files a staged batch."""
        files = files_of(fragments)
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:12]}-{rows}.json"
        self.objects.put_bytes(f"{self.rel}/{name}", json.dumps(
            {"rows": rows, "files": files, "fragments": fragments}).encode())
        crash_point("staged_marker")
        return Staged(name, rows, files, fragments)

    # -- listing ----------------------------------------------------------------
    def pending(self) -> list[str]:
        """Marker names, oldest first (one listing on S3; locally names only, because
        other processes' temp files come and go while we list)."""
        local = self.objects.local(self.rel)
        if local is None:
            names = self.objects.walk(self.rel)
        else:
            try:
                names = sorted(os.listdir(local))
            except FileNotFoundError:
                return []
        return [n for n in names if n.endswith(".json") and not n.startswith(".") and "/" not in n]

    def pending_rows(self) -> int:
        return sum(marker_rows(n) for n in self.pending())

    def load(self, names: Iterable[str]) -> list[Staged]:
        """The markers still there among `names` (one may be settled meanwhile),
        read all at once (`ObjectStore.get_many`: one GET each, all in flight)."""
        names = list(names)
        got = self.objects.get_many([f"{self.rel}/{n}" for n in names])
        out = []
        for name in names:
            raw = got.get(f"{self.rel}/{name}")
            if raw is not None:
                m = json.loads(raw)
                out.append(Staged(name, int(m["rows"]), tuple(m["files"]), tuple(m["fragments"])))
        return out

    # -- committer side (the table's consumer only) -------------------------------
    def commit_pending(self, names: list[str] | None = None) -> int | None:
        """Settle and commit every staged batch (at most MAX_PER_COMMIT per call) in
        one Append; the new version, or None when nothing needed committing. Safe
        to retry and to crash anywhere: each try looks at the table first.

        `names`: the markers the caller just listed (`pending()`), so a consumer's
        poll lists once, not twice; a retry lists again. After a commit,
        `self.committed` is the dataset it returned, so the caller can read the
        new version without opening the table again (four requests on S3).

        Requests on S3, N markers: LIST (unless given), open the table (4), N GETs
        (all in flight), the Append (about 3), and two deletes: the first marker
        alone (the `settling` crash point), then the rest in one bulk request.
        """
        given = names

        def attempt() -> int | None:
            nonlocal given
            from lance import LanceDataset, LanceOperation
            from lance.fragment import FragmentMetadata

            todo_names = (given if given is not None else self.pending())[:MAX_PER_COMMIT]
            given = None  # a retry lists afresh
            self.committed = None
            if not todo_names:
                return None
            ds = self.dataset()
            staged = self.load(todo_names)
            present = self.facts.files(ds)
            todo = [s for s in staged if not set(s.files) <= present]
            version = None
            if todo:
                frags = [FragmentMetadata.from_json(json.dumps(f))
                         for s in todo for f in s.fragments]
                new = LanceDataset.commit(ds, LanceOperation.Append(frags),
                                          read_version=ds.version, storage_options=self.opts)
                version = int(new.version)
                crash_point("committed")
                self.committed = new
            if staged:
                self.objects.delete_many([f"{self.rel}/{staged[0].name}"])
                crash_point("settling")
                self.objects.delete_many([f"{self.rel}/{s.name}" for s in staged[1:]])
            return version

        return self._call(attempt, "committing staged batches")

    def committed_marked_files(self, ds: Any) -> set[str]:
        """Data files of `ds` that a marker still names (committed, not yet settled).

        Call with `ds` opened BEFORE this lists the markers: a batch in `ds` had its
        marker written before its commit, so it is either listed here or settled."""
        present = self.facts.files(ds)
        return {p for s in self.load(self.pending()) for p in s.files if p in present}
