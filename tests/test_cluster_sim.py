"""The cluster projection simulator: hand-checked sums, bottlenecks, admission (roles not
started, the lead bound, the workflow's dependency shape), bounds."""

from __future__ import annotations

import itertools
import json

import pytest

from benchmarks.cluster_projection import (
    PAPER,
    Cluster,
    Measured,
    PolicyTimes,
    assumptions,
    batch_phases,
    format_projection,
    main,
    project,
    simulate_async,
    simulate_sync,
    speedup,
)


def pol(name: str, gen: float, train: float, publish: float = 0.0, reload: float = 0.0,
        every: int = 1, ckpt: float = 0.0) -> PolicyTimes:
    return PolicyTimes(name, gen_s=gen, train_s=train, publish_s=publish, reload_s=reload,
                       publish_every=every, checkpoint_s=ckpt)


def worker_floor(m: Measured) -> float:
    """Least time one worker spends on a batch that feeds the policy reading every other
    (two policies: the second, in both shapes): it plays every role, so every turn and
    every wait, and appends at least that one table (reloads left out: they may be
    hidden). Every policy's own window is at least its batches' share of the workers,
    and the reported window is the longest of them."""
    return sum(p.gen_s for p in m.policies) + m.env_wait_s * m.waits_per_batch() + m.append_s


def trainer_floor(m: Measured, c: Cluster) -> float:
    """Least time per step of the slowest trainer (publish, checkpoint amortised)."""
    g = speedup(c.trainer_devices, c.scaling_efficiency)
    return max(p.train_s / g + p.publish_s / p.publish_every + p.checkpoint_s / c.checkpoint_every
               for p in m.policies)


# -- sync ------------------------------------------------------------------------------
def test_sync_equals_hand_sum_with_publish_every_and_reload_only_when_changed():
    m = Measured((pol("A", 4, 2, publish=0.5, reload=0.3),
                  pol("B", 2, 1, publish=0.2, reload=0.1, every=2)), env_wait_s=1.0, append_s=0.05)
    c = Cluster(sync_devices=4, scaling_efficiency=0.5)  # speedup 2
    # First loop: nothing published yet, so no reload; A publishes, B does not (step 1 of 2).
    # gen (4+2)/2 + env 2*1 + append 2*0.05 + train (2+1)/2 + publish A 0.5
    assert simulate_sync(m, c, iterations=1, warmup=0).seconds_per_iteration == pytest.approx(7.1)
    # Steady state, per two loops: each loop 7.1 + reload A 0.3; B publishes in one of them
    # and is reloaded in the next: (2 * 7.4 + 0.2 + 0.1) / 2 = 7.55.
    r = simulate_sync(m, c, iterations=4, warmup=2)
    assert r.seconds_per_iteration == pytest.approx(7.55)
    assert r.steps == {"A": 4, "B": 4}
    assert r.not_started_fraction == {"A": 0.0, "B": 0.0}  # sync plays every role
    assert r.wasted_fraction == {"A": 0.0, "B": 0.0}
    assert r.peak_backlog == {"A": 1, "B": 1}
    assert r.peak_lead == {"A": 0, "B": 0}
    assert r.trainer_busy_fraction["A"] == pytest.approx((1.0 + 0.5) / 7.55)
    # publish_every 1 for both: every loop reloads and publishes both.
    m1 = Measured((pol("A", 4, 2, 0.5, 0.3), pol("B", 2, 1, 0.2, 0.1)), 1.0, 0.05)
    assert simulate_sync(m1, c, 3, 1).seconds_per_iteration == pytest.approx(7.1 + 0.2 + 0.4)


def test_sync_checkpoint_blocks_the_whole_loop_every_c_steps():
    m = Measured((pol("A", 4, 2, ckpt=3.0), pol("B", 2, 1, ckpt=1.0)))
    c = Cluster(sync_devices=2, checkpoint_every=2)  # speedup 2
    # A loop: gen (4+2)/2 + train (2+1)/2 = 4.5; both checkpoint after steps 2, 4, ...
    assert simulate_sync(m, c, iterations=1, warmup=0).seconds_per_iteration == 4.5
    assert simulate_sync(m, c, iterations=1, warmup=1).seconds_per_iteration == 4.5 + 4.0
    r = simulate_sync(m, c, iterations=4, warmup=2)  # steps 3..6: checkpoints after 4 and 6
    assert r.seconds_per_iteration == pytest.approx(4.5 + 4.0 / 2)
    assert r.trainer_busy_fraction["A"] == pytest.approx((1.0 + 3.0 / 2) / 6.5)


