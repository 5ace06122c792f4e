"""The trainer-centred baseline: the same pieces driven in lockstep by one loop.

    repeat: worker.produce_batch() → trainer.poll() + train_on() → publish → worker reloads

It uses the very same rollout worker, store, stages, loss and publish path as
the decoupled system, in one process with all the cores the decoupled
components share, so every speed ratio we print compares designs, not code.
"""

from __future__ import annotations

import logging
import time

from astraflow.rollout.worker import RolloutWorker
from astraflow.run import RunContext
from astraflow.train.trainer import Trainer

log = logging.getLogger("astraflow.sync")


def run_sync(ctx: RunContext, *, deadline: float | None = None, should_stop=lambda: False) -> int:
    trainer = Trainer(ctx)
    worker = RolloutWorker(ctx, "sync-0")
    max_steps = ctx.flow.stop.max_steps
    while trainer.step < max_steps and not should_stop():
        if deadline is not None and time.time() > deadline:
            break
        worker.refresh_weights()  # picks up the version the last step published
        worker.produce_batch()
        sl = trainer.poll()
        if sl is None:  # cannot happen unless the append was lost: fail loudly
            raise RuntimeError("sync loop: the batch just appended is not visible to the trainer")
        res = trainer.train_on(sl)
        if res.step % 10 == 0:
            log.info("step %d v%d reward %.3f used %d/%d", res.step, trainer.version,
                     res.metrics["reward_mean"], res.rows_used, res.rows_read)
    trainer.save_checkpoint()
    return trainer.step
