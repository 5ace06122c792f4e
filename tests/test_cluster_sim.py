"""The cluster projection simulator: hand-checked sums, bottlenecks, backpressure, shedding,
bounds."""

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
    """Least time one worker spends on a batch that feeds a given policy: every policy
    generates, but only open policies are appended, so at least that one table (reloads
    left out: they may be hidden)."""
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
    assert r.shed_fraction == {"A": 0.0, "B": 0.0}  # sync never sheds
    assert r.peak_backlog == {"A": 1, "B": 1}
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


@pytest.mark.parametrize("slow", ["A", "B"])
def test_async_training_bottleneck_slowest_trainer_defines_iteration(slow):
    """4 workers make a batch in 0.1 s, far faster than either trainer: the slow trainer's
    step (train / speedup + publish 0.3) sets the iteration. The fast one is not held to
    its pace (were every policy required to have room, it would step 40 times too): its
    policy stays open while the slow one is closed and shed, so it also steps back to
    back, window / its own step times; workers wait only while both are closed."""
    train = {"A": 1.0, "B": 1.0, slow: 2.0}
    m = Measured((pol("A", 0.05, train["A"], 0.3, 0.01), pol("B", 0.05, train["B"], 0.3, 0.01)))
    fast = "B" if slow == "A" else "A"
    for eff, g in ((1.0, 2.0), (0.5, 1.0)):
        c = Cluster(trainer_devices=2, scaling_efficiency=eff)
        step, fast_step = 2.0 / g + 0.3, 1.0 / g + 0.3
        r = simulate_async(m, c, iterations=40, warmup=5)
        assert step * (1 - 1e-9) <= r.seconds_per_iteration <= step + c.trainer_poll_s
        assert r.trainer_busy_fraction[slow] > 0.99
        assert r.trainer_busy_fraction[fast] > 0.99  # fed throughout, not gated by the slow
        assert r.steps[slow] == 40
        assert abs(r.steps[fast] - 40 * r.seconds_per_iteration / fast_step) <= 1  # 65; 70.8
        assert r.shed_fraction[slow] > r.shed_fraction[fast] > 0  # both close at times


def test_slow_trainer_sheds_while_fast_trainer_keeps_the_workers_pace():
    """2 in-phase workers, backlog 3, a batch is gen 0.5 + 0.5 = 1.0 s (no env wait, no
    append or publish cost): they append at t = 1, 2, 3, ... Trainers on one device:
    fast 0.25 s a step, slow 4.0 s. All times exact binary fractions.

    fast: at each check (t integer) its backlog is the 2 batches just appended (the
    previous 2 were trained by t - 0.5), 2 < 3: always open, trained t..t+0.5, so it
    steps 2 per second, busy half the time: the workers' pace, not the slow trainer's.
    slow: both workers pass at t=0 and t=1 (backlog 0, 2) and append 4 batches by t=2;
    it trains back to back from t=1: done at 5, 9, 13, ... (4 s an iteration, exactly).
    Its backlog is 4, then 3 at t=5 (closed: its rows shed); at t=9 it falls to 2 and
    both in-phase workers pass that check together: 2 + 2 = 4 = limit 3 + overshoot 1
    (B - 1 + R), and never more. It is fed at 10, 18, 26, ... (one check in two of its
    steps, 2 batches each): 2 of the 16 batches made per 8 s, so 7/8 of its rows are
    shed; it never idles since its backlog never empties. Workers never wait."""
    m = Measured((pol("fast", 0.5, 0.25), pol("slow", 0.5, 4.0)))
    c = Cluster(rollout_devices=2, trainer_devices=1, max_backlog_batches=3,
                worker_poll_s=0.25, trainer_poll_s=0.25)
    for it, warm in ((8, 2), (10, 3)):  # windows (9, 41] and (13, 53]: multiples of 8 s
        r = simulate_async(m, c, iterations=it, warmup=warm)
        assert r.seconds_per_iteration == 4.0  # set by the slow trainer
        assert r.steps == {"fast": 8 * it, "slow": it}
        assert r.trainer_busy_fraction == {"fast": 0.5, "slow": 1.0}
        assert r.shed_fraction == {"fast": 0.0, "slow": 7 / 8}
        assert r.worker_blocked_fraction == 0.0
        assert r.peak_backlog == {"fast": 2, "slow": 3 - 1 + 2}
    # One worker, nobody to overshoot with: slow is fed at t = 1, 2, 3 (backlog 1, 2, 3 =
    # the limit), then once after each of its steps (5 -> 6, 9 -> 10, ...): backlog back
    # to 3, one batch in 4 appended. fast steps once a batch, 1 per second.
    one = simulate_async(m, Cluster(rollout_devices=1, trainer_devices=1, max_backlog_batches=3,
                                    worker_poll_s=0.25, trainer_poll_s=0.25), 8, 2)
    assert one.seconds_per_iteration == 4.0
    assert one.steps == {"fast": 4 * 8, "slow": 8}
    assert one.shed_fraction == {"fast": 0.0, "slow": 3 / 4}
    assert one.peak_backlog == {"fast": 1, "slow": 3 - 1 + 1}