@pytest.mark.parametrize("waits,expect", [(None, 2), (0, 0), (1, 1), (3, 3)])
def test_env_waits_per_batch_are_the_workflows_not_per_turn(waits, expect):
    """solver + 2 verifiers: `solver_verifier` waits after the solver and once after both
    verifiers (2 waits, not 3); `env_waits` overrides; one policy (`single`) waits once."""
    three = (pol("s", 2.0, 1.0), pol("v1", 1.0, 1.0), pol("v2", 1.0, 1.0))
    m = Measured(three, env_wait_s=1.5, append_s=0.25, env_waits=waits)
    assert m.waits_per_batch() == expect
    assert Measured(three[:1], env_wait_s=1.5).waits_per_batch() == 1
    assert Measured(three[:2], env_wait_s=1.5).waits_per_batch() == 2
    c = Cluster(sync_devices=2, rollout_devices=1, trainer_devices=1, max_backlog_batches=2,
                trainer_poll_s=0.25)
    # sync: gen (2+1+1)/2 + waits * 1.5 + append 3 * 0.25 + train (1+1+1)/2
    assert simulate_sync(m, c, 4, 1).seconds_per_iteration == 2.0 + 1.5 * expect + 0.75 + 1.5
    # async, one worker, backlog 2, trainers (1 s) faster than a batch: the worker never
    # waits, so a batch is gen 4 + waits * 1.5 + append 0.75 (reloads 0 s, in its checks).
    a = simulate_async(m, c, 8, 2)
    assert a.seconds_per_iteration == 4.0 + 1.5 * expect + 0.75
    assert a.worker_blocked_fraction == 0.0


# -- async -----------------------------------------------------------------------------
def test_async_generation_bottleneck_is_worker_batch_time_over_workers():
    m = Measured((pol("A", 1.0, 0.02, 0.01, 0.1), pol("B", 0.5, 0.02, 0.01, 0.1)),
                 env_wait_s=0.2, append_s=0.01)
    c = Cluster(rollout_devices=4, max_backlog_batches=8)  # backpressure cannot bind
    r = simulate_async(m, c, iterations=80, warmup=8)
    # From the third batch on, each worker's check before a batch finds both policies
    # published (others' batches were trained on) and reloads both, in the check.
    per_worker = 0.1 + 0.1 + 1.0 + 0.2 + 0.5 + 0.2 + 2 * 0.01
    assert r.seconds_per_iteration == pytest.approx(per_worker / 4, abs=c.trainer_poll_s / 4)
    assert r.worker_blocked_fraction == 0.0  # reloads in the checks are work, not blocking
    assert r.steps == {"A": 80, "B": 80}
    assert max(r.trainer_busy_fraction.values()) < 0.2


@pytest.mark.parametrize("needs", ["solver_alone", "together"])
@pytest.mark.parametrize("slow", ["A", "B"])
def test_async_training_bottleneck_slowest_trainer_paces_both(slow, needs):
    """4 workers make a batch in 0.1 s, far faster than either trainer: the slow trainer's
    step (train / speedup + publish 0.3) sets the iteration. Admission paces the fast one
    too: its roles are held with the slow one's ("together", or the verifier B reading
    A), and when A is fast and may play alone ("solver_alone") it runs at most
    `max_lead_batches` ahead of B's table (+ R - 1 for workers passing together), so in
    an endless run it steps as often as the slow one, give or take that lead. (The
    shedding worker this replaced fed the fast one throughout: 65 and 71 steps here.)"""
    train = {"A": 1.0, "B": 1.0, slow: 2.0}
    m = Measured((pol("A", 0.05, train["A"], 0.3, 0.01), pol("B", 0.05, train["B"], 0.3, 0.01)),
                 needs=needs)
    fast = "B" if slow == "A" else "A"
    alone = needs == "solver_alone" and fast == "A"  # the fast one may play without the slow
    for eff, g in ((1.0, 2.0), (0.5, 1.0)):
        c = Cluster(trainer_devices=2, scaling_efficiency=eff)
        step = 2.0 / g + 0.3
        r = simulate_async(m, c, iterations=40, warmup=5)
        assert step * (1 - 1e-9) <= r.seconds_per_iteration <= step + c.trainer_poll_s
        assert r.trainer_busy_fraction[slow] > 0.99
        assert r.trainer_busy_fraction[fast] < 0.7  # held back with the slow one
        assert r.steps[slow] == 40
        bound = c.max_lead_batches - 1 + c.rollout_devices
        assert 0 <= r.steps[fast] - 40 <= (bound if alone else 0)  # 43 when alone
        assert 0 < r.peak_lead["A"] <= bound if alone else r.peak_lead["A"] == 0
        assert r.peak_lead["B"] == 0  # nobody plays B without A
        assert r.wasted_fraction == {"A": 0.0, "B": 0.0}
        assert r.worker_blocked_fraction > 0.95  # workers wait instead of shedding


FAST_SLOW = (pol("fast", 0.5, 0.25), pol("slow", 0.5, 4.0))


def fast_slow(workers: int, lead: int = 2) -> Cluster:
    return Cluster(rollout_devices=workers, trainer_devices=1, max_backlog_batches=3,
                   max_lead_batches=lead, worker_poll_s=0.25, trainer_poll_s=0.25)


