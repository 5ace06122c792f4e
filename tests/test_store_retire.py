"""Retiring consumed rows (`TrajectoryStore.retire`): the live table's manifest stops
growing with the run's history, and nobody who reads rows sees a difference: the
cursor, `read_range`/`scan`, `count`, the audit's exactly-once check. SIGKILL between
the archive's append and the table's delete loses and duplicates nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from datetime import timedelta

import pytest

from astraflow.stores import TrajectoryStore, _lance
from tests.test_store_staging import ROOT, ROWS, rows


def fill(store: TrajectoryStore, tag: str, n: int) -> None:
    for i in range(n):
        store.append("p", rows(tag, i))


def lineage_runs(store: TrajectoryStore) -> int:
    """Creation-version runs the live table's manifest holds (one per commit it keeps)."""
    ds = _lance.latest_dataset(store.table("p"))
    return sum(len(_lance.row_runs(f.metadata)) for f in ds.get_fragments())


def ids(store: TrajectoryStore, **kw) -> Counter:
    return Counter(store.read_range("p", 0, 2**62, columns=["traj_id"], **kw)
                   .column("traj_id").to_pylist())


def retire_to(uri: str, upto: str) -> None:
    """Child process body: one retirement (killed at `archived` by the test)."""
    TrajectoryStore(uri).retire("p", int(upto))


def spawn_retire(uri: str, upto: int, crash: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ASTRAFLOW_STORE_CRASH_AT": crash}
    code = f"from tests.test_store_retire import retire_to; retire_to({uri!r}, {str(upto)!r})"
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env)


def test_retired_rows_leave_the_manifest_and_every_reader_still_sees_them(tmp_path):
    store = TrajectoryStore(str(tmp_path / "s"))
    fill(store, "a", 30)
    sl = store.read_after("p", 0, min_rows=20 * ROWS, max_rows=20 * ROWS)
    assert sl is not None and sl.num_rows == 20 * ROWS
    before = ids(store)
    assert lineage_runs(store) == 30
    out = store.maintain("p", retain=timedelta(0), retire_upto=sl.end)
    assert out["retired"] == 20 * ROWS and store.retired_upto("p") == sl.end
    # The live table keeps only the 10 unread commits' lineage.
    assert lineage_runs(store) == 10
    assert _lance.latest_dataset(store.table("p")).count_rows() == 10 * ROWS
    # Readers: the union is the same rows, once each; count includes the archive.
    assert ids(store) == before and set(before.values()) == {1}
    assert store.count("p") == 30 * ROWS
    got = store.read_range("p", 0, sl.end, columns=["traj_id"])
    assert got.num_rows == 20 * ROWS
    assert ids(store, where="traj_id LIKE 'a-3-%'") == Counter(f"a-3-{j}" for j in range(ROWS))
    # The cursor reads on exactly where it stopped.
    rest = store.read_after("p", sl.end, min_rows=1)
    assert rest is not None and rest.num_rows == 10 * ROWS
    # Again, further: only the new rows move; nothing twice.
    fill(store, "b", 5)
    assert store.retire("p", rest.end) == 10 * ROWS
    v = store.latest_version("p")
    assert store.retire("p", rest.end) == 0
    assert store.latest_version("p") == v  # nothing left to drop: no empty delete commit
    assert sum(ids(store).values()) == 35 * ROWS and set(ids(store).values()) == {1}
    assert lineage_runs(store) == 5


def test_a_row_committed_twice_is_not_hidden_by_the_union(tmp_path):
    """Mid-retirement a row is in both tables with one version and counts once; the same
    traj_id committed again (another version) is a duplicate the audit must see."""
    store = TrajectoryStore(str(tmp_path / "s"))
    fill(store, "a", 3)
    store.retire("p", store.latest_version("p"))
    store.append("p", rows("a", 0))  # the same batch again: a double commit
    assert ids(store)["a-0-0"] == 2


@pytest.mark.slow
def test_killed_between_archive_and_delete_loses_and_duplicates_nothing(tmp_path):
    uri = str(tmp_path / "s")
    store = TrajectoryStore(uri)
    fill(store, "a", 12)
    upto = store.read_after("p", 0, min_rows=8 * ROWS, max_rows=8 * ROWS).end
    assert spawn_retire(uri, upto, crash="archived").wait(120) == -9
    store = TrajectoryStore(uri)
    # Archived, not yet deleted: in both tables, counted once by every reader...
    assert store.retired_upto("p") == upto
    assert _lance.latest_dataset(store.table("p")).count_rows() == 12 * ROWS
    assert sum(ids(store).values()) == 12 * ROWS and set(ids(store).values()) == {1}
    # ...and the next retirement only deletes.
    assert store.retire("p", upto) == 0
    assert _lance.latest_dataset(store.table("p")).count_rows() == 4 * ROWS
    assert sum(ids(store).values()) == 12 * ROWS and set(ids(store).values()) == {1}
    assert store.count("p") == 12 * ROWS


def test_checkpoints_bound_what_may_retire(tmp_path):
    """The launcher retires only behind the oldest checkpoint's cursor: a trainer that
    restarts from any complete checkpoint re-reads rows the live table still holds."""
    from astraflow.stores import CheckpointStore

    ck = CheckpointStore(str(tmp_path / "c"))
    assert ck.oldest_cursor("p") == 0
    ck.save("p", 10, {"m.json": b"{}"}, {"steps_done": 10, "cursor": 40})
    ck.save("p", 20, {"m.json": b"{}"}, {"steps_done": 20, "cursor": 90})
    assert ck.oldest_cursor("p") == 40
    ck.prune("p", keep_last=1)
    assert ck.oldest_cursor("p") == 90
