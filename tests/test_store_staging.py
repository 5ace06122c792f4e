"""Staged appends (stores/staging.py): exactly once, with real SIGKILLs.

Writers and the committer (the table's consumer) are real processes killed with
SIGKILL at named points through the `ASTRAFLOW_STORE_CRASH_AT` hook (no timing
windows to hunt for); then a fresh reader checks that every batch is in the
table whole or not at all, that every acknowledged batch is there exactly once,
and that a reader's cursor sees each row exactly once. A lost manifest race is
forced by making Lance's commit raise its own CommitConflictError, not by
hoping two processes collide.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from astraflow.stores import TrajectoryStore

ROOT = Path(__file__).resolve().parent.parent
ROWS = 8


def rows(tag: str, i: int) -> list[dict]:
    now = datetime.now(UTC)
    return [{"traj_id": f"{tag}-{i}-{j}", "group_id": f"{tag}-{i}", "policy": "p",
             "behavior_version": 0, "prompt_ids": [1, 2], "completion_ids": [3, 4],
             "behavior_logprobs": [-0.1, -0.2], "loss_mask": [1, 1], "reward": 1.0,
             "env": "math", "task_id": "t", "worker": tag, "region": "local",
             "created_at": now, "extras": "{}"} for j in range(ROWS)]


def write(uri: str, tag: str, batches: int | str, acks: str, mode: str = "auto") -> None:
    """Child process body: append `batches` batches, logging each acknowledged one."""
    store = TrajectoryStore(uri, write_mode=mode)  # type: ignore[arg-type]
    with open(acks, "a") as f:
        for i in range(int(batches)):
            v = store.append("p", rows(tag, i))
            f.write(json.dumps({"batch": f"{tag}-{i}", "version": v}) + "\n")
            f.flush()


def commit(uri: str) -> None:
    """Child process body: the consumer's read, which commits whatever is staged."""
    TrajectoryStore(uri).read_after("p", 0, min_rows=1)


def spawn(fn: str, *args: str, crash: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("ASTRAFLOW_STORE_CRASH_AT", None)
    if crash:
        env["ASTRAFLOW_STORE_CRASH_AT"] = crash
    code = f"from tests.test_store_staging import {fn}; {fn}(*{list(args)!r})"
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env)


def acked(path: Path) -> list[str]:
    return [json.loads(x)["batch"] for x in path.read_text().splitlines()] if path.exists() else []


def batches_in(store: TrajectoryStore) -> Counter:
    """Rows per batch in the table, after committing anything still staged."""
    store.commit_staged("p")
    ids = store.read_range("p", 0, 2**62, columns=["traj_id"]).column("traj_id").to_pylist()
    assert len(ids) == len(set(ids)), "a row is in the table twice"
    return Counter(i.rsplit("-", 1)[0] for i in ids)


def stage(uri: str, tags: list[str]) -> None:
    """Staged batches nobody has committed yet: what writers that died right after
    their marker leave (a real SIGKILL there: the test below; here in-process, since a
    `staged` writer never commits)."""
    store = TrajectoryStore(uri, write_mode="staged")
    for tag in tags:
        assert store.append("p", rows(tag, 0)) is None


@pytest.mark.parametrize("mode", ["auto", "staged"])
def test_writer_killed_after_its_data_files_leaves_no_batch(tmp_path, mode):
    uri, log = str(tmp_path / "s"), tmp_path / "acks"
    TrajectoryStore(uri).table("p")
    assert spawn("write", uri, "k", "1", str(log), mode, crash="staged_data").wait(120) == -9
    store = TrajectoryStore(uri)
    assert store.pending("p") == 0 and batches_in(store) == {}
    store.append("p", rows("b", 0))
    assert batches_in(store) == {"b-0": ROWS}