def test_judge_shape_slow_verifier_workers_wait_nothing_generated_is_dropped():
    """`judge` ("together": both rewards hang on the verdict, so a role plays only with
    the other). 2 in-phase workers, backlog 3, a batch is gen 0.5 + 0.5 = 1.0 s (no env
    wait, no append or publish cost). Trainers on one device: fast (the solver) 0.25 s a
    step, slow (the verifier) 4.0 s. All times exact binary fractions.

    Both workers pass at t=0 and t=1 (slow's backlog 0, 2): both tables hold 4 batches
    at 2. slow trains from 1: done at 5, 9, 13, ... (4 s an iteration). At 2 its backlog
    4 + 1 > 3: closed, so neither role starts (the solver may not play alone) and the
    workers wait; at 5 it is 3 (closed); at 9 it is 2 and both workers pass together:
    2 + 2 = 4 = limit 3 + overshoot 1 (B - 1 + R). So per 8 s each table gets 2 batches,
    each worker works 1 s (blocked 7/8), fast steps as often as slow (busy 2 x 0.25 per
    8 s), and every row generated is appended: the solver never runs ahead. (The
    shedding worker kept the workers busy, fed fast 8 times as often and threw 7/8 of
    slow's rows away.)"""
    m = Measured(FAST_SLOW, needs="together")
    for it, warm in ((8, 2), (10, 3)):  # windows (9, 41] and (13, 53]: multiples of 8 s
        r = simulate_async(m, fast_slow(2), iterations=it, warmup=warm)
        assert r.seconds_per_iteration == 4.0  # set by the slow trainer
        assert r.steps == {"fast": it, "slow": it}
        assert r.trainer_busy_fraction == {"fast": 1 / 16, "slow": 1.0}
        assert r.worker_blocked_fraction == 7 / 8
        assert r.not_started_fraction == {"fast": 0.0, "slow": 0.0}  # both or neither
        assert r.wasted_fraction == {"fast": 0.0, "slow": 0.0}
        assert r.peak_lead == {"fast": 0, "slow": 0}
        assert r.peak_backlog == {"fast": 2, "slow": 3 - 1 + 2}
    # The same from the start (window (0, 9]): one worker-batch in the window that was
    # not appended to slow would show here; none is, and the lead stays 0 for any bound.
    for lead in (0, 2, 4):
        r = simulate_async(m, fast_slow(2, lead), iterations=2, warmup=0)
        assert (r.steps, r.not_started_fraction, r.wasted_fraction, r.peak_lead) == (
            {"fast": 4, "slow": 2}, {"fast": 0.0, "slow": 0.0}, {"fast": 0.0, "slow": 0.0},
            {"fast": 0, "slow": 0})


@pytest.mark.parametrize("lead", [0, 1, 2, 3, 4])
def test_solver_verifier_shape_solver_plays_alone_at_most_max_lead_ahead(lead):
    """`solver_verifier` ("solver_alone": the verifier reads the solver's answer, the
    solver reads nothing). The setup of the test above, one worker. Both play at 0-1,
    1-2, 2-3 (slow's backlog 0, 1, 2 at the checks); at 3 slow is closed (3 + 1 > 3)
    while fast is open, and the solver plays alone (gen 0.5, one env wait: none here)
    while its table + this batch stays within `lead` batches of slow's: `lead` batches,
    ending by 3 + 0.5 x lead <= 5. Then it is held too and the worker waits until slow's
    step ends at 5 (backlog 2): both play to 6, and from then on once after each of
    slow's steps (9-10, 13-14, ...): the lead stays exactly `lead` and, in an endless
    run, buys the solver a head start, not a faster pace."""
    m = Measured(FAST_SLOW, needs="solver_alone")
    c = fast_slow(1, lead)
    r = simulate_async(m, c, iterations=2, warmup=0)  # window (0, 9]: slow's 2nd step at 9
    assert r.seconds_per_iteration == 4.5
    assert r.steps == {"fast": 4 + lead, "slow": 2}  # batches at 1, 2, 3, the solo ones, 6
    assert r.not_started_fraction == {"fast": 0.0, "slow": lead / (4 + lead)}
    assert r.wasted_fraction == {"fast": 0.0, "slow": 0.0}  # a role not started costs nothing
    assert r.peak_lead == {"fast": lead, "slow": 0}
    assert r.worker_blocked_fraction == pytest.approx((2 - 0.5 * lead + 3) / 9)
    steady = simulate_async(m, c, iterations=8, warmup=2)  # (9, 41]: a full batch per 4 s
    assert steady.seconds_per_iteration == 4.0
    assert steady.steps == {"fast": 8, "slow": 8}
    assert steady.not_started_fraction == {"fast": 0.0, "slow": 0.0}
    assert steady.peak_lead == {"fast": lead, "slow": 0}  # the whole run's peak
    # 2 in-phase workers pass the lead check together: each saw the lead at most
    # lead - 1, so it ends at most lead - 1 + R (4 for lead 3), never more.
    two = simulate_async(m, fast_slow(2, lead), iterations=8, warmup=2)
    assert two.peak_lead["fast"] <= (lead - 1 + 2 if lead else 0)
    assert two.peak_lead["fast"] == {0: 0, 1: 2, 2: 2, 3: 4, 4: 4}[lead]
    assert two.steps == {"fast": 8, "slow": 8}


