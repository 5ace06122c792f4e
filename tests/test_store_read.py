"""The store's public read API (stores/read.py): a follower reads only what is new.

`read_after` touches only the fragments written since its cursor, skips a compaction's
rewrite of rows it already read, and its deltas, summed, are the whole table.
"""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa

from astraflow.stores import _lance
from astraflow.stores.read import Cursor, Held, read_after


def test_cursor_reads_only_fragments_written_since_even_across_compaction(tmp_path,
                                                                       monkeypatch):
    schema = pa.schema([("i", pa.int64())])
    table = _lance.open_or_create(_lance.connect(tmp_path / "db"), "t", schema)

    def add(*xs: int) -> None:
        for x in xs:  # one commit, one fragment each
            _lance.append(table, pa.table({"i": [x]}, schema=schema), where="test")

    scanned: list[int] = []  # fragments handed to each scan
    real = _lance.latest_dataset

    class Spy:
        def __init__(self, ds):
            self.ds = ds

        def __getattr__(self, name):
            return getattr(self.ds, name)

        def scanner(self, **kw):
            scanned.append(len(kw["fragments"]))
            return self.ds.scanner(**kw)

    monkeypatch.setattr(_lance, "latest_dataset", lambda t: Spy(real(t)))
    add(0, 1, 2, 3, 4)
    cur, rows = read_after(table, Cursor(), ["i"])
    assert rows["i"].to_pylist() == [0, 1, 2, 3, 4] and scanned == [5]
    assert read_after(table, cur, ["i"]) == (cur, None) and scanned == [5]
    add(5, 6)
    cur, rows = read_after(table, cur, ["i"])
    assert sorted(rows["i"].to_pylist()) == [5, 6] and scanned[-1] == 2  # not the 5 old ones
    # Compaction rewrites old rows into a fragment with a new, higher id: the next read
    # scans it, but its rows keep their creating versions and are filtered out.
    _lance.maintain(table)
    assert len(real(table).get_fragments()) < 7
    add(7)
    cur, rows = read_after(table, cur, ["i"])
    assert rows["i"].to_pylist() == [7]
    add(8)
    cur, rows = read_after(table, cur, ["i"])
    assert rows["i"].to_pylist() == [8] and scanned[-1] == 1  # back to the new one alone
    assert cur.version == int(real(table).version)
    # `tail`: the newest fragments holding 2 rows also give the extra column; each new
    # fragment is still scanned once.
    table.add_columns({"sq": "i * i"})
    cur = Cursor(int(real(table).version), cur.fragment)
    add_sq = pa.schema([("i", pa.int64()), ("sq", pa.int64())])
    for x in (9, 10, 11):
        _lance.append(table, pa.table({"i": [x], "sq": [x * x]}, schema=add_sq), where="test")
    n = len(scanned)
    cur, rows = read_after(table, cur, ["i"], tail=(["sq"], 2))
    got = sorted(zip(rows["i"].to_pylist(), rows["sq"].to_pylist(), strict=True))
    assert got == [(9, None), (10, 100), (11, 121)] and sorted(scanned[n:]) == [1, 2]


def test_held_delta_reads_equal_a_full_read_across_appends_and_compactions(tmp_path,
                                                                           monkeypatch):
    """A follower's deltas, summed, are the table: no row missed, none twice, while the
    table grows between reads and compaction rewrites rows already read (skipped: not
    scanned at all) or read and unread ones together (scanned once, filtered)."""
    import lance

    schema = pa.schema([("i", pa.int64()), ("tok", pa.string())])
    table = _lance.open_or_create(_lance.connect(tmp_path / "db"), "t", schema)
    held, cur, seen, n = Held(table), Cursor(), [], 0
    scans: list[tuple[int, str | None]] = []  # (fragments, filter) of each scan
    real = lance.LanceDataset.scanner

    def spy(self, *a, **kw):
        scans.append((len(kw.get("fragments") or ()), kw.get("filter")))
        return real(self, *a, **kw)

    monkeypatch.setattr(lance.LanceDataset, "scanner", spy)

    def add(*sizes: int) -> None:  # one commit (one fragment) per size
        nonlocal n
        for k in sizes:
            rows = list(range(n, n + k))
            n += k
            _lance.append(table, pa.table({"i": rows, "tok": [f"t{x}" for x in rows]},
                                          schema=schema), where="test")

    def read() -> pa.Table | None:
        nonlocal cur
        k = len(scans)
        cur, rows = read_after(held, cur, ["i"], tail=(["tok"], 3))
        if rows is not None:
            seen.extend(rows["i"].to_pylist())
            toks = [t for t in rows["tok"].to_pylist() if t is not None]
            assert len(toks) >= min(3, rows.num_rows)  # the newest rows come in full
            assert all(t == f"t{i}" for i, t in zip(rows["i"].to_pylist(),
                                                      rows["tok"].to_pylist(), strict=True)
                       if t is not None)
        del scans[:k]
        return rows

    def compact() -> None:
        stats = _lance.compact(table, lambda ds: set(), retain=timedelta(0))
        assert stats["fragments"] == 1

    def check() -> None:
        full = _lance.latest_dataset(table).to_table(columns=["i"])["i"].to_pylist()
        assert sorted(seen) == sorted(full) == list(range(n))  # every row, once

    add(2, 3, 1)
    assert read().num_rows == 6 and all(f is None for _, f in scans)  # appends: no filter
    check()
    assert read() is None and scans == []  # nothing new: nothing scanned
    add(4, 1)
    assert read().num_rows == 5 and all(f is None for _, f in scans)
    # A compaction of rows already read only: its fragment is passed over, unread.
    compact()
    assert read() is None and scans == []
    add(2)
    assert read().num_rows == 2 and [c for c, _ in scans] == [1]
    check()
    # Unread rows compacted together with read ones: one scan of that fragment, filtered.
    add(3, 2)
    compact()
    rows = read()
    assert rows.num_rows == 5 and sum(c for c, _ in scans) == 1
    assert all(f is not None for _, f in scans)
    check()
    # ...and back to plain appends, unfiltered; a fresh follower reads the whole table once.
    add(1, 1, 1, 1)
    assert read().num_rows == 4 and all(f is None for _, f in scans)
    check()
    _, rows = read_after(Held(table), Cursor(), ["i"])
    assert sorted(rows["i"].to_pylist()) == list(range(n))
