"""Project seconds per iteration of the async and sync designs on a GPU cluster.

The paper's claim (Solver + Verifier, 212.6 s vs 77.7 s per iteration, 2.74x) is
about a cluster we do not have. So each component's step time is measured on our
machine and the two designs' dependencies are replayed in a deterministic
discrete-event simulation (`astraflow.policies.events`). Every number is a measured
input or a stated assumption (`assumptions()`); nothing is fitted to the paper. The
async worker replays the real one's stall-aware admission: each batch it calls
`astraflow.rollout.admission.admit` (the worker's own code, not a copy) to decide
which roles play, so a closed policy's roles are not started (nothing generated for
them, nothing thrown away), a role plays only with the roles it reads, and a role
played while a role reading it is held runs at most `max_lead_batches` ahead. The
model, drawn (worker and trainer loops, admission, the sync baseline):
docs/benchmarks/projection.md.

    python benchmarks/cluster_projection.py measured.json --rollout-devices 4
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Collection, Generator, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from astraflow.policies.events import NOW, Engine, Wait
from astraflow.rollout.admission import Admission, PolicyState, admit, fits

PAPER = {"sync_s_per_iteration": 212.6, "async_s_per_iteration": 77.7, "ratio": 2.74}

#: Named dependency shapes of the built-in workflows (`Workflow.needs`), one role per policy:
#: "solver_alone" is `solver_verifier`'s (every later policy reads the first one's turn; the
#: first reads nothing, so it may play alone), "together" the default `Workflow.needs`, which
#: `judge` keeps (every role reads every other: an episode is played whole or held).
NEEDS_SHAPES = ("solver_alone", "together")


def _time(owner: str, name: str, v: Any, *, positive: bool = False) -> None:
    if (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
            or v < 0 or (positive and v == 0)):
        raise ValueError(f"{owner}.{name} must be a finite number {'>' if positive else '>='} 0 "
                         f"(seconds), got {v!r}")


def _count(owner: str, name: str, v: Any, minimum: int = 1) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"{owner}.{name} must be an integer >= {minimum}, got {v!r}")


def _build(cls: type, d: Any, **override: Any) -> Any:
    """`cls(**d)` with unknown or missing keys reported as ValueError."""
    if not isinstance(d, dict):
        raise ValueError(f"{cls.__name__}: expected a JSON object, got {type(d).__name__}")
    known = {f.name for f in fields(cls)}
    if unknown := sorted(set(d) - known):
        raise ValueError(f"{cls.__name__}: unknown field(s) {unknown}; known: {sorted(known)}")
    try:
        return cls(**{**d, **override})
    except TypeError as err:
        raise ValueError(f"{cls.__name__}: {err}") from None


@dataclass(frozen=True)
class PolicyTimes:
    """One policy's measured step times (on our machine, one device each)."""

    name: str
    gen_s: float  # measured: this policy's turns of ONE batch on one rollout device
    train_s: float  # measured: one trainer step on one batch, one training device
    publish_s: float  # measured: save + publish one weight version (blocks the trainer)
    reload_s: float  # measured: a rollout worker loads one new version of this policy
    publish_every: int = 1  # optimizer steps between publishes
    checkpoint_s: float = 0.0  # measured: one checkpoint (blocks the trainer); how often: Cluster

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"PolicyTimes.name must be a non-empty string, got {self.name!r}")
        for f in ("gen_s", "train_s", "publish_s", "reload_s", "checkpoint_s"):
            _time(f"PolicyTimes({self.name})", f, getattr(self, f))
        _count(f"PolicyTimes({self.name})", "publish_every", self.publish_every)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PolicyTimes:
        return _build(cls, d)


