"""RunView: what a run is doing, read from its store incrementally.

Why incremental: status --watch, the dashboard and the metric follower poll a
live run. Re-reading whole tables every refresh would cost the store (and the
trainer sharing its disk or bucket) more as the run grows. Each refresh reads
every table at most once, and only the commits after the last one it saw, from
the fragments written since (`stores.read`): a refresh late in a long run costs
what one early in it does; a table that did not change costs one listing of its
versions. `reads` counts those reads per table so tests can hold us to it.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from astraflow.context import RunContext
from astraflow.stores.ledger import Progress
from astraflow.stores.read import Cursor, Held
from astraflow.stores.schema import CREATED_AT_VERSION

#: Width of the time bins of `workers_per_pool`, seconds.
BIN_S = 5.0
#: Columns read for every new trajectory row (cheap): who produced it, and when.
LIGHT = ["worker", "region", "created_at"]
#: Columns of the newest episodes shown on the dashboard, read only from the newest
#: fragments (`stores.read.read_after`'s `tail`): token lists are most of a row.
EPISODE = ["traj_id", "group_id", "policy", "behavior_version", "reward", "task_id", "worker",
           "region", "created_at", "extras", "prompt_ids", "completion_ids", "loss_mask"]


def pool_of(worker: str, region: str) -> str:
    """A worker's pool: autoscaled workers are named `<pool>-x<n>` (astraflow.scale);
    others are grouped by the region they reported, or `local`."""
    m = re.match(r"(.+)-x\d+$", worker)
    return m.group(1) if m else (region or "local")


@dataclass
class Series:
    """One metric of one component and policy, in commit order."""

    steps: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def last(self) -> float | None:
        return self.values[-1] if self.values else None

    def trend(self, k: int = 5) -> float | None:
        """Mean of the last `k` points minus the mean of the `k` before them."""
        if len(self.values) < 2:
            return None
        k = min(k, len(self.values) // 2)
        a, b = self.values[-2 * k:-k], self.values[-k:]
        return sum(b) / len(b) - sum(a) / len(a)


@dataclass
class PolicyRows:
    """Light columns of every row of one trajectory table, plus the newest full rows."""

    times: list[float] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)
    pools: list[str] = field(default_factory=list)
    newest: deque = field(default_factory=lambda: deque(maxlen=20))


class RunView:
    """The observable state of one run, refreshed on demand."""

    def __init__(self, ctx: RunContext, *, episodes: int = 20):
        self.ctx = ctx
        self.policies = ctx.flow.policy_names()
        self._ledger = ctx.ledger()
        self._traj = ctx.trajectories()
        self._weights = ctx.weights()
        self.reads: Counter[str] = Counter()
        self.refreshes = 0
        self.refreshed_at = 0.0
        self.series: dict[tuple[str, str, str], Series] = defaultdict(Series)
        """(component, policy, name) -> series. Scale rows use the pool as policy."""
        self.rows: dict[str, PolicyRows] = {
            p: PolicyRows(newest=deque(maxlen=episodes)) for p in self.policies}
        self.progress: dict[str, Progress | None] = {}
        self.versions: dict[str, list[int]] = {}
        self.components: dict[str, dict[str, Any]] | None = None
        self._metrics_at = Cursor()
        self._traj_at = dict.fromkeys(self.policies, Cursor())
        # Each table's dataset held between refreshes: a refresh that finds a table
        # unchanged costs one listing of its versions (`stores.read.Held`).
        self._held_metrics = Held(self._ledger.metrics)
        self._held_traj = {p: Held(self._traj.table(p)) for p in self.policies}
        #: pool -> time bin -> workers with rows in it, kept as rows arrive (BIN_S wide)
        self._bins: dict[str, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))

    # -- reading ---------------------------------------------------------------
    def refresh(self) -> RunView:
        """Read what was committed since the last refresh: each table once."""
        self._read_metrics()
        for p in self.policies:
            self._read_rows(p)
            self.reads[f"progress/{p}"] += 1
            self.progress[p] = self._ledger.progress(p)
            self.reads[f"weights/{p}"] += 1
            self.versions[p] = self._weights.versions(p)
        self._read_components()
        self.refreshes += 1
        self.refreshed_at = time.time()
        return self

    def _read_metrics(self) -> None:
        self.reads["metrics"] += 1
        self._metrics_at, new = self._ledger.metrics_after(self._metrics_at,
                                                           self._held_metrics)
        if new is None or new.num_rows == 0:
            return
        # Column-wise, one group per series (a refresh brings ~25 rows per trainer step,
        # of a few dozen series): Python touches each series once, not each row.
        new = sort_metrics(new)
        labels, idx, code = [], [], np.zeros(new.num_rows, dtype=np.int64)
        for c in ("component", "policy", "name"):  # one integer code per series
            enc = pc.dictionary_encode(new.column(c).combine_chunks())
            labels.append(enc.dictionary.to_pylist())
            idx.append(enc.indices.to_numpy(zero_copy_only=False))
            code = code * len(labels[-1]) + idx[-1]
        order = np.argsort(code, kind="stable")  # grouped by series, commit order kept
        code = code[order]
        starts = np.flatnonzero(np.r_[True, code[1:] != code[:-1]]).tolist()
        steps, times, values = (new.column(c).to_numpy()[order]
                                for c in ("step", "time", "value"))
        for a, b in zip(starts, [*starts[1:], len(code)], strict=True):
            row = int(order[a])
            s = self.series[tuple(lab[int(i[row])] for lab, i in zip(labels, idx, strict=True))]
            s.steps += steps[a:b].tolist()
            s.times += times[a:b].tolist()
            s.values += values[a:b].tolist()

    def _read_rows(self, policy: str) -> None:
        pr = self.rows[policy]
        keep = pr.newest.maxlen or 20
        self.reads[f"traj_{policy}"] += 1
        held = self._held_traj[policy]
        first = self._traj_at[policy] == Cursor()
        self._traj_at[policy], new = self._traj.follow(policy, held, self._traj_at[policy],
                                                       LIGHT, tail=(EPISODE, keep))
        if first:
            new = self._with_retired(policy, new)
        if new is None or new.num_rows == 0:
            return
        new = new.sort_by([(CREATED_AT_VERSION, "ascending")])
        # Column-wise, not row by row in Python: a refresh may bring thousands of rows.
        workers, regions = new.column("worker").to_pylist(), new.column("region").to_pylist()
        micros = new.column("created_at").cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
        times = pc.divide(micros, 1e6).to_pylist()
        pool = {wr: pool_of(*wr) for wr in set(zip(workers, regions, strict=True))}
        pools = [pool[wr] for wr in zip(workers, regions, strict=True)]
        for p, w, b in set(zip(pools, workers, (int(t // BIN_S) for t in times), strict=True)):
            self._bins[p][b].add(w)
        pr.times += times
        pr.workers += workers
        pr.pools += pools
        full = new.filter(pc.is_valid(new.column("traj_id")))
        tail = full.slice(max(0, full.num_rows - keep))
        pr.newest.extend(tail.drop_columns([CREATED_AT_VERSION]).to_pylist())

    def _with_retired(self, policy: str, live: pa.Table | None) -> pa.Table | None:
        """The first read of a table also takes the rows retired before it
        (`TrajectoryStore.retire`): those older than every live row the read returned
        (the live read came first, and a retirement archives a row before the table
        lets it go, so the older archived rows are exactly the ones the live read
        could not see). A view that then pauses longer than the run keeps consumed rows
        live may miss rows retired meanwhile: the page's counts, not the run's data."""
        below = (None if live is None or live.num_rows == 0
                 else pc.min(live.column(CREATED_AT_VERSION)).as_py())
        old = self._traj.retired(policy, LIGHT, below=below)
        if old is None or old.num_rows == 0:
            return live
        old = old.rename_columns([*LIGHT, CREATED_AT_VERSION])
        if live is None:
            return old
        old = old.cast(pa.schema([live.schema.field(n) for n in old.column_names]))
        return pa.concat_tables([old, live], promote_options="default")

    def _read_components(self) -> None:
        path = self.ctx.run_dir / "components.json"
        if not path.exists():
            self.components = None  # a cloud run: no launcher on this machine tracks them
            return
        try:
            self.components = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):  # being replaced this instant: keep the last
            pass

    # -- derived ---------------------------------------------------------------
    def cursors(self) -> tuple[Cursor, ...]:
        """Where each table was read up to: unchanged cursors, no new rows."""
        return (self._metrics_at, *self._traj_at.values())

    def get(self, component: str, policy: str, name: str) -> Series:
        return self.series.get((component, policy, name)) or Series()

    def workers_per_pool(self) -> dict[str, tuple[list[float], list[int]]]:
        """Distinct workers that committed rows in each BIN_S window, per pool (kept
        incrementally: a refresh costs the same early and late in a run)."""
        out = {}
        for pool, bins in self._bins.items():
            lo, hi = min(bins), max(bins)
            xs = list(range(lo, hi + 1))
            out[pool] = ([b * BIN_S for b in xs], [len(bins.get(b, ())) for b in xs])
        return out

    def staged(self, policy: str) -> int:
        """Rows written but staged, not yet in the table: they show once the trainer has
        read (and so committed) them (`store.write_mode: staged`, a flow's default on S3).
        One listing of the markers; not part of `refresh`, whose reads stay one per table."""
        return self._traj.pending(policy)

    def live_workers(self, window_s: float = 60.0) -> dict[str, set[str]]:
        """Workers per pool that committed rows in the last `window_s` of the run."""
        end = max((pr.times[-1] for pr in self.rows.values() if pr.times), default=0.0)
        out: dict[str, set[str]] = defaultdict(set)
        for pr in self.rows.values():
            for t, w, pool in zip(reversed(pr.times), reversed(pr.workers),
                                  reversed(pr.pools), strict=True):
                if t < end - window_s:
                    break
                out[pool].add(w)
        return dict(out)


def sort_metrics(table: pa.Table) -> pa.Table:
    """Metrics rows (as `metrics_after` reads them, with their commit version) in
    commit order, then time: the order they were logged in. A stable sort."""
    return table.sort_by([(CREATED_AT_VERSION, "ascending"), ("time", "ascending")])


def sorted_rows(table: pa.Table) -> list[dict[str, Any]]:
    """`sort_metrics` as one dict per row (the metric sinks' reader)."""
    return sort_metrics(table).to_pylist()