def test_balanced_ratio_unchanged_where_admission_never_binds():
    """Balanced trainers (1 s a step each) behind slow batches (env waits of 10 s): no
    check ever finds one policy closed and the other open, so admission never holds a
    role back and the projection must equal the shedding model's, which never shed here.
    The figures were computed with that model (before issue 36's admission was
    replayed), on these inputs, 200 iterations after 20 of warm-up."""
    old = {2: 3.363999999999993, 3: 3.4467213114754016}  # sync 21.025 s; async 6.25, 6.1 s
    for needs in ("solver_alone", "together"):
        m = Measured((pol("solver", 2.0, 1.0, 0.1, 0.1), pol("verifier", 1.0, 1.0, 0.1, 0.1)),
                     env_wait_s=10.0, needs=needs)
        for backlog, ratio in old.items():
            p = project(m, Cluster(max_backlog_batches=backlog), iterations=200, warmup=20)
            assert p.ratio == pytest.approx(ratio, rel=1e-9)
            assert p.async_result.not_started_fraction == {"solver": 0.0, "verifier": 0.0}
            assert p.async_result.peak_lead == {"solver": 0, "verifier": 0}


def test_backlog_one_with_one_worker_waits_for_the_policy_the_other_reads():
    """Batch: gen A 1.0 + env 0.25 + gen B 0.5 + env 0.25 = 2.0 s, then 0.125 s per table
    appended. Trainers (one device): A 0.5 + publish 0.2, B 0.3 + publish 0.1."""
    m = Measured((pol("A", 1.0, 0.5, 0.2, 0.1), pol("B", 0.5, 0.3, 0.1, 0.05)), env_wait_s=0.25,
                 append_s=0.125)
    c = Cluster(rollout_devices=1, trainer_devices=1, max_backlog_batches=1)
    # After a batch fed to both (appends end at T) both are closed. B is done first, by
    # T + 0.42: the check at T + 0.45 reloads it (to T + 0.5), but B reads A's turn and A
    # is closed, so nothing plays. A (taken at T - 0.125 plus a trainer tick) is done by
    # T + 0.6: that check reloads A (to T + 0.7) and both play. Per iteration: 2.0 + 0.25
    # + 0.7 = 2.95, idle 0.45 + 0.1. The same in either shape: A never plays alone, since
    # it is closed whenever B is open. The shedding worker took 4.4 s here (it generated
    # both roles every batch and appended one).
    for needs in ("solver_alone", "together"):
        r = simulate_async(Measured(m.policies, m.env_wait_s, m.append_s, needs=needs), c, 30, 3)
        assert r.seconds_per_iteration == pytest.approx(2.95)
        assert r.worker_blocked_fraction == pytest.approx(0.55 / 2.95)
        assert r.not_started_fraction == {"A": 0.0, "B": 0.0}
        assert r.peak_backlog == {"A": 1, "B": 1}
    # With room to run ahead nothing closes: reloads (0.15, in the check) + 2.0 + 2 appends.
    free = simulate_async(m, Cluster(rollout_devices=1, trainer_devices=1, max_backlog_batches=3),
                          iterations=30, warmup=3)
    assert free.seconds_per_iteration == pytest.approx(0.15 + 2.0 + 0.25)
    assert free.worker_blocked_fraction == 0.0
    assert free.not_started_fraction == {"A": 0.0, "B": 0.0}
    # A coarse worker poll (0.5 s): the check at T + 0.5 reloads B (to T + 0.55), nothing
    # plays; the next, after the 0.5 s sleep, at T + 1.05, reloads A (to T + 1.15): 3.4.
    coarse = simulate_async(m, Cluster(rollout_devices=1, trainer_devices=1,
                                       max_backlog_batches=1, worker_poll_s=0.5), 30, 3)
    assert coarse.seconds_per_iteration == pytest.approx(3.4)
    assert coarse.worker_blocked_fraction == pytest.approx(1.0 / 3.4)


@pytest.mark.parametrize("a,b,cycle,idle", [
    # A slow (1.5 + 0.5), B fast. After a batch fed to both (T), both are closed. At +0.5
    # B is done: the check reads A's file (not done), reloads B (to +1.0); B reads A's
    # turn, so nothing plays. Sleep to +1.5, then wait; at +2.0 A is done: reload A (to
    # +2.25), both play, to +4.25. Idle 0.5 + 1.0.
    ((1.5, 0.5, 0.25), (0.25, 0.25, 0.5), 2.0 + 2.0 + 0.25, 1.5),
    # Both fast: the check right after the append fails (both closed); at +0.5 A is done:
    # that check reloads A (until +1.0), by when B is done (+0.75), so the same check
    # reloads B too (until +1.5) and both play. Idle: 0.5.
    ((0.5, 0.0, 0.5), (0.5, 0.25, 0.5), 2.0 + 1.5, 0.5),
    # A 2.25 + 0.5 = 2.75 s, longer than a batch. T: fails; +0.5 B is done: reload B (to
    # +1.0), nothing plays (A closed); sleep to +1.5, wait: ticks +2.0, +2.5 see A
    # busy, +3.0 sees it done (+2.75): reload A (to +3.25), both play, to +5.25. Idle 0.5
    # + 2.0.
    ((2.25, 0.5, 0.25), (0.25, 0.25, 0.5), 2.0 + 3.0 + 0.25, 2.5),
])
def test_reloads_happen_inside_the_admission_checks(a, b, cycle, idle):
    """One worker, backlog 1, worker poll 0.5 s, all times exact binary fractions. A batch
    is gen A 1.0 + env 0.25 + gen B 0.5 + env 0.25 = 2.0 s, appended at T. Each check
    takes every policy in turn: a version its progress file names that the worker does
    not hold is loaded right there, then that policy's backlog is counted; then `admit`
    decides. B reads A's turn ("solver_alone"), so the worker never plays B alone."""
    (ta, pa, ra), (tb, pb, rb) = a, b
    m = Measured((pol("A", 1.0, ta, pa, ra), pol("B", 0.5, tb, pb, rb)), env_wait_s=0.25)
    c = Cluster(rollout_devices=1, trainer_devices=1, max_backlog_batches=1,
                worker_poll_s=0.5, trainer_poll_s=0.25)
    r = simulate_async(m, c, iterations=8, warmup=2)  # 8 iterations: whole cycles
    assert r.seconds_per_iteration == cycle
    assert r.worker_blocked_fraction == pytest.approx(idle / cycle)
    assert r.not_started_fraction == {"A": 0.0, "B": 0.0}