def test_writer_killed_after_its_marker_is_committed_once_by_the_consumer(tmp_path):
    uri, log = str(tmp_path / "s"), tmp_path / "acks"
    assert spawn("write", uri, "k", "1", str(log), "staged",
                 crash="staged_marker").wait(120) == -9
    store = TrajectoryStore(uri)
    assert store.pending("p") == ROWS and store.count("p") == ROWS  # backlog while staged
    assert store.count_after("p", 0) == ROWS
    sl = store.read_after("p", 0, min_rows=1)
    assert sl is not None and sl.num_rows == ROWS and store.pending("p") == 0
    assert batches_in(store) == {"k-0": ROWS} and store.count("p") == ROWS


def test_committer_killed_after_commit_is_settled_not_recommitted(tmp_path):
    uri = str(tmp_path / "s")
    stage(uri, ["w0", "w1", "w2"])  # three staged batches nobody committed
    store = TrajectoryStore(uri)
    assert store.count("p") == 3 * ROWS and store.count_after("p", 0) == 3 * ROWS
    v0 = store.latest_version("p")
    assert spawn("commit", uri, crash="committed").wait(120) == -9  # dies right after it
    assert store.latest_version("p") == v0 + 1  # one commit carried all three batches
    assert store.pending("p") == 3 * ROWS      # markers still there...
    sl = store.read_after("p", 0, min_rows=1)  # ...the next committer settles them
    assert sl is not None and sl.num_rows == 3 * ROWS and sl.end == v0 + 1
    assert store.pending("p") == 0 and store.latest_version("p") == v0 + 1
    assert store.count("p") == 3 * ROWS


def test_killed_while_settling_then_compaction_leaves_marked_files_alone(tmp_path):
    """A committer dies after deleting one of its markers. Maintenance must not
    rewrite the files the others name (else the next committer, not finding them,
    would commit those batches again); after the settle it compacts them too."""
    uri = str(tmp_path / "s")
    stage(uri, ["w0", "w1", "w2"])  # three staged batches nobody committed
    assert spawn("commit", uri, crash="settling").wait(120) == -9
    store = TrajectoryStore(uri)
    assert store.pending("p") == 2 * ROWS
    store.append("p", rows("x", 0))
    store.append("p", rows("x", 1))
    out = store.maintain("p", retain=timedelta(0))
    assert out["fragments_held"] == 2 and out["fragments"] >= 3
    assert set(batches_in(store)) == {"w0-0", "w1-0", "w2-0", "x-0", "x-1"}
    assert store.pending("p") == 0
    out = store.maintain("p", retain=timedelta(0))
    assert out["fragments"] == 1 and out["fragments_held"] == 0 and out["versions"] <= 2
    assert sum(batches_in(store).values()) == 5 * ROWS


def test_lost_race_stages_and_the_consumer_commits_it_once(tmp_path, monkeypatch):
    """The writer's own commit loses the manifest race (Lance's CommitConflictError:
    no manifest written): the batch is staged, not retried, and the next batches
    skip the try (BACKOFF) and are staged too."""
    import lance
    from lance.commit import CommitConflictError

    from astraflow.stores import staging

    store = TrajectoryStore(tmp_path / "s", write_mode="auto")
    v1 = store.append("p", rows("a", 0))  # uncontended: committed by the writer
    assert v1 is not None
    real, calls = lance.LanceDataset.commit, []

    def lose(*args, **kwargs):
        calls.append(kwargs.get("max_retries"))
        if len(calls) == 1:
            raise CommitConflictError("lost the race")
        return real(*args, **kwargs)

    monkeypatch.setattr(lance.LanceDataset, "commit", staticmethod(lose))
    assert store.append("p", rows("b", 0)) is None
    assert calls == [staging.DIRECT_RETRIES]
    assert all(store.append("p", rows("c", i)) is None for i in range(staging.BACKOFF))
    assert len(calls) == 1  # backed off: no try
    assert store.pending("p") == (1 + staging.BACKOFF) * ROWS
    sl = store.read_after("p", v1, min_rows=1)
    assert sl is not None and sl.num_rows == (1 + staging.BACKOFF) * ROWS
    assert store.append("p", rows("d", 0)) is not None  # tries again after the backoff
    assert batches_in(store) == {"a-0": ROWS, "b-0": ROWS, "d-0": ROWS,
                                 **{f"c-{i}": ROWS for i in range(staging.BACKOFF)}}


