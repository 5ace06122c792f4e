"""The admission rule (astraflow/rollout/admission.py) on plain values: which roles a
rollout batch plays, which it feeds as input only, and which it does not start."""

from __future__ import annotations

import pytest

from astraflow.rollout.admission import Admission, PolicyState, admit, fits, rows_not_started
from astraflow.workflows.base import Workflow
from astraflow.workflows.solver_verifier import SolverVerifier

SV = ["solver", "verifier"]
CAST = {"solver": "S", "verifier": "V"}


def sv_needs(roles):
    return lambda r: SolverVerifier.needs(None, r, roles)  # type: ignore[arg-type]


def whole(roles):  # the Workflow default: every role reads every other
    return lambda r: Workflow.needs(None, r, roles)  # type: ignore[arg-type]


def st(open_=True, done=False, batches=0.0, at_least=None) -> PolicyState:
    return PolicyState(open=open_, done=done, batches=batches, batches_min=at_least)


def run(states, *, roles=SV, cast=CAST, needs=None, lead=2) -> Admission:
    return admit(roles, cast, needs or sv_needs(roles), states, lead)


def test_fits_predicts_the_backlog_at_the_batchs_end():
    assert fits(0, 12, 24) and fits(12, 12, 24)
    assert not fits(13, 12, 24) and not fits(24, 1, 24)
    assert fits(23, 1, 24)  # one row at a time (the endpoint): the old `backlog < limit`


def test_everything_open_plays_every_role():
    a = run({"S": st(), "V": st()})
    assert a == Admission(frozenset(SV)) and a.play == frozenset(SV)


def test_a_closed_verifier_is_not_started_and_the_solver_plays_alone():
    a = run({"S": st(batches=5), "V": st(open_=False, batches=4)})
    assert a.keep == {"solver"} and not a.feed


def test_a_closed_solver_holds_the_verifier_that_reads_its_answers():
    assert run({"S": st(open_=False), "V": st()}).play == frozenset()


@pytest.mark.parametrize("solver_batches,verifier_batches,lead,plays", [
    (4, 4, 2, True), (5, 4, 2, True), (6, 4, 2, False), (9, 4, 2, False),
    (4, 4, 0, False), (4.5, 4, 1, False), (4, 4, 1, True)])
def test_the_solver_runs_at_most_max_lead_batches_ahead_of_a_held_verifier(
        solver_batches, verifier_batches, lead, plays):
    a = run({"S": st(batches=solver_batches), "V": st(open_=False, batches=verifier_batches)},
            lead=lead)
    assert a.keep == ({"solver"} if plays else set())
    # The lead bound binds only while the verifier is held: both open, both play.
    assert run({"S": st(batches=solver_batches), "V": st(batches=verifier_batches)},
               lead=lead).keep == set(SV)


def test_the_lead_bound_takes_the_held_tables_count_at_least():
    """A count taken while rows move between tables (retire, staged commits) may count
    them twice for a moment: the held policy's lower bound keeps the lead bound safe."""
    assert run({"S": st(batches=5), "V": st(open_=False, batches=5, at_least=3)}).play == \
        frozenset()
    assert run({"S": st(batches=5), "V": st(open_=False, batches=5, at_least=4)}).keep == \
        {"solver"}


def test_a_done_solver_is_fed_as_input_so_the_verifier_can_finish():
    a = run({"S": st(open_=False, done=True, batches=50), "V": st(batches=40)})
    assert a.keep == {"verifier"} and a.feed == {"solver"}
    # ...and a done verifier no longer bounds the solver's lead.
    b = run({"S": st(batches=50), "V": st(open_=False, done=True, batches=40)})
    assert b.keep == {"solver"} and not b.feed
    assert run({"S": st(done=True), "V": st(done=True)}).play == frozenset()


def test_a_done_solver_is_not_fed_when_no_verifier_can_play():
    assert run({"S": st(done=True), "V": st(open_=False)}).play == frozenset()


def test_two_verifiers_one_held_the_lead_bound_drops_the_solver_and_its_other_reader():
    roles = ["solver", "verifier", "verifier_2"]
    cast = {"solver": "S", "verifier": "V", "verifier_2": "V2"}
    ok = run({"S": st(batches=5), "V": st(open_=False, batches=4), "V2": st(batches=5)},
             roles=roles, cast=cast)
    assert ok.keep == {"solver", "verifier_2"}
    ahead = run({"S": st(batches=6), "V": st(open_=False, batches=4), "V2": st(batches=6)},
                roles=roles, cast=cast)
    assert ahead.play == frozenset()


def test_roles_that_cannot_be_separated_play_whole_or_wait():
    roles, cast = ["a", "b"], {"a": "A", "b": "B"}
    needs = whole(roles)
    assert run({"A": st(), "B": st()}, roles=roles, cast=cast, needs=needs).keep == {"a", "b"}
    assert run({"A": st(), "B": st(open_=False)}, roles=roles, cast=cast,
               needs=needs).play == frozenset()
    done_b = run({"A": st(), "B": st(open_=False, done=True)}, roles=roles, cast=cast, needs=needs)
    assert done_b.keep == {"a"} and done_b.feed == {"b"}


def test_one_policy_in_two_roles_opens_and_closes_both():
    cast = {"solver": "P", "verifier": "P"}
    assert run({"P": st()}, cast=cast).keep == set(SV)
    assert run({"P": st(open_=False)}, cast=cast).play == frozenset()


def test_rows_not_started_counts_each_held_roles_batch_rows():
    rows = {"solver": 12, "verifier": 24, "verifier_2": 24}.__getitem__
    cast = {"solver": "S", "verifier": "V", "verifier_2": "V"}
    assert rows_not_started(list(cast), cast, frozenset({"solver"}), rows) == {"S": 0, "V": 48}
    assert rows_not_started(list(cast), cast, frozenset(cast), rows) == {"S": 0, "V": 0}