def test_backlog_one_with_one_worker_alternates_policies_and_sheds_half():
    """Batch: gen A 1.0 + env 0.25 + gen B 0.5 + env 0.25 = 2.0 s, then 0.125 s per table
    appended. Trainers (one device): A 0.5 + publish 0.2, B 0.3 + publish 0.1."""
    m = Measured((pol("A", 1.0, 0.5, 0.2, 0.1), pol("B", 0.5, 0.3, 0.1, 0.05)), env_wait_s=0.25,
                 append_s=0.125)
    c = Cluster(rollout_devices=1, trainer_devices=1, max_backlog_batches=1)
    r = simulate_async(m, c, iterations=30, warmup=3)
    # The worker no longer waits for BOTH trainers: the check right after a batch was
    # appended to policy X finds X closed (its batch is in training) and the other, Y,
    # done long ago (0.7 or 0.4 s plus a trainer tick, under a batch), so it reloads Y and
    # opens Y alone: gen/env 2.0 for both, one append 0.125, X's rows shed. Per iteration
    # (one batch each): 2 x (2.0 + 0.125) + reload A 0.1 + reload B 0.05 = 4.4, slower
    # than waiting for both (the old rule: 2.95 here): the price of never stalling behind
    # one trainer, with a single worker and no slack.
    assert r.seconds_per_iteration == pytest.approx(4.4)
    assert r.shed_fraction == {"A": 0.5, "B": 0.5}
    assert r.worker_blocked_fraction == 0.0  # in steady state every check opens one policy
    assert r.peak_backlog == {"A": 1, "B": 1}
    # With room to run ahead nothing closes: reloads (0.15, in the check) + 2.0 + 2 appends.
    free = simulate_async(m, Cluster(rollout_devices=1, trainer_devices=1, max_backlog_batches=3),
                          iterations=30, warmup=3)
    assert free.seconds_per_iteration == pytest.approx(0.15 + 2.0 + 0.25)
    assert free.worker_blocked_fraction == 0.0
    assert free.shed_fraction == {"A": 0.0, "B": 0.0}
    # A coarse worker poll changes only the start (the check after the first batch, which
    # fed both, fails and sleeps): in steady state no check fails, so it is the same 4.4.
    coarse = simulate_async(m, Cluster(rollout_devices=1, trainer_devices=1,
                                       max_backlog_batches=1, worker_poll_s=0.5), 30, 3)
    assert coarse.seconds_per_iteration == pytest.approx(4.4)
    assert coarse.worker_blocked_fraction == 0.0


