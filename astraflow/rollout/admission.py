"""Stall-aware admission: which roles a rollout batch plays, decided before any is played.

A policy is *open* when the batch's rows still fit its backlog bound (unconsumed rows +
the batch's <= `max_backlog_batches` batches) and its weights trail the newest by at most
`max_weight_lag`. A closed policy's roles are not started: nothing is generated for them,
so nothing is thrown away. A role plays only with the roles it reads (`Workflow.needs`:
the verifier judges the solver's answer): a needed role whose policy is closed holds it
back; one whose policy is *done* (its trainer needs no more rows) is played as input
only, not appended (`rows_fed`). A role played while a role reading it is held (the
solver alone) runs at most `max_lead_batches` batches ahead of that role's policy: in a
run of fixed steps each batch of lead is later fed as input only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PolicyState:
    """What admission needs to know about one policy at one check."""

    open: bool
    """The batch's rows fit its backlog bound and its weights are fresh enough."""
    done: bool = False
    """Its trainer needs no more rows: it took its last step (`stop.max_steps`), or the
    rows already in its table cover every step it has left."""
    batches: float = 0.0
    """Batches its table holds (rows / one batch's rows), at most: for the lead bound
    of a role that would play alone."""
    batches_min: float | None = None
    """Batches its table holds, at least (a count that never counts a moving row
    twice): for the lead bound of the held role. None: `batches`."""


@dataclass(frozen=True)
class Admission:
    """The roles of one batch: `keep` are played and appended, `feed` played only as
    input to a kept role (their policy is done)."""

    keep: frozenset[str]
    feed: frozenset[str] = frozenset()

    @property
    def play(self) -> frozenset[str]:
        return self.keep | self.feed


def fits(backlog_rows: int, incoming_rows: int, limit_rows: int) -> bool:
    """Whether a batch may start: its rows, added to the unconsumed backlog, stay within
    the bound (predicts the backlog at the batch's end, not at its start)."""
    return backlog_rows + incoming_rows <= limit_rows


def admit(roles: Sequence[str], cast: Mapping[str, str],
          needs: Callable[[str], frozenset[str]], states: Mapping[str, PolicyState],
          max_lead: float) -> Admission:
    """The roles the next batch plays. `roles` in turn order, `cast` role → policy,
    `needs(role)` the roles whose turns it reads, `states` per policy."""
    done = {r for r in roles if states[cast[r]].done}
    keep = {r for r in roles if states[cast[r]].open and r not in done}
    while True:
        before = set(keep)
        # A role is played only with every role it needs, kept or fed (fixpoint: a fed
        # role needs its own inputs too).
        playable = keep | done
        while bad := {r for r in playable if not needs(r) <= playable}:
            playable -= bad
        keep &= playable
        # The lead bound: a role kept while a role that needs it (another policy's, not
        # done) is held may not run too far ahead of that policy.
        for r in sorted(keep):
            for d in roles:
                if (r in needs(d) and d not in keep and d not in done
                        and cast[d] != cast[r]
                        and states[cast[r]].batches - _at_least(states[cast[d]]) + 1
                        > max_lead):
                    keep.discard(r)
                    break
        if keep == before:
            break
    feed: set[str] = set()
    todo = list(keep)
    while todo:
        for n in needs(todo.pop()):
            if n not in keep and n not in feed:
                feed.add(n)
                todo.append(n)
    return Admission(frozenset(keep), frozenset(feed))


def _at_least(state: PolicyState) -> float:
    return state.batches if state.batches_min is None else state.batches_min


def rows_not_started(roles: Sequence[str], cast: Mapping[str, str], played: frozenset[str],
                     rows_of: Callable[[str], int]) -> dict[str, int]:
    """Per policy, the rows its roles would have added had the batch played them all."""
    out = dict.fromkeys(cast.values(), 0)
    for r in roles:
        if r not in played:
            out[cast[r]] += rows_of(r)
    return out
