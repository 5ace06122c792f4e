"""The rollout worker: a stateless loop that turns weights into trajectories.

    weights/<policy>/latest ──(verify sha256, swap in place)──► engine
    workload.sample(seeded rng) ──► prompts ──► engine.generate (G samples each)
        ──► modelled env/tool wait ──► reward ──► one Arrow batch ──► traj_<policy>

Backpressure and staleness contract:
  * it waits while the policy's unconsumed backlog (table rows minus the rows
    the trainer's progress file says it consumed) is at least
    `max_backlog_batches` batches;
  * it refuses to produce while its loaded weights trail the newest published
    version by more than `max_weight_lag` (e.g. every newer version failed
    verification), since such rows would only be dropped as stale.
Kill it at any instant: nothing is lost but the batch it had not committed
(one commit per batch, so never a partial batch).
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import time
import uuid
from datetime import UTC, datetime

import torch

from astraflow.envs.math import MathEnv
from astraflow.rollout.engine import HFEngine
from astraflow.run import RunContext
from astraflow.stores import Progress, TamperedWeights, WeightError

log = logging.getLogger("astraflow.rollout")


def make_env(ctx: RunContext) -> MathEnv:
    e = ctx.flow.env
    return MathEnv(digits=e.digits, op=e.op)


class RolloutWorker:
    def __init__(self, ctx: RunContext, worker_id: str, *, region: str | None = None):
        self.ctx, self.worker_id = ctx, worker_id
        self.policy = ctx.flow.policy.name
        self.region = region or os.environ.get("ASTRAFLOW_REGION", "local")
        self.traj = ctx.trajectories()
        self.weights = ctx.weights()
        self.ledger = ctx.ledger()
        self.env = make_env(ctx)
        # Seeded per worker and per start, so restarted workers do not replay tasks.
        seed = hash((ctx.flow.seed, worker_id, time.time_ns())) & 0x7FFFFFFF
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.engine: HFEngine | None = None
        self.version: int | None = None
        self.newest: int | None = None  # newest published version seen by refresh_weights
        self.extras = json.dumps({"host": socket.gethostname()})
        self.batches = 0
        self.last_wait_s = 0.0

    # -- weights -----------------------------------------------------------
    def refresh_weights(self) -> bool:
        """Load the newest verified version; keep the previous one if it fails."""
        latest = self.newest = self.weights.latest(self.policy)
        if latest is None or latest == self.version:
            return False
        try:
            path = self.weights.load(self.policy, latest)
        except TamperedWeights as err:
            log.warning("%s: refusing %s v%d (%s); keeping v%s", self.worker_id, self.policy,
                        latest, err, self.version)
            return False
        except WeightError as err:  # pruned between listing and loading: try again later
            log.info("%s: %s v%d vanished before loading (%s)", self.worker_id, self.policy,
                     latest, err)
            return False
        try:
            if self.engine is None:
                self.engine = HFEngine.from_dir(path)
            else:
                self.engine.load_weights(path)
        except FileNotFoundError as err:  # pruned while reading: keep what we had
            log.info("%s: %s v%d pruned while loading (%s)", self.worker_id, self.policy,
                     latest, err)
            return False
        self.version = latest
        return True

    # -- backpressure --------------------------------------------------------
    def backlog_rows(self, progress: Progress | None) -> int:
        """Rows not yet consumed by the trainer: table size minus what the trainer
        has read (`progress`, its progress file; None before its first step)."""
        return self.traj.count(self.policy) - (progress.rows_consumed if progress else 0)

    def wait_for_room(self, should_stop=lambda: False, poll_s: float = 0.05) -> float:
        """Block while the backlog is full or weights lag too far; returns seconds waited."""
        t0 = time.time()
        limit = self.ctx.flow.rollout.max_backlog_batches * self.ctx.flow.batch_rows()
        lag_limit = self.ctx.flow.rollout.max_weight_lag
        while not should_stop():
            # The trainer's progress file names its newest version: list the weight
            # store (a LIST request on S3) only when that differs from ours.
            progress = self.ledger.progress(self.policy)
            if progress is None or progress.weight_version != self.version:
                self.refresh_weights()
            else:
                self.newest = progress.weight_version
            lag = 0 if self.newest is None or self.version is None else self.newest - self.version
            if (self.version is not None and lag <= lag_limit
                    and self.backlog_rows(progress) < limit):
                break
            time.sleep(poll_s)
        return time.time() - t0

    # -- one batch ---------------------------------------------------------------
    def produce_batch(self) -> int:
        """Generate, score and append one batch (one commit). Returns rows written."""
        assert self.engine is not None and self.version is not None
        ro = self.ctx.flow.rollout
        t0 = time.time()
        tasks = [self.env.sample(self.rng) for _ in range(ro.prompts_per_batch)]
        codec = self.engine.codec
        prompts = [codec.encode(t.prompt) for t in tasks]
        gen = self.engine.generate(
            prompts, samples_per_prompt=ro.samples_per_prompt,
            max_new_tokens=self.env.max_new_tokens(), temperature=ro.temperature,
            generator=self.gen,
        )
        t_gen = time.time()
        latency = self.ctx.flow.env.turn_latency_ms / 1000.0
        if latency > 0:
            # Modelled environment/tool wait for this turn; the batch's episodes
            # wait concurrently, as they would on async tool calls.
            time.sleep(latency)
        t_env = time.time()
        now = datetime.now(UTC)
        rows = []
        k = ro.samples_per_prompt
        batch_tag = uuid.uuid4().hex[:12]  # unique across restarts of this worker id
        for i, (comp, lps) in enumerate(zip(gen.completions, gen.logprobs, strict=True)):
            task = tasks[i // k]
            group = f"{self.worker_id}-{batch_tag}-{i // k}"
            rows.append({
                "traj_id": uuid.uuid4().hex, "group_id": group, "policy": self.policy,
                "behavior_version": self.version, "prompt_ids": prompts[i // k],
                "completion_ids": comp, "behavior_logprobs": lps, "loss_mask": [1] * len(comp),
                "reward": self.env.reward(task, codec.decode(comp)), "env": self.env.name,
                "task_id": task.task_id, "worker": self.worker_id, "region": self.region,
                "created_at": now, "extras": self.extras,
            })
        self.traj.append(self.policy, rows)
        t_end = time.time()
        self.batches += 1
        self.ledger.log("rollout", self.policy, self.batches, {
            "gen_s": t_gen - t0, "env_wait_s": t_env - t_gen, "append_s": t_end - t_env,
            "backpressure_s": self.last_wait_s, "rows": len(rows),
            "reward_mean": sum(r["reward"] for r in rows) / len(rows),
        })
        return len(rows)

    def run(self, *, max_batches: int | None = None, deadline: float | None = None,
            should_stop=lambda: False) -> int:
        while not should_stop():
            if max_batches is not None and self.batches >= max_batches:
                break
            if deadline is not None and time.time() > deadline:
                break
            self.last_wait_s = self.wait_for_room(should_stop)
            if should_stop():
                break
            n = self.produce_batch()
            if self.batches % 20 == 0:
                log.info("%s: %d batches, last %d rows with v%s", self.worker_id, self.batches, n,
                         self.version)
        return self.batches
