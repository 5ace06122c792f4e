"""Metric sinks: TensorBoard event files and Weights & Biases, fed from the metrics table.

Every component logs its metrics to the store's `metrics` table; the sinks follow
that table by commit version (no row missed or seen twice, whatever the writers'
clocks) from one process: the local launcher during a run, or `astraflow export`
from any machine that reads the store. So a sink can never slow down a trainer or
worker, a run is one W&B run, and TensorBoard gets one sub-folder per component
kind (each event file's steps only grow). Names (tags and keys), per policy:

    trainer   <policy>/<name>            e.g. solver/reward_mean   step: trainer step
    eval      <policy>/eval/<name>       e.g. solver/eval/heldout_accuracy   step: version
    rollout   <policy>/rollout/<name>    step: the policy's rollout batch, in commit order
    scale     scale/<pool>/<name>        step: decision, in commit order
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from astraflow.context import RunContext
from astraflow.stores.read import Cursor, Held
from astraflow.stores.schema import CREATED_AT_VERSION

log = logging.getLogger("astraflow.observe")

#: Consecutive failures after which a sink is switched off for the rest of the run.
MAX_FAILURES = 3


@dataclass(frozen=True)
class Point:
    component: str
    policy: str
    step: int
    """The sink's step (see the module docstring); `logged_step` is the row's own."""
    logged_step: int
    time: float
    name: str
    value: float
    commit: int

    @property
    def tag(self) -> str:
        if self.component == "trainer":
            return f"{self.policy}/{self.name}"
        if self.component == "scale":
            return f"scale/{self.policy}/{self.name}"
        if self.component == "worker":  # keyed by the worker's id, not a policy
            return f"workers/{self.policy}/{self.name}"
        return f"{self.policy}/{self.component}/{self.name}"

    @property
    def step_key(self) -> str:
        """The W&B key of this point's x axis."""
        if self.component == "trainer":
            return f"{self.policy}/step"
        if self.component == "scale":
            return f"scale/{self.policy}/decision"
        if self.component == "worker":
            return f"workers/{self.policy}/step"
        return f"{self.policy}/{self.component}/step"


class Sink(Protocol):
    def write(self, points: list[Point]) -> None: ...
    def close(self) -> None: ...


class TensorBoardSink:
    """Event files under `logdir/<component>/` (tensorboardX's writer: no TensorFlow)."""

    def __init__(self, logdir: str | Path):
        from tensorboardX import SummaryWriter

        self.logdir = Path(logdir)
        self._new = SummaryWriter
        self._writers: dict[str, Any] = {}

    def write(self, points: list[Point]) -> None:
        for p in points:
            w = self._writers.get(p.component)
            if w is None:
                w = self._writers[p.component] = self._new(str(self.logdir / p.component),
                                                           flush_secs=5)
            w.add_scalar(p.tag, p.value, global_step=p.step, walltime=p.time)
        for w in self._writers.values():
            w.flush()

    def close(self) -> None:
        for w in self._writers.values():
            w.close()


class WandbSink:
    """One W&B run for the whole flow; each policy's keys share the `<policy>/` section
    and each series is drawn against its own step key (`define_metric`)."""

    def __init__(self, ctx: RunContext, *, run_id: str | None = None,
                 project: str | None = None):
        import wandb

        self.run = wandb.init(
            project=project or os.environ.get("WANDB_PROJECT") or "astraflow",
            name=ctx.flow.name, id=run_id or wandb_run_id(ctx), resume="allow",
            config=ctx.flow.model_dump(mode="json"), job_type="rl",
            dir=os.environ.get("WANDB_DIR") or str(ctx.run_dir),
            # The launcher's console is the user's progress display: W&B must not wrap it.
            settings=wandb.Settings(console="off"))
        self._defined: set[str] = set()

    def write(self, points: list[Point]) -> None:
        # One log call per (component, policy, step, commit): the points a component
        # logged together stay together.
        groups: dict[tuple, dict[str, float]] = defaultdict(dict)
        for p in points:
            if p.tag not in self._defined:
                self.run.define_metric(p.tag, step_metric=p.step_key)
                self._defined.add(p.tag)
            g = groups[(p.commit, p.component, p.policy, p.step)]
            g[p.tag] = p.value
            g[p.step_key] = p.step
        for values in groups.values():
            self.run.log(values)

    def close(self) -> None:
        self.run.finish()


def wandb_run_id(ctx: RunContext) -> str:
    """Stable per flow and store: a restarted launcher resumes the same W&B run."""
    slug = re.sub(r"[^a-zA-Z0-9_-]", "-", ctx.flow.name)[:40]
    return f"{slug}-{hashlib.sha1(ctx.store_uri.encode()).hexdigest()[:8]}"


class UnknownSink(ValueError):
    """`astraflow export --to` names no sink."""


