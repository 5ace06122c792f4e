"""Stopping at the target: a live slice that meets it is confirmed on the whole held-out
set before the run stops, and the version that met it is the run's final one."""

from __future__ import annotations

from types import SimpleNamespace

from rich.console import Console

from astraflow.local.launcher import confirm_target


class Scores:
    """An evaluator whose whole-set accuracy per version is given; counts its calls."""

    def __init__(self, full: dict[int, float], items: int, live: int):
        self.full, self.items, self.policy, self.calls = full, [None] * items, "solver", []
        self.ctx = SimpleNamespace(flow=SimpleNamespace(stop=SimpleNamespace(live_eval_size=live)))

    def __call__(self, version: int, n: int | None = None) -> float:
        self.calls.append(version)
        return self.full[version]


def test_a_slice_that_passes_is_checked_on_the_whole_set():
    console = Console(file=open("/dev/null", "w"))  # noqa: SIM115
    ev = Scores({3: 0.88, 5: 0.92}, items=50, live=30)
    # the slice said 0.93 for v3; the 50 tasks say 0.88: the run goes on
    assert confirm_target(ev, 3, 0.93, 0.9, console) is None
    assert confirm_target(ev, 5, 0.90, 0.9, console) == (5, 0.92)
    assert ev.calls == [3, 5]


def test_a_slice_that_is_the_whole_set_is_not_scored_twice():
    console = Console(file=open("/dev/null", "w"))  # noqa: SIM115
    ev = Scores({}, items=30, live=30)
    assert confirm_target(ev, 4, 0.9, 0.9, console) == (4, 0.9)
    assert ev.calls == []