@pytest.mark.parametrize("a,b,cycle,idle,shed", [
    # A slow (1.5 + 0.5), B fast: from the second batch on the worker alternates. After a
    # batch fed to B, B is closed and A (taken one batch, 2.0 s, earlier) is done: the
    # check reloads A (0.25) and opens A alone; after the A batch it reloads B (0.5) and
    # opens B alone. Per iteration (2 batches): 2.0 + 0.25 + 2.0 + 0.5; no wait; each
    # policy's rows are shed from every other batch.
    ((1.5, 0.5, 0.25), (0.25, 0.25, 0.5), 2.0 + 0.25 + 2.0 + 0.5, 0.0, (0.5, 0.5)),
    # Both fast: the check right after the append fails (both closed); at +0.5 A is done:
    # that check reloads A (until +1.0), by when B is done (+0.75), so the same check
    # reloads B too (until +1.5) and opens both: no shedding. Idle: 0.5.
    ((0.5, 0.0, 0.5), (0.5, 0.25, 0.5), 2.0 + 1.5, 0.5, (0.0, 0.0)),
    # A 2.25 + 0.5 = 2.75 s, longer than a batch: a cycle of 4 batches in 11 s, from a
    # batch fed to both, appended at T. T: fails (both closed); +0.5 B is done: reload B
    # (to +1.0), A's file (read first, at +0.5) says not done: B alone, to +3.0. +3.0: A
    # done (+2.75), reload A (to +3.25), B closed: A alone, to +5.25. +5.25: reload B
    # (to +5.75), B alone, to +7.75. +7.75: A (taken +5.25) is done only at +8.0, B is
    # closed: fails; after the 0.5 s sleep, +8.25: reload A (to +8.5), B (done +8.25),
    # reload B (to +9.0), both open: both, to +11.0 = T'. A is fed 2 batches in 11 s, B 3;
    # idle 0.5 + 0.5; shed per 4 batches: A 2, B 1.
    ((2.25, 0.5, 0.25), (0.25, 0.25, 0.5), 11.0 / 2, 1.0 / 2, (2 / 4, 1 / 4)),
])
def test_reloads_happen_inside_the_backpressure_checks(a, b, cycle, idle, shed):
    """One worker, backlog 1, worker poll 0.5 s, all times exact binary fractions. A batch
    is gen A 1.0 + env 0.25 + gen B 0.5 + env 0.25 = 2.0 s (both generate whether or not
    their rows will be appended), appended at T. Each check takes every policy in turn: a
    version its progress file names that the worker does not hold is loaded right there,
    then that policy's backlog is counted; the batch appends only the open policies."""
    (ta, pa, ra), (tb, pb, rb) = a, b
    m = Measured((pol("A", 1.0, ta, pa, ra), pol("B", 0.5, tb, pb, rb)), env_wait_s=0.25)
    c = Cluster(rollout_devices=1, trainer_devices=1, max_backlog_batches=1,
                worker_poll_s=0.5, trainer_poll_s=0.25)
    r = simulate_async(m, c, iterations=8, warmup=2)  # 8 iterations: whole cycles
    assert r.seconds_per_iteration == cycle
    assert r.worker_blocked_fraction == pytest.approx(idle / cycle)
    assert r.shed_fraction == {"A": shed[0], "B": shed[1]}


def test_a_check_reads_each_progress_file_in_its_turn():
    """One worker, backlog 1, A 0.75 s (no publish cost, reload 0.25), B 0.25 + 0.25
    (reload 0.5), batch 2.0 s. Both fed at 2.0; that check fails. At 2.5 B is done:
    the check reads A's file first (A not done: closed), then reloads B until 3.0,
    while A finishes at 2.75, unseen by this check: the batch made 3.0..5.0 feeds B
    alone and sheds A's rows. 5.0: reload A (to 5.25), A open, B closed: A alone to
    7.25; A is trained by 8.0. Window (0, 8.0] (A's 2nd step, the later one): batches
    ending 2.0 (both), 5.0 (B), 7.25 (A); idle 2.0..2.5."""
    m = Measured((pol("A", 1.0, 0.75, 0.0, 0.25), pol("B", 0.5, 0.25, 0.25, 0.5)),
                 env_wait_s=0.25)
    c = Cluster(rollout_devices=1, trainer_devices=1, max_backlog_batches=1,
                worker_poll_s=0.5, trainer_poll_s=0.25)
    r = simulate_async(m, c, iterations=2, warmup=0)
    assert r.seconds_per_iteration == 8.0 / 2
    assert r.shed_fraction == {"A": 1 / 3, "B": 1 / 3}
    assert r.worker_blocked_fraction == 0.5 / 8.0


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


@pytest.mark.parametrize("m,c", list(itertools.product(CASES, CLUSTERS)))
def test_async_never_beats_its_bottleneck_resource(m, c):
    it = 120
    r = simulate_async(m, c, iterations=it, warmup=12)
    # Trainer bound holds exactly; the rollout bound up to one batch per worker over the
    # finite window (batches made before the window and trained inside it).
    assert r.seconds_per_iteration >= trainer_floor(m, c) * (1 - 1e-9)
    slack = 1 - c.rollout_devices / it
    assert r.seconds_per_iteration >= worker_floor(m) / c.rollout_devices * slack
    # Workers passing a check together overshoot the limit by at most one batch each.
    for name in r.peak_backlog:
        assert 1 <= r.peak_backlog[name] <= c.max_backlog_batches - 1 + c.rollout_devices
        assert 0.0 <= r.shed_fraction[name] < 1.0
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
    assert Cluster.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    # JSON written before env_waits, checkpoint_s and checkpoint_every still loads.
    old = Measured.from_dict({"policies": [{"name": "x", "gen_s": 1, "train_s": 1,
                                            "publish_s": 0, "reload_s": 0}], "env_wait_s": 2})
    assert (old.append_s, old.env_waits, old.waits_per_batch()) == (0.0, None, 1)
    assert old.policies[0].checkpoint_s == 0.0
    assert Cluster.from_dict({"rollout_devices": 2}).checkpoint_every == 10


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
                 "shed", "none open", "to at most 1 + 4 batches"):
        assert word in joined
    assert "rows shed:" in text
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