def export_sink(ctx: RunContext, to: str, *, logdir: Path | None = None,
                run_id: str | None = None) -> tuple[Sink, str]:
    """The sink `astraflow export --to` names, and where it writes. UnknownSink for an
    unknown `to`; ImportError when its library is not installed."""
    if to == "tensorboard":
        out = logdir or ctx.run_dir / "tensorboard-export"
        return TensorBoardSink(out), str(out)
    if to == "wandb":
        import uuid

        sink = WandbSink(ctx, run_id=run_id or f"{wandb_run_id(ctx)}-{uuid.uuid4().hex[:6]}")
        return sink, f"W&B run {sink.run.id}"
    raise UnknownSink(f"--to takes tensorboard or wandb, not {to!r}")


class Follower:
    """Feeds the rows committed to a run's metrics table since the last poll to sinks.

    A sink that raises is logged and retried at the next poll; after MAX_FAILURES
    in a row it is switched off. Nothing a sink does reaches the caller.
    """

    def __init__(self, ctx: RunContext, sinks: Iterable[Sink]):
        self.ctx = ctx
        self.sinks = list(sinks)
        self.failures = [0] * len(self.sinks)
        self.after = Cursor()
        self.points = 0
        self._counters: dict[tuple[str, str], int] = defaultdict(int)
        self._seen: dict[tuple[str, str], tuple[int, float]] = {}
        self._metrics = ctx.ledger()
        self._held = Held(self._metrics.metrics)  # a poll of nothing new: one listing

    def read(self) -> list[Point]:
        """New points, in commit order, with their sink steps assigned."""
        from astraflow.observe.view import sorted_rows

        self.after, new = self._metrics.metrics_after(self.after, self._held)
        if new is None:
            return []
        out = []
        for r in sorted_rows(new):
            comp, pol, commit = r["component"], r["policy"], r[CREATED_AT_VERSION]
            step = int(r["step"])
            # Rollout and scale points are numbered in commit order: TensorBoard drops a
            # point whose step goes back, which several workers' own batch numbers would.
            if comp in ("rollout", "scale"):
                # One batch = the rows of one `log` call: they share its time. A commit
                # may hold several (`store.metrics_every_s` batches a worker's metrics).
                key, batch = (comp, pol), (commit, r["time"])
                if self._seen.get(key) != batch:
                    self._seen[key] = batch
                    self._counters[key] += 1
                step = self._counters[key]
            out.append(Point(comp, pol, step, int(r["step"]), float(r["time"]), r["name"],
                             float(r["value"]), int(commit)))
        return out

    def poll(self) -> int:
        """Forward new points to every live sink; returns how many points were read."""
        try:
            points = self.read()
        except Exception as err:  # the store is away: the next poll reads them
            log.warning("metric sinks: reading metrics failed (%s); will retry", err)
            return 0
        self.points += len(points)
        if points:
            for i, sink in enumerate(self.sinks):
                if sink is None:
                    continue
                try:
                    sink.write(points)
                    self.failures[i] = 0
                except Exception as err:  # noqa: BLE001 - a sink never stops the caller
                    self.failures[i] += 1
                    off = self.failures[i] >= MAX_FAILURES
                    log.warning("metric sink %s failed (%s)%s", type(sink).__name__, err,
                                "; switched off" if off else "; will retry")
                    if off:
                        self.sinks[i] = None  # type: ignore[call-overload]
        return len(points)

    def close(self) -> None:
        self.poll()
        for sink in self.sinks:
            if sink is None:
                continue
            try:
                sink.close()
            except Exception as err:  # noqa: BLE001
                log.warning("closing metric sink %s failed: %s", type(sink).__name__, err)


def tensorboard_dir(ctx: RunContext) -> Path | None:
    """Where the launcher writes event files: $ASTRAFLOW_TENSORBOARD (a folder, or `off`),
    else `<run folder>/tensorboard` — for an s3:// run too, the run folder on this machine."""
    env = os.environ.get("ASTRAFLOW_TENSORBOARD", "")
    if env.lower() in ("off", "0", "false", "no"):
        return None
    return Path(env) if env else ctx.run_dir / "tensorboard"


def wandb_wanted() -> bool:
    """W&B is on when $ASTRAFLOW_WANDB=1, or when WANDB_PROJECT is set (and not
    $ASTRAFLOW_WANDB=0)."""
    flag = os.environ.get("ASTRAFLOW_WANDB", "").lower()
    if flag in ("0", "off", "false", "no"):
        return False
    return flag in ("1", "on", "true", "yes") or bool(os.environ.get("WANDB_PROJECT"))


def launcher_follower(ctx: RunContext) -> Follower:
    """The sinks the local launcher feeds while a run goes on (see tensorboard_dir and
    wandb_wanted). A sink that cannot start is reported and left out; the run goes on."""
    sinks: list[Sink] = []
    tb = tensorboard_dir(ctx)
    if tb is not None:
        try:
            sinks.append(TensorBoardSink(tb))
        except Exception as err:  # noqa: BLE001 - e.g. tensorboardX missing
            log.warning("TensorBoard sink off: %s", err)
    if wandb_wanted():
        try:
            sinks.append(WandbSink(ctx))
        except Exception as err:  # noqa: BLE001 - not installed, not logged in, offline
            log.warning("W&B sink off: %s (pip install -e '.[wandb]'; wandb login or "
                        "WANDB_MODE=offline)", err)
    return Follower(ctx, sinks)