def test_a_check_reads_each_progress_file_in_its_turn():
    """One worker, backlog 1, A 0.75 s (no publish cost, reload 0.25), B 0.25 + 0.25
    (reload 0.5), batch 2.0 s. Both fed at 2.0; that check fails. At 2.5 B is done:
    the check reads A's file first (A not done: closed), then reloads B until 3.0,
    while A finishes at 2.75, unseen by this check: B alone could play, but it reads
    A's turn, so nothing does. Sleep to 3.5: reload A (to 3.75), both play to 5.75; A
    is trained by 6.5. (Had the check seen A done, both would have played at 3.0.)
    Window (0, 6.5] (A's 2nd step, the later one): batches ending 2.0 and 5.75, both
    fed; idle 2.0..2.5, 3.0..3.5 and 5.75..6.25 (B done: that check reloads B)."""
    m = Measured((pol("A", 1.0, 0.75, 0.0, 0.25), pol("B", 0.5, 0.25, 0.25, 0.5)),
                 env_wait_s=0.25)
    c = Cluster(rollout_devices=1, trainer_devices=1, max_backlog_batches=1,
                worker_poll_s=0.5, trainer_poll_s=0.25)
    r = simulate_async(m, c, iterations=2, warmup=0)
    assert r.seconds_per_iteration == 6.5 / 2
    assert r.not_started_fraction == {"A": 0.0, "B": 0.0}
    assert r.worker_blocked_fraction == 1.5 / 6.5


def test_a_batch_plays_only_the_admitted_roles_turns():
    """Solver alone: its turn and one env wait (the later waits follow the verifiers'
    turns, which it does not play); the full batch is unchanged; with one policy every
    wait stays."""
    m = Measured((pol("s", 2.0, 1.0), pol("v", 1.0, 1.0), pol("w", 0.5, 1.0)), env_wait_s=1.5)
    assert batch_phases(m) == [2.0, 1.5, 1.0, 0.5, 1.5]
    assert batch_phases(m, played={"s", "v", "w"}) == batch_phases(m)
    assert batch_phases(m, played={"s"}) == [2.0, 1.5]
    assert batch_phases(m, played={"s", "w"}) == [2.0, 1.5, 0.5, 1.5]
    assert batch_phases(m, g=2.0, played={"s"}) == [1.0, 1.5]
    assert batch_phases(m, played=set()) == []
    one = Measured((pol("s", 2.0, 1.0),), env_wait_s=1.5, env_waits=2)
    assert batch_phases(one, played={"s"}) == [2.0, 1.5, 1.5]
    # In the run: FAST_SLOW with a 0.25 s env wait, one worker, lead 2. A full batch is
    # 0.5 + 0.25 + 0.5 + 0.25 = 1.5 s, the solver's alone 0.5 + 0.25 = 0.75 s. Both play
    # 0-1.5, 1.5-3.0, 3.0-4.5 (slow trains from 1.5, done 5.5); at 4.5 slow is closed:
    # solo 4.5-5.25 and 5.25-6.0 (lead 2); at 6.0 slow is open again: both to 7.5; then
    # slow is closed and the lead is spent: wait until slow's 2nd step ends at 9.5.
    # (Solo batches with both waits, 1.0 s, would feed both again at 5.5 and wait from
    # 7.0: idle 2.5 s, not 2.0.)
    r = simulate_async(Measured(FAST_SLOW, env_wait_s=0.25), fast_slow(1, 2), 2, 0)
    assert r.seconds_per_iteration == 9.5 / 2
    assert r.worker_blocked_fraction == 2.0 / 9.5
    assert r.steps == {"fast": 6, "slow": 2}
    assert r.not_started_fraction == {"fast": 0.0, "slow": 2 / 6}
    assert r.peak_lead == {"fast": 2, "slow": 0}


def test_an_explicit_needs_mapping_replays_the_named_shapes():
    """`needs` as a mapping: `solver_verifier`'s written out gives the same run as
    "solver_alone"; every policy reading every other, as "together"; the reverse (the
    first reads the second) lets the second run ahead instead."""
    c = fast_slow(1, 2)
    alone = simulate_async(Measured(FAST_SLOW, needs="solver_alone"), c, 2, 0)
    assert simulate_async(Measured(FAST_SLOW, needs={"fast": [], "slow": ["fast"]}),
                          c, 2, 0) == alone
    together = simulate_async(Measured(FAST_SLOW, needs="together"), c, 2, 0)
    assert simulate_async(Measured(FAST_SLOW, needs={"fast": ["slow"], "slow": ["fast"]}),
                          c, 2, 0) == together
    assert alone != together
    # slow may play alone but is closed whenever fast is: the worker waits as "together".
    rev = simulate_async(Measured(FAST_SLOW, needs={"fast": ["slow"], "slow": []}), c, 2, 0)
    assert rev.seconds_per_iteration == together.seconds_per_iteration
    assert rev.peak_lead == {"fast": 0, "slow": 0}