@dataclass(frozen=True)
class Measured:
    """Everything measured: per-policy times plus env wait and per-table append.

    `env_waits` is how many env waits one batch has; the workflow decides it. None
    means the built-in workflows' count: 1 with one policy (`single`: after the
    solver's turn), else 2 (`solver_verifier`, `judge`: after the solver's turn, then
    once after all verifiers judged, however many: their waits overlap). The first wait
    follows the first played turn, the rest follow the other played turns (`batch_phases`).

    `needs` is the workflow's dependency shape, which decides what admission may play
    without what: a shape of `NEEDS_SHAPES` or, per policy, the policies whose turns its
    role reads. The default is `solver_verifier`'s (the flow benchmarks/multi_policy.py
    measures); `judge` is "together". It matters only once a policy closes."""

    policies: tuple[PolicyTimes, ...]  # turn order within an episode (solver first)
    env_wait_s: float = 0.0  # modelled env/tool wait, each; hardware does not shrink it
    append_s: float = 0.0  # appending one batch to one policy's table (one commit)
    env_waits: int | None = None  # env waits per batch; None: 1 if one policy else 2
    needs: str | dict[str, list[str]] = "solver_alone"  # NEEDS_SHAPES, or policy -> reads

    def __post_init__(self) -> None:
        object.__setattr__(self, "policies", tuple(self.policies))
        if not self.policies or not all(isinstance(p, PolicyTimes) for p in self.policies):
            raise ValueError("Measured.policies must be a non-empty sequence of PolicyTimes")
        if len({p.name for p in self.policies}) != len(self.policies):
            raise ValueError(f"Measured.policies: names repeat: {[p.name for p in self.policies]}")
        _time("Measured", "env_wait_s", self.env_wait_s)
        _time("Measured", "append_s", self.append_s)
        if self.env_waits is not None:
            _count("Measured", "env_waits", self.env_waits, minimum=0)
        object.__setattr__(self, "needs", self._checked_needs())

    def _checked_needs(self) -> str | dict[str, list[str]]:
        """`needs` validated; a mapping copied to plain lists (so it survives JSON)."""
        names = [p.name for p in self.policies]
        if isinstance(self.needs, str):
            if self.needs not in NEEDS_SHAPES:
                raise ValueError(f"Measured.needs must be one of {list(NEEDS_SHAPES)} or a "
                                 f"mapping policy -> policies it reads, got {self.needs!r}")
            return self.needs
        if not isinstance(self.needs, Mapping):
            raise ValueError(f"Measured.needs must be one of {list(NEEDS_SHAPES)} or a mapping "
                             f"policy -> policies it reads, got {self.needs!r}")
        if set(self.needs) != set(names):
            raise ValueError(f"Measured.needs must name every policy once ({names}), got "
                             f"{sorted(map(str, self.needs))}")
        out: dict[str, list[str]] = {}
        for name in names:
            reads = self.needs[name]
            if isinstance(reads, str) or not isinstance(reads, Collection):
                raise ValueError(f"Measured.needs[{name!r}] must be a list of policy names, "
                                 f"got {reads!r}")
            if bad := [r for r in reads if r not in names or r == name]:
                raise ValueError(f"Measured.needs[{name!r}]: {bad} are not other policies "
                                 f"of {names}")
            out[name] = list(reads)
        return out

    def needs_of(self) -> dict[str, frozenset[str]]:
        """Per policy (its one role), the policies whose turns it reads: `needs` resolved.
        "solver_alone": the first reads nothing, every other reads the first;
        "together": every other (`Workflow.needs`' default)."""
        names = [p.name for p in self.policies]
        if self.needs == "together":
            return {n: frozenset(names) - {n} for n in names}
        if self.needs == "solver_alone":
            return {n: frozenset() if i == 0 else frozenset(names[:1])
                    for i, n in enumerate(names)}
        assert isinstance(self.needs, dict)
        return {n: frozenset(self.needs[n]) for n in names}

    def waits_per_batch(self) -> int:
        """`env_waits`, or the built-in workflows' count when it is None."""
        if self.env_waits is not None:
            return self.env_waits
        return 1 if len(self.policies) == 1 else 2

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Measured:
        pols = d.get("policies") if isinstance(d, dict) else None
        if not isinstance(pols, list | tuple):
            raise ValueError("Measured: 'policies' must be a list of policy objects")
        return _build(cls, d, policies=tuple(PolicyTimes.from_dict(p) for p in pols))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "policies": [asdict(p) for p in self.policies]}


