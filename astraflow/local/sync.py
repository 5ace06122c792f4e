"""The trainer-centred baseline: the same pieces driven in lockstep by one loop.

    repeat: worker.refresh_weights()          (every policy that published)
            worker.produce_batch()             (one episode batch: every role's turns,
                                                one commit per policy table)
            for each policy: trainer.poll() + train_on()   (publish when due)

This is what a trainer-centred system does with several policies, colocated:
generate with all policies, train policy A, train policy B, publish, repeat.
It uses the very same rollout worker, workflow, store, stages, loss and publish
path as the decoupled system, in one process with all the cores the decoupled
components share, so every speed ratio we print compares designs, not code.
"""

from __future__ import annotations

import logging
import time

from astraflow.context import RunContext
from astraflow.rollout.worker import RolloutWorker
from astraflow.train.adapters import trainers_for

log = logging.getLogger("astraflow.local.sync")


def run_sync(ctx: RunContext, *, deadline: float | None = None, should_stop=lambda: False) -> int:
    trainers = trainers_for(ctx, ctx.flow.policy_names())  # shared bases: one copy each
    worker = RolloutWorker(ctx, "sync-0")
    max_steps = ctx.flow.stop.max_steps
    while min(t.step for t in trainers) < max_steps and not should_stop():
        if deadline is not None and time.time() > deadline:
            break
        worker.refresh_weights()  # picks up the versions the last iteration published
        worker.produce_batch()
        for trainer in trainers:
            if trainer.step >= max_steps:
                continue
            sl = trainer.poll()
            if sl is None:  # cannot happen unless the append was lost: fail loudly
                raise RuntimeError(f"sync loop: the batch just appended to {trainer.policy} is "
                                   f"not visible to its trainer")
            res = trainer.train_on(sl)
            if res.step % 10 == 0:
                log.info("%s step %d v%d reward %.3f used %d/%d", trainer.policy, res.step,
                         trainer.version, res.metrics["reward_mean"], res.rows_used, res.rows_read)
    for trainer in trainers:
        trainer.save_checkpoint()
        trainer.mirror.stop(timeout=10.0)
    return min(t.step for t in trainers)