@pytest.mark.parametrize("every,cycle", [(1, 2.5), (2, 2.0)])
def test_async_checkpoint_follows_progress_so_it_blocks_only_its_trainer(every, cycle):
    """One worker (1 s a batch), backlog 1, step 0.5 s, checkpoint 2 s. The step's progress
    is written before the checkpoint, so the worker makes the next batch during it.
    every=1: step, checkpoint, step, ... with the batch ready: 2.5 s a step (were the
    checkpoint before progress, the worker would wait for it: 3.5). every=2, per two
    steps: step 0.5, wait for the batch started at its end 1.0, step 0.5, checkpoint 2.0."""
    m = Measured((pol("A", 1.0, 0.5, ckpt=2.0),))
    c = Cluster(rollout_devices=1, trainer_devices=1, max_backlog_batches=1,
                worker_poll_s=0.5, trainer_poll_s=0.25, checkpoint_every=every)
    r = simulate_async(m, c, iterations=8, warmup=2)
    assert r.seconds_per_iteration == cycle
    assert r.trainer_busy_fraction["A"] == pytest.approx((0.5 + 2.0 / every) / cycle)


@pytest.mark.parametrize("train,cycle", [(0.5, 1.5), (0.75, 2.0)])
def test_poll_ticks_count_from_wait_start_and_see_work_ending_that_instant(train, cycle):
    """One worker, backlog 1 (times are exact binary fractions, so ties are exact). The
    worker appends at 1.0 and starts waiting; it re-checks at 1.5, 2.0, ... The trainer
    takes the batch at once (its tick lands on 1.0) and completes at 1.0 + train: at 1.5
    the check sees a step ending that very instant; a step ending at 1.75 waits for 2.0."""
    m = Measured((pol("A", 1.0, train),))
    c = Cluster(rollout_devices=1, trainer_devices=1, max_backlog_batches=1,
                worker_poll_s=0.5, trainer_poll_s=0.25)
    assert simulate_async(m, c, iterations=8, warmup=2).seconds_per_iteration == cycle


def test_backlog_two_starves_a_trainer_whose_step_is_shorter_than_a_batch():
    """The batch in training still counts as backlog and workers check before generating:
    with 4 in-phase workers (3 s a batch) and a 2 s step, backlog 2 frees them only after
    3 of their 4 batches are trained (t=9), their next 4 land at 12, the trainer idled
    from 11: 9 s per 4 steps. Backlog 3 frees them at 7, batches land at 10: never idle."""
    m = Measured((pol("A", 3.0, 2.0),))
    tight = simulate_async(m, Cluster(trainer_devices=1, max_backlog_batches=2), 40, 8)
    assert tight.seconds_per_iteration == pytest.approx(9 / 4, abs=0.02)
    assert tight.trainer_busy_fraction["A"] == pytest.approx(8 / 9, abs=0.01)
    roomy = simulate_async(m, Cluster(trainer_devices=1, max_backlog_batches=3), 40, 8)
    assert roomy.seconds_per_iteration == pytest.approx(2.0)


def test_env_wait_makes_sync_much_slower_than_async():
    m = Measured((pol("solver", 2.0, 1.0, 0.1, 0.1), pol("verifier", 1.0, 1.0, 0.1, 0.1)),
                 env_wait_s=10.0)
    p = project(m, Cluster())
    assert p.ratio > 2
    assert p.ratio == pytest.approx(p.sync_result.seconds_per_iteration
                                    / p.async_result.seconds_per_iteration)


CASES = [
    Measured((pol("s", g1, t1, pub, rel, every, ckpt), pol("v", g2, t2, pub, rel, 1, ckpt)),
             env, app, waits)
    for g1, g2, t1, t2, pub, rel, every, ckpt, env, app, waits in [
        (8.0, 2.0, 1.0, 1.0, 0.1, 0.1, 1, 0.0, 0.0, 0.0, None),
        (1.0, 1.0, 6.0, 2.0, 0.5, 0.2, 2, 1.5, 0.0, 0.05, None),
        (3.0, 0.5, 3.0, 3.0, 0.0, 0.0, 1, 0.0, 1.0, 0.0, 1),
        (0.2, 0.2, 0.2, 0.2, 0.3, 0.3, 3, 0.4, 0.5, 0.1, 3),
    ]
]
# checkpoint_every divides 120 and no window below starts or ends mid-period
CLUSTERS = [Cluster(), Cluster(rollout_devices=2, trainer_devices=1, sync_devices=4,
                               checkpoint_every=3),
            Cluster(rollout_devices=6, max_backlog_batches=1, scaling_efficiency=0.7,
                    checkpoint_every=1),
            Cluster(rollout_devices=3, trainer_devices=4, max_backlog_batches=5,
                    checkpoint_every=4)]