@dataclass(frozen=True)
class Cluster:
    """The assumed cluster and the code's own knobs (admission, poll intervals)."""

    rollout_devices: int = 4  # async: independent rollout workers, one device each
    trainer_devices: int = 2  # async: devices per policy trainer (data parallel)
    sync_devices: int = 8  # sync baseline: all colocated, every phase uses all of them
    scaling_efficiency: float = 1.0  # one batch over g>1 devices: t / (g * eff); 1.0 favours sync
    max_backlog_batches: int = 2  # admission: a policy is open while its backlog + a batch fits
    max_lead_batches: int = 2  # admission: how far a role may play ahead of a held reader's table
    worker_poll_s: float = 0.05  # worker sleeps this long after a check that admits nothing
    trainer_poll_s: float = 0.02  # trainer re-checks for a full batch this often while idle
    checkpoint_every: int = 10  # trainer.checkpoint_every: every trainer, every c-th step

    def __post_init__(self) -> None:
        for f in ("rollout_devices", "trainer_devices", "sync_devices", "max_backlog_batches",
                  "checkpoint_every"):
            _count("Cluster", f, getattr(self, f))
        _count("Cluster", "max_lead_batches", self.max_lead_batches, minimum=0)  # 0: together
        _time("Cluster", "scaling_efficiency", self.scaling_efficiency, positive=True)
        if self.scaling_efficiency > 1:
            raise ValueError(f"Cluster.scaling_efficiency must be in (0, 1], got "
                             f"{self.scaling_efficiency!r}")
        _time("Cluster", "worker_poll_s", self.worker_poll_s, positive=True)
        _time("Cluster", "trainer_poll_s", self.trainer_poll_s, positive=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cluster:
        return _build(cls, d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def speedup(g: int, eff: float) -> float:
    """Splitting one batch over g devices: 1 on one device, else g * eff."""
    return 1.0 if g == 1 else g * eff


def batch_phases(m: Measured, g: float = 1.0, played: Collection[str] | None = None) -> list[float]:
    """One batch's episodes, in order: the first played policy's turn, an env wait, every
    other played policy's turn, then the remaining env waits (generation sped up g times).
    Where the later waits fall among the later turns does not change a batch's length.

    `played`: the policies whose roles the batch plays (None: all). A batch that plays
    one of several policies skips the later waits: they follow the later turns
    (`solver_verifier` and `judge` wait after their verifiers judged, not when none did)."""
    turns = [p for p in m.policies if played is None or p.name in played]
    if not turns:
        return []
    first, *rest = turns
    waits = m.waits_per_batch()
    later = max(waits - 1, 0) if rest or len(turns) == len(m.policies) else 0
    return [first.gen_s / g, *[m.env_wait_s] * min(waits, 1), *(p.gen_s / g for p in rest),
            *[m.env_wait_s] * later]


@dataclass
class SimResult:
    """One design's steady-state figure and where its time went."""

    design: str  # "async" | "sync"
    seconds_per_iteration: float
    steps: dict[str, int]  # per policy, in the measured window
    trainer_busy_fraction: dict[str, float]  # of the window spent step/publish/checkpoint
    worker_blocked_fraction: float  # async: mean share idle in wait_for_room (not reloads)
    not_started_fraction: dict[str, float]  # async: share of the window's batches that did
    # not start this policy's roles (admission held them: nothing generated, nothing lost)
    wasted_fraction: dict[str, float]  # of the window's batches that generated this policy's
    # turns, the share not appended (fed as input only; none in an endless run)
    peak_backlog: dict[str, int]  # most batches appended, not trained (async: <= B - 1 + R)
    peak_lead: dict[str, int]  # most batches this policy's table held beyond the table of a
    # policy whose role reads it, at batch ends (async: <= L - 1 + R, 0 if L = 0; sync: 0)


@dataclass
class Projection:
    """Both designs on the same inputs, their ratio and the assumptions behind it."""

    measured: Measured
    cluster: Cluster
    sync_result: SimResult
    async_result: SimResult
    ratio: float  # sync / async seconds per iteration
    assumptions: list[str]


def _overlap(spans: list[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)


def _check_run(iterations: int, warmup: int) -> None:
    _count("simulate", "iterations", iterations)
    _count("simulate", "warmup", warmup, minimum=0)


def simulate_async(m: Measured, c: Cluster, iterations: int = 200, warmup: int = 20) -> SimResult:
    """Decoupled design, with the dependencies the code has (see module docstring).

    Seconds per iteration = window / `iterations`, where the window runs from the
    slowest policy's `warmup`-th to its (`warmup` + `iterations`)-th completed step
    (slowest: the longest such window), so each of its counted steps lies wholly in
    it and no trainer can appear faster than its step time. Other policies' steps
    are counted in the same window, and so are the batches `not_started_fraction` and
    `wasted_fraction` count (a batch counts when its last append ends). A step
    completes when its progress is written.

    The run is endless (no `stop.max_steps`), so no trainer is ever *done* and admission
    never feeds a role as input only: every played role is appended."""
    _check_run(iterations, warmup)
    pols, n, eng = m.policies, len(m.policies), Engine()
    # What trainer i's progress file says (version, completed) and what its table holds.
    appended, consumed, completed, version = [0] * n, [0] * n, [0] * n, [0] * n
    done_at: list[list[float]] = [[] for _ in pols]
    busy: list[list[tuple[float, float]]] = [[] for _ in pols]
    idle: list[list[tuple[float, float]]] = [[] for _ in range(c.rollout_devices)]
    open_since: dict[tuple[str, int], float] = {}  # intervals still running at the end
    # (end of a batch, policies it played, policies it appended)
    produced: list[tuple[float, frozenset[str], frozenset[str]]] = []
    peak, lead = [0] * n, [0] * n
    committed = [0] * n  # appended, counting a batch's rows from its last append's end
    full, names = c.max_backlog_batches, [p.name for p in pols]
    cast, needs = {r: r for r in names}, m.needs_of()  # one role per policy
    readers = [[j for j in range(n) if names[i] in needs[names[j]]] for i in range(n)]

    def state(i: int, seen: int) -> PolicyState:
        """`RolloutWorker.policy_state` from the simulator's counters: open when a batch
        fits the backlog bound (weights are always held and fresh enough here), never
        done (an endless run), `batches` = batches appended to its table."""
        return PolicyState(open=fits(appended[i] - seen, 1, full), done=False,
                           batches=float(appended[i]))

    def decide(states: dict[str, PolicyState]) -> Admission:
        return admit(names, cast, lambda r: needs[r], states, c.max_lead_batches)

    def worker(k: int) -> Generator[float | Wait, None, None]:
        held = [0] * n  # the versions this worker has loaded

        def check() -> Generator[float | Wait, None, Admission]:
            """One pass of wait_for_room's loop (`RolloutWorker.admit`): `policy_state(p)`
            for EVERY policy, in turn, then the real `admit` on those states."""
            states = {}
            for i, p in enumerate(pols):
                seen = completed[i]  # policy_state reads the progress file first
                if version[i] != held[i]:  # it names a version we do not hold: load it now
                    held[i] = version[i]
                    yield p.reload_s
                    yield NOW  # see work ending at this very instant, as checks do
                states[p.name] = state(i, seen)  # then counts the table's rows
            return decide(states)

        def check_differs() -> bool:
            """Would a check now reload something or play something? Otherwise it would
            fail instantly and change nothing, so the engine may skip it."""
            return (any(version[i] != held[i] for i in range(n))
                    or bool(decide({p.name: state(i, completed[i])
                                    for i, p in enumerate(pols)}).play))

        def waiting(cmd: float | Wait) -> Generator[float | Wait, None, None]:
            open_since["w", k] = t0 = eng.now
            yield cmd
            idle[k].append((t0, eng.now))
            del open_since["w", k]

        while True:
            # wait_for_room: check at once; while no role can play, sleep poll_s, check again.
            yield from waiting(Wait(check_differs, c.worker_poll_s))
            while not (adm := (yield from check())).play:
                yield from waiting(c.worker_poll_s)  # the sleep starts when the check ended
                yield from waiting(Wait(check_differs, c.worker_poll_s))
            # Only the admitted roles generate: a held role is not started at all.
            yield from batch_phases(m, played=adm.play)  # one device; shared state untouched
            kept = [i for i in range(n) if names[i] in adm.keep]
            for i in kept:  # one commit per kept policy, in turn
                yield m.append_s
                appended[i] += 1  # visible to trainer i and to every check from now
                peak[i] = max(peak[i], appended[i] - completed[i])
            for i in kept:
                committed[i] += 1
            for i in range(n):  # how far each table now runs ahead of its readers'
                lead[i] = max(lead[i], *(committed[i] - committed[j] for j in readers[i]), 0)
            produced.append((eng.now, adm.play, adm.keep))

    def trainer(i: int, p: PolicyTimes) -> Generator[float | Wait, None, None]:
        step_s, steps = p.train_s / speedup(c.trainer_devices, c.scaling_efficiency), 0
        while True:
            yield Wait(lambda: appended[i] > consumed[i], c.trainer_poll_s)
            consumed[i] += 1
            open_since["t", i] = t0 = eng.now
            yield step_s
            steps += 1
            published = steps % p.publish_every == 0
            if published:
                yield p.publish_s  # not split
            # train_on writes progress now (nothing between publish and it takes time):
            # workers see the new version and the freed backlog together.
            version[i] += published
            completed[i] += 1
            done_at[i].append(eng.now)
            if steps % c.checkpoint_every == 0:
                yield p.checkpoint_s  # after progress: blocks this trainer only
            busy[i].append((t0, eng.now))
            del open_since["t", i]

    for k in range(c.rollout_devices):
        eng.spawn(worker(k))
    for i, p in enumerate(pols):
        eng.spawn(trainer(i, p))
    total = warmup + iterations
    eng.run(lambda: min(completed) >= total)
    for (kind, j), t0 in open_since.items():
        (idle if kind == "w" else busy)[j].append((t0, eng.now))

    def at(i: int, k: int) -> float:
        return done_at[i][k - 1] if k else 0.0

    q = max(range(n), key=lambda i: at(i, total) - at(i, warmup))
    start, end = at(q, warmup), at(q, total)
    window = end - start
    frac = (lambda s: _overlap(s, start, end) / window) if window > 0 else (lambda s: 0.0)
    made = [(play, keep) for t, play, keep in produced if start < t <= end]

    def wasted(name: str) -> float:
        generated = [keep for play, keep in made if name in play]
        return sum(name not in keep for keep in generated) / len(generated) if generated else 0.0

    return SimResult(
        "async", window / iterations,
        {p.name: sum(start < t <= end for t in done_at[i]) for i, p in enumerate(pols)},
        {p.name: frac(busy[i]) for i, p in enumerate(pols)},
        sum(frac(b) for b in idle) / c.rollout_devices,
        {p.name: sum(p.name not in play for play, _ in made) / len(made) if made else 0.0
         for p in pols},
        {p.name: wasted(p.name) for p in pols},
        {p.name: peak[i] for i, p in enumerate(pols)},
        {p.name: lead[i] for i, p in enumerate(pols)})


def simulate_sync(m: Measured, c: Cluster, iterations: int = 200, warmup: int = 20) -> SimResult:
    """Trainer-centred baseline (`run_sync`): one strictly sequential loop per iteration."""
    _check_run(iterations, warmup)
    g, n = speedup(c.sync_devices, c.scaling_efficiency), len(m.policies)
    version, held, steps, busy = [0] * n, [0] * n, [0] * n, [0.0] * n
    now = start = 0.0
    for it in range(warmup + iterations):
        if it == warmup:
            start, busy = now, [0.0] * n
        for i, p in enumerate(m.policies):  # refresh_weights: only what changed
            if version[i] != held[i]:
                held[i] = version[i]
                now += p.reload_s
        for d in batch_phases(m, g):
            now += d
        now += m.append_s * n
        for i, p in enumerate(m.policies):  # train_on of each trainer in turn
            t0 = now
            now += p.train_s / g
            steps[i] += 1
            if steps[i] % p.publish_every == 0:
                now += p.publish_s
                version[i] += 1
            if steps[i] % c.checkpoint_every == 0:
                now += p.checkpoint_s  # blocks the whole loop
            busy[i] += now - t0
    window = now - start
    names = [p.name for p in m.policies]
    return SimResult("sync", window / iterations, dict.fromkeys(names, iterations),
                     {p.name: busy[i] / window if window else 0.0
                      for i, p in enumerate(m.policies)}, 0.0,
                     dict.fromkeys(names, 0.0),  # plays every role every batch
                     dict.fromkeys(names, 0.0),  # appends every row it generates
                     dict.fromkeys(names, 1),  # appends a batch, then trains it
                     dict.fromkeys(names, 0))  # every table grows together


def assumptions(m: Measured, c: Cluster) -> list[str]:
    """Every figure the projection uses, labelled MEASURED (input) or ASSUMED."""
    n, waits = len(m.policies), m.waits_per_batch()
    whose = ("as set" if m.env_waits is not None
             else "the workflow's: `single` once; `solver_verifier` and `judge` after the "
                  "solver, then once after all verifiers (their waits overlap)")
    reads = "; ".join(f"{k} reads {', '.join(sorted(v)) or 'nothing'}"
                      for k, v in m.needs_of().items())
    shape = (f"{m.needs!r}, " + {"solver_alone": "`solver_verifier`'s",
                                 "together": "`judge`'s and `Workflow.needs`' default"}[m.needs]
             if isinstance(m.needs, str) else "as set")
    overshoot = (f"lead to at most {c.max_lead_batches - 1} + {c.rollout_devices}"
                 if c.max_lead_batches else "no lead: with 0 those roles play only together")
    lines = [f"MEASURED {p.name}: generate {p.gen_s:g} s per batch on one device; train "
             f"{p.train_s:g} s per step on one device; publish {p.publish_s:g} s every "
             f"{p.publish_every} step(s); reload {p.reload_s:g} s per new version; checkpoint "
             f"{p.checkpoint_s:g} s every {c.checkpoint_every} step(s)"
             for p in m.policies]
    return lines + [
        f"MEASURED append {m.append_s:g} s per policy table per batch (one commit each, in turn)",
        f"ASSUMED env/tool wait {m.env_wait_s:g} s, {waits} per batch ({whose}): the first "
        f"after the first played turn, the rest after the other played turns (none when a "
        "batch plays one of several policies); not shrunk by hardware "
        "(serial in sync; overlapped across workers in async)",
        f"ASSUMED workflow dependencies ({shape}): {reads}",
        f"ASSUMED async cluster: {c.rollout_devices} rollout devices (one worker each, a batch "
        f"never split) + {c.trainer_devices} device(s) per trainer x {n} policies = "
        f"{c.rollout_devices + c.trainer_devices * n} devices",
        f"ASSUMED sync cluster: {c.sync_devices} colocated devices, every phase on all of them",
        f"ASSUMED scaling: one batch split over g > 1 devices takes t / (g x "
        f"{c.scaling_efficiency:g}) (1.0 = ideal, favours sync)",
        "ASSUMED publish, reload, checkpoint and append are never split across devices; publish "
        "and checkpoint block their trainer (in sync, everything)",
        "ASSUMED no network transfer time for weights or rows beyond the measured publish/reload/"
        "append, and no store contention",
        f"ASSUMED async admission as coded (the worker's own `admit`, "
        f"astraflow/rollout/admission.py): each wait_for_room check, for every policy in turn, "
        f"reads its progress file, reloads it there if the file names a version the worker does "
        f"not hold (no reload step before generation), then calls it open if its backlog "
        f"(appended - completed steps) plus this batch fits {c.max_backlog_batches} batch(es); "
        f"a closed policy's roles are not started (nothing generated for them, nothing thrown "
        f"away), a role plays only with the roles it reads, and a role played while a role "
        f"reading it is held may run at most {c.max_lead_batches} batch(es) ahead of that "
        f"role's table; nothing playable: sleep {c.worker_poll_s:g} s after the check ended and "
        f"check again; else generate the played roles' turns only and append each one's rows. "
        f"An endless run: no trainer is ever done, so no role is fed as input only; workers "
        f"passing together may overshoot (backlog to at most {c.max_backlog_batches - 1} + "
        f"{c.rollout_devices} batches, {overshoot})",
        "ASSUMED a trainer's progress (its new version, its consumed rows) appears when its step "
        "and any publish are done; weight lag never binds (every version verifies)",
        "ASSUMED sync reloads every changed policy before each batch (refresh_weights)",
        f"ASSUMED trainers take exactly one batch per step and re-check every "
        f"{c.trainer_poll_s:g} s when idle; no version barrier",
        f"ASSUMED each trainer checkpoints every {c.checkpoint_every} step(s), after writing that "
        "step's progress (async: workers are not held by it)",
        "ASSUMED deterministic step times, identical batches, no failures or restarts",
        "ASSUMED workers start together; with identical times they stay in phase, so appends "
        "land together and admission, decided before a batch is generated, can overshoot "
        "and then bind (a policy's roles not started, or a wait when nothing can play) in "
        "bursts",
        "ASSUMED an iteration is one trainer step of every policy, worth the same in both designs "
        "(async staleness not modelled); async is measured in steady state after a warm-up",
    ]


def project(m: Measured, c: Cluster, iterations: int = 200, warmup: int = 20) -> Projection:
    s, a = simulate_sync(m, c, iterations, warmup), simulate_async(m, c, iterations, warmup)
    x, y = s.seconds_per_iteration, a.seconds_per_iteration
    ratio = x / y if y > 0 else (math.inf if x > 0 else math.nan)
    return Projection(m, c, s, a, ratio, assumptions(m, c))


def format_projection(p: Projection) -> str:
    c, s, a = p.cluster, p.sync_result, p.async_result
    n = len(p.measured.policies)
    busy = ", ".join(f"{k} {v:.0%}" for k, v in a.trainer_busy_fraction.items())
    held = ", ".join(f"{k} {v:.0%}" for k, v in a.not_started_fraction.items())
    wasted = ", ".join(f"{k} {v:.0%}" for k, v in a.wasted_fraction.items())
    return "\n".join([
        "Projected seconds per iteration (one trainer step of every policy)",
        f"{'':34}{'projected':>12}{'paper':>12}",
        f"{f'sync  ({c.sync_devices} colocated)':34}{s.seconds_per_iteration:>10.2f} s"
        f"{PAPER['sync_s_per_iteration']:>10.1f} s",
        f"{f'async ({c.rollout_devices} rollout + {n}x{c.trainer_devices} train)':34}"
        f"{a.seconds_per_iteration:>10.2f} s{PAPER['async_s_per_iteration']:>10.1f} s",
        f"{'ratio sync/async':34}{p.ratio:>11.2f}x{PAPER['ratio']:>11.2f}x",
        f"async trainer busy: {busy}; workers blocked {a.worker_blocked_fraction:.0%}; "
        f"roles not started: {held} of batches; generated, never appended: {wasted}",
        "Assumptions:", *(f"  - {line}" for line in p.assumptions)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/cluster_projection.py",
                                 description="Project s/iteration of async vs sync designs.")
    ap.add_argument("measured", help="JSON file of Measured.to_dict() form")
    d = Cluster()
    ap.add_argument("--rollout-devices", type=int, default=d.rollout_devices)
    ap.add_argument("--trainer-devices", type=int, default=d.trainer_devices)
    ap.add_argument("--sync-devices", type=int, default=d.sync_devices)
    ap.add_argument("--efficiency", type=float, default=d.scaling_efficiency)
    ap.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    ns = ap.parse_args(argv)
    try:
        with open(ns.measured) as f:
            m = Measured.from_dict(json.load(f))
        c = Cluster(rollout_devices=ns.rollout_devices, trainer_devices=ns.trainer_devices,
                    sync_devices=ns.sync_devices, scaling_efficiency=ns.efficiency,
                    checkpoint_every=ns.checkpoint_every)
    except (OSError, ValueError) as err:  # json.JSONDecodeError is a ValueError
        ap.error(str(err))
    print(format_projection(project(m, c)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