def test_ambiguous_commit_failure_is_not_committed_twice(tmp_path, monkeypatch):
    """The commit lands but its answer is lost (a reset connection): the retry finds
    the batch in the table and neither commits nor stages it again."""
    import lance

    store = TrajectoryStore(tmp_path / "s", write_mode="auto")
    store.table("p")
    real, calls = lance.LanceDataset.commit, []

    def flaky(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            raise OSError("connection reset after the commit landed")
        return out

    monkeypatch.setattr(lance.LanceDataset, "commit", staticmethod(flaky))
    v = store.append("p", rows("a", 0))
    assert len(calls) == 1 and store.pending("p") == 0  # the retry found it there
    assert batches_in(store) == {"a-0": ROWS}
    assert v is not None and store.read_after("p", 0).end == v


def test_compaction_keeps_cursors_and_bounds_fragments(tmp_path):
    store = TrajectoryStore(tmp_path / "s", write_mode="auto")
    vs = [store.append("p", rows("a", i)) for i in range(12)]
    assert all(v is not None for v in vs)
    before = store.read_after("p", vs[4], columns=["traj_id"]).rows.column("traj_id").to_pylist()
    out = store.maintain("p", retain=timedelta(0))
    assert out["fragments"] == 1 and out["versions"] <= 2
    after = store.read_after("p", vs[4], columns=["traj_id"]).rows.column("traj_id").to_pylist()
    assert sorted(after) == sorted(before) and len(after) == 7 * ROWS
    sl = store.read_after("p", vs[4], min_rows=ROWS, max_rows=ROWS)
    assert sl.end == vs[5]  # still cut on commit boundaries after compaction
    assert store.count_after("p", vs[4]) == 7 * ROWS


@pytest.mark.slow
def test_many_writers_killed_at_random_points_reader_sees_each_row_once(tmp_path):
    """8 writer processes (half always staging), half SIGKILLed at some point of some
    batch and restarted, while the consumer follows its cursor (committing what is
    staged) and maintenance compacts: every acknowledged row exactly once."""
    uri = str(tmp_path / "s")
    store = TrajectoryStore(uri)
    store.table("p")
    rng = random.Random(7)
    logs = {f"w{i}": tmp_path / f"acks-w{i}" for i in range(8)}
    procs = {}
    for i, tag in enumerate(logs):
        mode = "staged" if i % 4 >= 2 else "auto"
        point = "staged_marker" if mode == "staged" and i % 8 >= 4 else "staged_data"
        crash = f"{point}:{rng.randint(1, 5)}" if i % 2 else None
        procs[tag] = spawn("write", uri, tag, "8", str(logs[tag]), mode, crash=crash)
    restarted = set()
    seen: list[str] = []
    # The deadline only guards against a hang: the loop ends when the writers have and
    # every row is read (a loaded 2-core machine may need minutes).
    cursor, deadline, last_maint = 0, time.time() + 900, time.time()
    while time.time() < deadline:
        for tag, p in list(procs.items()):
            if p.poll() == -9 and tag not in restarted:  # restart under a new name
                restarted.add(tag)
                procs[tag + "r"] = spawn("write", uri, tag + "r", "3", str(logs[tag]) + "r")
        sl = store.read_after("p", cursor, min_rows=1, max_rows=64, columns=["traj_id"])
        if sl is not None:
            seen += sl.rows.column("traj_id").to_pylist()
            cursor = sl.end
        elif all(p.poll() is not None for p in procs.values()) and not store.pending("p"):
            break
        if time.time() - last_maint > 3:
            # Retire what the reader has read, as the launcher does behind its checkpoints.
            store.maintain("p", retain=timedelta(0), retire_upto=cursor)
            last_maint = time.time()
    assert all(p.poll() is not None for p in procs.values())
    assert sum(p.returncode == -9 for p in procs.values()) == 4
    assert len(seen) == len(set(seen)), "the reader saw a row twice"
    per = Counter(i.rsplit("-", 1)[0] for i in seen)
    assert all(n == ROWS for n in per.values()), "a batch arrived partially"
    acks = {b for path in logs.values() for b in acked(path) + acked(Path(str(path) + "r"))}
    assert acks <= set(per), f"acknowledged batches lost: {sorted(acks - set(per))}"
    assert sorted(seen) == sorted(store.read_range("p", 0, 2**62, columns=["traj_id"])
                                  .column("traj_id").to_pylist())


def test_staged_appends_on_s3(s3_env, tmp_path):
    """Writer processes on the S3-protocol server, one always staging: the consumer
    commits the staged batches, every batch lands once, compaction bounds fragments."""
    uri, log = f"s3://{s3_env}/g", tmp_path / "acks"
    TrajectoryStore(uri).table("p")
    ps = [spawn("write", uri, f"s{i}", "3", str(log), "staged" if i == 0 else "auto")
          for i in range(3)]
    assert all(p.wait(300) == 0 for p in ps)
    store = TrajectoryStore(uri)
    assert store.pending("p") >= 3 * ROWS
    sl = store.read_after("p", 0, min_rows=1)
    assert sl is not None and sl.num_rows == 9 * ROWS and store.pending("p") == 0
    got = batches_in(store)
    assert set(got) == {f"s{i}-{j}" for i in range(3) for j in range(3)} == set(acked(log))
    assert all(n == ROWS for n in got.values())
    assert store.maintain("p", retain=timedelta(0))["fragments"] == 1


@pytest.mark.parametrize("point", ["committed", "settling"])
def test_committer_killed_on_s3_settles_once(s3_env, point):
    """The committer's S3 path (markers read with one GET each, all in flight, and
    deleted in bulk requests) killed after its commit or after its first delete: the
    next committer settles the rest and commits nothing twice."""
    uri = f"s3://{s3_env}/c"
    stage(uri, ["w0", "w1", "w2"])
    store = TrajectoryStore(uri)
    v0 = store.latest_version("p")
    assert spawn("commit", uri, crash=point).wait(120) == -9
    assert store.latest_version("p") == v0 + 1
    assert store.pending("p") == (3 if point == "committed" else 2) * ROWS
    sl = store.read_after("p", 0, min_rows=1)
    assert sl is not None and sl.num_rows == 3 * ROWS and sl.end == v0 + 1
    assert store.pending("p") == 0 and store.latest_version("p") == v0 + 1
    assert batches_in(store) == {"w0-0": ROWS, "w1-0": ROWS, "w2-0": ROWS}


def test_bulk_reads_and_deletes_on_s3(s3_env):
    """`ObjectStore.get_many` / `delete_many`: missing keys are skipped, nothing else
    is touched, and no empty folder marker is left behind (pyarrow's delete made one)."""
    from astraflow.stores.objects import ObjectStore

    objects = ObjectStore(f"s3://{s3_env}/pre/fix")
    for i in range(5):
        objects.put_bytes(f"m/{i}.json", str(i).encode())
    objects.put_bytes("keep.json", b"k")
    got = objects.get_many([f"m/{i}.json" for i in range(6)])
    assert got == {f"m/{i}.json": str(i).encode() for i in range(5)}
    objects.delete_many([f"m/{i}.json" for i in range(6)])
    assert objects.walk() == ["keep.json"] and objects.get_many(["m/0.json"]) == {}
