"""A deterministic discrete-event engine: actors are generators, time is simulated.

An actor yields a duration (work) or a `Wait` (a poll loop: resume once `ready()`
holds). A blocked actor re-checks at its poll ticks only when some work ended since its
last check, so long waits cost no events. The scaling simulator (`scaling_sim`) and the
cluster projection (benchmarks/cluster_projection.py) both run on it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Generator
from dataclasses import dataclass

WORK, CHECK = 0, 1  # at equal times, work that ends (and changes state) precedes checks


@dataclass(frozen=True)
class Wait:
    """Yielded by an actor: resume once `ready()` holds, polling every `poll_s`."""

    ready: Callable[[], bool]
    poll_s: float


NOW = Wait(lambda: True, 1.0)  # resume at once, but after all work ending this instant


class _Actor:
    def __init__(self, gen: Generator[float | Wait, None, None]) -> None:
        self.gen, self.wait = gen, Wait(lambda: True, 1.0)
        self.start, self.tick, self.blocked, self.pending = 0.0, 0, False, False


class Engine:
    """Actors are generators yielding a duration (work) or a `Wait` (poll loop).

    A blocked actor re-checks at start + k * poll_s exactly as a sleep loop would,
    but a tick is only simulated when some work ended since its last check (state
    only changes then), so long waits cost no events. Ties: (time, work before
    check, insertion order): deterministic, no randomness."""

    def __init__(self) -> None:
        self.now, self._heap, self._seq, self._actors = 0.0, [], 0, []

    def spawn(self, gen: Generator[float | Wait, None, None]) -> None:
        self._actors.append(a := _Actor(gen))
        self._advance(a)

    def _push(self, t: float, kind: int, a: _Actor) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, a))

    def _advance(self, a: _Actor) -> None:
        try:
            cmd = next(a.gen)
        except StopIteration:  # an actor may end (a retired or preempted worker)
            self._actors.remove(a)
            return
        if isinstance(cmd, Wait):
            a.wait, a.blocked, a.pending = cmd, False, True
            self._push(self.now, CHECK, a)  # check after all work ending now
        else:
            self._push(self.now + cmd, WORK, a)

    def run(self, done: Callable[[], bool], max_events: int = 5_000_000) -> None:
        """Run until `done()` holds and everything due at that instant has run too."""
        for _ in range(max_events):
            if done() and (not self._heap or self._heap[0][0] > self.now):
                return
            t, kind, _, a = heapq.heappop(self._heap)
            self.now = t
            if kind == CHECK:
                a.pending = False
                if not a.wait.ready():
                    if not a.blocked:
                        a.blocked, a.start, a.tick = True, t, 0
                    continue  # a failed check changes nothing: nobody else re-checks
                a.blocked = False
            self._advance(a)
            for b in self._actors:  # state may have changed: blocked actors check at next tick
                if b.blocked and not b.pending:
                    p = b.wait.poll_s
                    b.tick = max(b.tick + 1, math.ceil((self.now - b.start) / p - 1e-9))
                    b.pending = True
                    self._push(max(self.now, b.start + b.tick * p), CHECK, b)
        raise RuntimeError(f"simulation did not finish within {max_events} events")