@pytest.mark.parametrize("needs", ["solver_alone", "together"])
@pytest.mark.parametrize("m,c", list(itertools.product(CASES, CLUSTERS)))
def test_async_never_beats_its_bottleneck_resource(m, c, needs):
    it = 120
    m = Measured(m.policies, m.env_wait_s, m.append_s, m.env_waits, needs=needs)
    r = simulate_async(m, c, iterations=it, warmup=12)
    # Trainer bound holds exactly; the rollout bound up to one batch per worker over the
    # finite window (batches made before the window and trained inside it).
    assert r.seconds_per_iteration >= trainer_floor(m, c) * (1 - 1e-9)
    slack = 1 - c.rollout_devices / it
    assert r.seconds_per_iteration >= worker_floor(m) / c.rollout_devices * slack
    # Workers passing a check together overshoot the limit by at most one batch each,
    # the backlog's and the lead's alike; a role not started is not generated, so no
    # row is generated and dropped (an endless run feeds nothing as input only).
    lead = c.max_lead_batches - 1 + c.rollout_devices if c.max_lead_batches else 0
    for name in r.peak_backlog:
        assert 1 <= r.peak_backlog[name] <= c.max_backlog_batches - 1 + c.rollout_devices
        assert 0.0 <= r.not_started_fraction[name] < 1.0
        assert r.wasted_fraction[name] == 0.0
        assert 0 <= r.peak_lead[name] <= (lead if needs == "solver_alone" else 0)
    assert r.not_started_fraction["v"] == 0.0 or needs == "solver_alone"
    assert r.not_started_fraction["s"] == 0.0  # the verifier never plays without it
    # Sync is exactly the serial sum of its phases; never faster than that.
    s = simulate_sync(m, c, iterations=it, warmup=12)
    g = speedup(c.sync_devices, c.scaling_efficiency)
    serial = m.env_wait_s * m.waits_per_batch() + sum(
        p.gen_s / g + m.append_s + p.train_s / g + (p.publish_s + p.reload_s) / p.publish_every
        + p.checkpoint_s / c.checkpoint_every for p in m.policies)
    assert s.seconds_per_iteration == pytest.approx(serial)


@pytest.mark.parametrize("gen,train", [((4.0, 4.0), (2.0, 2.0)), ((1.0, 0.5), (3.0, 0.5)),
                                       ((6.0, 2.0), (1.0, 1.0))])
def test_no_overlap_to_win_means_async_not_faster_on_equal_hardware(gen, train):
    """Zero env wait, free publish/reload/append, ideal scaling, the same 8 devices: sync
    uses all of them all the time, so async can at best tie (weighted-mean argument)."""
    m = Measured((pol("s", gen[0], train[0]), pol("v", gen[1], train[1])))
    c = Cluster(rollout_devices=4, trainer_devices=2, sync_devices=8, max_backlog_batches=8)
    p = project(m, c, iterations=96, warmup=8)
    assert p.ratio <= 1 + 1e-6 + c.trainer_poll_s / p.async_result.seconds_per_iteration


def test_deterministic():
    m, c = CASES[1], CLUSTERS[2]
    assert simulate_async(m, c, 50, 5) == simulate_async(m, c, 50, 5)


# -- inputs, output, CLI ---------------------------------------------------------------
def test_from_dict_round_trip():
    c = Cluster(rollout_devices=3, scaling_efficiency=0.8, checkpoint_every=4)
    for m in CASES:  # with and without env_waits (None is JSON null), with checkpoints
        assert Measured.from_dict(json.loads(json.dumps(m.to_dict()))) == m
    shaped = [Measured(CASES[0].policies, needs="together"),
              Measured(CASES[0].policies, needs={"s": ("v",), "v": []})]
    for m in shaped:  # a shape name, a mapping (its tuples stored as lists)
        assert Measured.from_dict(json.loads(json.dumps(m.to_dict()))) == m
    assert shaped[1].needs == {"s": ["v"], "v": []}
    assert shaped[1].needs_of() == {"s": frozenset({"v"}), "v": frozenset()}
    assert shaped[0].needs_of() == {"s": frozenset({"v"}), "v": frozenset({"s"})}
    assert Cluster.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    # JSON written before env_waits, needs, checkpoint_s, checkpoint_every and
    # max_lead_batches still loads, as `solver_verifier` with the flow's default lead.
    old = Measured.from_dict({"policies": [{"name": "x", "gen_s": 1, "train_s": 1,
                                            "publish_s": 0, "reload_s": 0}], "env_wait_s": 2})
    assert (old.append_s, old.env_waits, old.waits_per_batch()) == (0.0, None, 1)
    assert old.policies[0].checkpoint_s == 0.0
    assert old.needs == "solver_alone" and old.needs_of() == {"x": frozenset()}
    assert CASES[0].needs_of() == {"s": frozenset(), "v": frozenset({"s"})}
    assert Cluster.from_dict({"rollout_devices": 2}).checkpoint_every == 10
    assert Cluster.from_dict({"rollout_devices": 2}).max_lead_batches == 2
    assert Cluster(max_lead_batches=0).max_lead_batches == 0  # as rollout.max_lead_batches


@pytest.mark.parametrize("make,match", [
    (lambda: pol("a", -1.0, 1.0), "gen_s"),
    (lambda: pol("a", 1.0, float("nan")), "train_s"),
    (lambda: pol("a", 1.0, 1.0, every=0), "publish_every"),
    (lambda: pol("", 1.0, 1.0), "name"),
    (lambda: Measured(()), "non-empty"),
    (lambda: Measured((pol("a", 1, 1), pol("a", 1, 1))), "repeat"),
    (lambda: Measured((pol("a", 1, 1),), env_wait_s=-0.1), "env_wait_s"),
    (lambda: Measured((pol("a", 1, 1),), env_waits=-1), "env_waits"),
    (lambda: Measured((pol("a", 1, 1),), env_waits=1.0), "env_waits"),
    (lambda: pol("a", 1.0, 1.0, ckpt=-1.0), "checkpoint_s"),
    (lambda: Cluster(checkpoint_every=0), "checkpoint_every"),
    (lambda: Cluster(rollout_devices=0), "rollout_devices"),
    (lambda: Cluster(trainer_devices=0), "trainer_devices"),
    (lambda: Cluster(sync_devices=0), "sync_devices"),
    (lambda: Cluster(scaling_efficiency=0.0), "scaling_efficiency"),
    (lambda: Cluster(scaling_efficiency=1.5), "scaling_efficiency"),
    (lambda: Cluster(max_backlog_batches=0), "max_backlog_batches"),
    (lambda: Cluster(worker_poll_s=0), "worker_poll_s"),
    (lambda: Cluster(max_lead_batches=-1), "max_lead_batches"),
    (lambda: Cluster(max_lead_batches=1.5), "max_lead_batches"),
    (lambda: Measured((pol("a", 1, 1),), needs="alone"), "needs must be one of"),
    (lambda: Measured((pol("a", 1, 1),), needs=["a"]), "needs must be one of"),
    (lambda: Measured((pol("a", 1, 1), pol("b", 1, 1)), needs={"a": []}), "every policy"),
    (lambda: Measured((pol("a", 1, 1), pol("b", 1, 1)), needs={"a": [], "b": [], "c": []}),
     "every policy"),
    (lambda: Measured((pol("a", 1, 1), pol("b", 1, 1)), needs={"a": "b", "b": []}),
     r"needs\['a'\] must be a list"),
    (lambda: Measured((pol("a", 1, 1), pol("b", 1, 1)), needs={"a": ["a"], "b": []}),
     "not other policies"),
    (lambda: Measured((pol("a", 1, 1), pol("b", 1, 1)), needs={"a": ["c"], "b": []}),
     "not other policies"),
    (lambda: Cluster.from_dict({"gpus": 8}), "unknown"),
    (lambda: Measured.from_dict({"policies": [{"name": "a", "gen_s": 1}]}), "PolicyTimes"),
    (lambda: Measured.from_dict({}), "policies"),
    (lambda: simulate_async(CASES[0], Cluster(), iterations=0), "iterations"),
    (lambda: simulate_sync(CASES[0], Cluster(), warmup=-1), "warmup"),
])
def test_validation_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_format_projection_shows_paper_and_every_assumption():
    p = project(CASES[0], Cluster(), iterations=40, warmup=4)
    text = format_projection(p)
    for figure in ("2.74", "212.6", "77.7", f"{p.ratio:.2f}"):
        assert figure in text
    assert p.assumptions == assumptions(CASES[0], Cluster())
    for line in p.assumptions:
        assert line in text
    joined = " ".join(p.assumptions)
    for word in ("MEASURED", "ASSUMED", "not shrunk", "never split", "no network", "x 1)",
                 "2 per batch", "checkpoint 0 s every 10", "reloads it there", "after writing",
                 "admission", "not started", "nothing thrown away", "at most 2 batch(es) ahead",
                 "nothing playable", "to at most 1 + 4 batches", "lead to at most 1 + 4",
                 "'solver_alone', `solver_verifier`'s): s reads nothing; v reads s",
                 "no trainer is ever done"):
        assert word in joined
    assert "shed" not in joined
    assert "roles not started: s 0%, v 0% of batches" in text
    assert "generated, never appended: s 0%, v 0%" in text
    judge = assumptions(Measured(CASES[0].policies, needs="together"),
                        Cluster(max_lead_batches=0))
    assert "`judge`'s" in " ".join(judge) and "s reads v; v reads s" in " ".join(judge)
    assert "no lead: with 0 those roles play only together" in " ".join(judge)
    assert PAPER["ratio"] == 2.74


def test_main_prints_projection(tmp_path, capsys):
    f = tmp_path / "measured.json"
    f.write_text(json.dumps(CASES[0].to_dict()))
    assert main([str(f), "--rollout-devices", "2", "--efficiency", "0.9",
                 "--checkpoint-every", "5"]) == 0
    out = capsys.readouterr().out
    assert "ratio sync/async" in out and "2 rollout" in out and "x 0.9)" in out
    assert "every 5 step(s)" in out
    f.write_text(json.dumps({"policies": []}))
    with pytest.raises(SystemExit) as e:
        main([str(f)])
    assert e.value.code == 2
