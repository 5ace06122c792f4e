"""The trainer: consume trajectories after a cursor, step, publish versions.

Each step consumes whole commits in the version range (cursor, end] (up to
`algorithm.step_rows` rows), runs the data stages (astraflow/train/consume.py), makes
`algorithm.minibatches` optimizer updates through a `Step` (astraflow/train/step.py;
the FSDP2 one on several ranks), and records the range in the ledger with the fate of
every row. Every `checkpoint_every` steps, and when asked to stop (SIGTERM: a spot
notice), it checkpoints model, optimizer, RNG, counters and lineage. On start it
restores the newest checkpoint (or version 0) and voids the ledger's steps past it, so
every row is trained exactly once; if lost steps published weights, it republishes
its own so workers return to its lineage. Several policies: one trainer each (policies
sharing a base: one process, astraflow/train/adapters.py); with
`trainer.version_barrier` a due publish waits until every other policy holds the same
version. With several ranks, rank 0 alone reads and writes the store
(astraflow/train/dist.py); every rank joins the collectives on rank 0's decisions.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass
from functools import cache, partial

import torch

from astraflow import testing
from astraflow.context import RunContext
from astraflow.models import lora
from astraflow.models.codec import load_codec
from astraflow.models.hf import carried_files, load_policy, save_policy
from astraflow.stores import LedgerEntry, Progress, Slice, replay
from astraflow.stores.mirror import Mirror
from astraflow.stores.weights import Manifest
from astraflow.train import checkpoint
from astraflow.train.batch import Batch
from astraflow.train.consume import BatchFill, consume, step_rows
from astraflow.train.dist import Ranks, compute_dtype, peak_memory_mb
from astraflow.train.floor import EntropyFloor
from astraflow.train.fsdp import ShardedStep, full_state_dict, shard
from astraflow.train.lineage import Lineage
from astraflow.train.logprobs import LogprobModel
from astraflow.train.publisher import Publisher, frozen_state
from astraflow.train.step import Step, budget_used, make_optimizer, optimize, step_settings
from astraflow.train.version0 import reference_model

log = logging.getLogger("astraflow.trainer")

COLUMNS = ["group_id", "behavior_version", "prompt_ids", "completion_ids",
           "behavior_logprobs", "loss_mask", "reward", "task_id", "extras"]


@dataclass
class StepResult:
    step: int
    rows_read: int
    rows_used: int
    metrics: dict[str, float]


class Trainer:
    def __init__(self, ctx: RunContext, policy: str | None = None, *, ranks: Ranks | None = None):
        self.ctx = ctx
        self.spec = ctx.flow.policy if policy is None else next(
            p for p in ctx.flow.policies if p.name == policy)
        self.policy = self.spec.name
        self.ranks = Ranks.from_env(ctx.flow.trainer.device) if ranks is None else ranks
        self.main = self.ranks.main
        self.traj = ctx.trajectories()
        self.weights = ctx.weights()
        self.ledger = ctx.ledger()
        self.checkpoints = ctx.checkpoints()
        self.stages = [(s.name, dict(s.params)) for s in ctx.flow.stages_for(self.policy)]
        self.batch_rows = step_rows(ctx.flow, self.policy)
        self.fill = BatchFill(self.batch_rows, self.spec.algorithm.min_signal_rows,
                              ctx.flow.backlog_rows(self.policy))
        self.floor = EntropyFloor(self.spec.algorithm, self.traj, self.policy, self.batch_rows)
        self.others = [p for p in ctx.flow.policy_names() if p != self.policy]
        self.publish_pending = False
        # version 0's publish, where the rate's budget starts (step.budget_used): read once, lazily
        self._v0_time = cache(lambda: self.weights.manifest(self.policy, 0).time)
        # Replicas near rollout pools get each version from a background thread.
        self.mirror = Mirror(self.weights, ctx.replicas(), self.policy,
                             keep_last=ctx.flow.store.keep_last)
        # Versions are written from a thread only inside `run` (see there).
        self.publisher = Publisher(self.weights, self.policy, ctx.flow.store, self.mirror,
                                   background=False)
        self._restore()
        if self.main:
            self.mirror.start()
        self._last_step_end = time.time()

    def _restore(self) -> None:
        """Newest complete checkpoint, or version 0; then void what died since."""
        versions = self.ranks.share(self.weights.versions(self.policy) if self.main else None)
        if not versions:
            raise RuntimeError(
                f"no weight version of policy {self.policy!r} in {self.ctx.weights_root}; "
                f"version 0 is published by `astraflow run`, or by `astraflow train` itself when started alone"
            )
        ckpt = self.checkpoints.latest(self.policy) if self.main else None
        ckpt_step = self.ranks.share(None if ckpt is None else ckpt.step)
        if ckpt_step is not None and ckpt is None:  # the other ranks read rank 0's choice
            ckpt = self.checkpoints.load(self.policy, ckpt_step)
        latest = versions[-1]
        base = 0 if ckpt is None and 0 in versions else latest
        path = self.weights.load(self.policy, base)
        self.model = self._load(path)
        self.model.train()
        self._place()
        self.ref_model = reference_model(self.ctx, self.spec, self.ranks, versions)
        self.codec = load_codec(path)
        # Tokenizer, chat template and generation config, carried into every version we
        # publish; read now, because the folder may be pruned (or leave the S3 cache).
        self.carried = carried_files(path)
        algo = self.spec.algorithm
        self.opt = make_optimizer(self._trainable(), algo, allocate=ckpt is None)
        if ckpt is None:
            self.step = self.cursor = self.rows_consumed = self.optimizer_steps = 0
            self.version = base
            self.updates_since_publish = 0
            self.lineage = Lineage(self._manifest)
        else:
            checkpoint.restore_any(self._state(), self.opt, ckpt.files, ckpt.meta)
            m = ckpt.meta
            self.step, self.cursor = m["steps_done"], m["cursor"]
            self.rows_consumed, self.optimizer_steps = m["rows_consumed"], m["optimizer_steps"]
            self.version = m["weight_version"]
            self.publish_pending = bool(m.get("publish_pending", False))
            # Checkpoints from before lineage: the old rule published at every
            # publish_every-th optimizer step unless a barrier held it (pending).
            self.updates_since_publish = int(m.get(
                "updates_since_publish",
                int(self.publish_pending or self.optimizer_steps % algo.publish_every != 0)))
            self.lineage = Lineage.from_json(self._manifest, m.get("lineage", {}))
        if self.lineage.node(self.version) is None:
            # Only a checkpoint from before lineage whose version was pruned since:
            # its version number is its depth, as for any pre-lineage version.
            log.warning("%s v%d: no manifest and no lineage record; taking its version "
                        "number as its lineage depth", self.policy, self.version)
            self.lineage.add(self.version, None, self.version)
        self._checkpointed = self.step
        recorded = self.step
        if self.main:
            recorded = self._roll_back()
        if latest != self.version:
            # Versions after ours came from lost steps: give workers our lineage back.
            self._publish(parent=self.version)
        self._write_progress()
        if self.main and (ckpt is not None or recorded):
            log.info("resumed %s at step %d, cursor %d, weights v%d (checkpoint %s)", self.policy,
                     self.step, self.cursor, self.version,
                     "none" if ckpt is None else f"after step {ckpt.step - 1}")

    def _place(self) -> None:
        """Device, precision, gradient checkpointing, and FSDP2 across ranks: `self.module`
        is what the optimizer steps (the HF model, or its sharded LogprobModel), and
        `self.updater` the Step that trains it (the plain one, or FSDP2's)."""
        algo, device = self.spec.algorithm, self.ranks.device
        self.compute = compute_dtype(self.ctx.flow.trainer.precision, device)
        if self.model.dtype != torch.float32:
            self.compute = None  # the model's own dtype is its compute and master dtype
        if algo.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        self.updater: Step
        if self.ranks.sharded:
            self.module: torch.nn.Module = LogprobModel(self.model, device)
            shard(self.module, self.model, self.ranks, self.compute)
            self.updater = ShardedStep(self.ranks)
        else:
            if device.type != "cpu":
                self.model.to(device)
            self.module = self.model
            self.updater = optimize
        fraction = self.ctx.flow.trainer.gpu_memory_fraction
        if fraction is not None and device.type == "cuda":
            # A GPU shared with a vLLM worker: past this share, fail here, not there.
            torch.cuda.set_per_process_memory_fraction(fraction, device)

    # What a trainer of one adapter on a shared base (astraflow.train.adapters) overrides.
    def _load(self, path) -> torch.nn.Module:
        return load_policy(path, dtype=self.spec.model.dtype, lora=self.spec.model.lora)

    def _trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]  # LoRA: adapters

    def _state(self) -> torch.nn.Module:
        return self.module  # what a checkpoint holds (the model, or its shards)

    def _save(self, staging, state) -> None:
        save_policy(self.model, staging, source=self.carried, state_dict=state)

    def _roll_back(self) -> int:
        """Rank 0: void the ledger's steps past the checkpoint; returns the steps it had."""
        effective = replay(self.ledger.history(self.policy)).effective
        recorded = effective[-1].step + 1 if effective else 0
        if recorded < self.step:
            raise RuntimeError(
                f"checkpoint of {self.policy} is at step {self.step} but the ledger in "
                f"{self.ctx.store_uri} ends at step {recorded}: trainer state and store disagree "
                f"(was the store replaced?)")
        if recorded > self.step:
            log.warning("rolling back %s steps %d..%d (lost with the previous trainer after its last "
                        "checkpoint); their rows are trained again from cursor %d",
                        self.policy, self.step, recorded - 1, self.cursor)
            self.ledger.rollback(self.policy, first_void_step=self.step, cursor=self.cursor,
                                 weight_version=self.version)
        return recorded

    def poll(self) -> Slice | None:
        """Whole commits after the cursor, at least one batch of rows (more while the
        batch fill waits for rows with signal: `BatchFill`)."""
        want = self.fill.want
        return self.fill.take(self.traj.read_after(self.policy, self.cursor, min_rows=want,
                                                   max_rows=want, columns=COLUMNS))

    def barrier_open(self) -> bool:
        """With `trainer.version_barrier`: may we publish version N+1, i.e. has every
        other policy published N? (Their progress files say; no listing needed.)"""
        if not self.ctx.flow.trainer.version_barrier or not self.others:
            return True
        for other in self.others:
            progress = self.ledger.progress(other)
            if progress is None or progress.weight_version < self.version:
                return False
        return True

    def maybe_publish(self) -> float | None:
        """Publish if one is due and the barrier allows; returns seconds taken, or None.
        A publish held back by the barrier stays due: training goes on meanwhile."""
        if not self.publish_pending:
            return None
        if not self.ranks.share(self.barrier_open() if self.main else None):
            return None
        self.publish_pending = False
        return self._publish()

    def _manifest(self, version: int) -> Manifest:
        """A version's manifest (what Lineage reads for versions we did not publish)."""
        return self.weights.manifest(self.policy, version)

    def train_on(self, sl: Slice | None) -> StepResult:
        """One step on `sl` (rank 0's poll; None on the other ranks, which get the
        staged batch from rank 0)."""
        t0 = time.time()
        wait = t0 - self._last_step_end
        metrics: dict[str, float] = {}
        payload = None
        if self.main:
            assert sl is not None
            got = consume(sl, self.stages, policy=self.policy, version=self.version,
                          step=self.step, lineage=self.lineage,
                          history=partial(self.traj.read_range, self.policy, 0, sl.start),
                          same_weights=self.updates_since_publish == 0,
                          solved_at=self.spec.algorithm.update_kl_solved_at)
            stale, filtered = got.stale, got.filtered
            metrics.update({"trainer_wait_s": wait, **got.metrics})
            payload = (got.batch, sl.start, sl.end, sl.num_rows, got.used)
        batch, start, end, rows_read, rows_used = self.ranks.share(payload)
        did_step = batch is not None
        if batch is not None:
            step_metrics, updates = self._optimize(batch)
            metrics.update(step_metrics)
            every = self.spec.algorithm.publish_every
            if (self.optimizer_steps + updates) // every > self.optimizer_steps // every:
                self.publish_pending = True
            self.optimizer_steps += updates
            self.updates_since_publish += updates
            did_step = updates > 0
        took = self.maybe_publish()
        if took is not None:
            metrics["publish_s"] = took
        if self.main:
            self.ledger.record(LedgerEntry(
                policy=self.policy, step=self.step, cursor_start=start, cursor_end=end,
                rows_read=rows_read, rows_used=rows_used, rows_stale=stale,
                rows_filtered=filtered, optimizer_step=did_step, weight_version=self.version,
            ))
        result = StepResult(self.step, rows_read, rows_used, metrics)
        self.cursor = end
        self.rows_consumed += rows_read
        self.step += 1
        self._write_progress()
        metrics["step_time_s"] = time.time() - t0
        metrics["weight_version"] = self.version
        metrics.update(peak_memory_mb(self.ranks.device))
        if self.main:
            self.ledger.log("trainer", self.policy, result.step, metrics)
        if self.step - self._checkpointed >= self.ctx.flow.trainer.checkpoint_every:
            self.save_checkpoint()
        self._last_step_end = time.time()
        return result

    def _write_progress(self) -> None:
        if not self.main:
            return
        self.ledger.write_progress(Progress(
            policy=self.policy, step=self.step - 1, cursor=self.cursor,
            rows_consumed=self.rows_consumed, weight_version=self.version, time=time.time()))

    def save_checkpoint(self) -> float:
        """Checkpoint the state after `self.step` steps (skipped when already saved)."""
        if self.step == self._checkpointed:
            return 0.0
        t0 = time.time()
        if self.main:
            self.publisher.wait()  # a checkpoint names only versions that are out
        counters = {
            "steps_done": self.step, "cursor": self.cursor, "weight_version": self.version,
            "rows_consumed": self.rows_consumed, "optimizer_steps": self.optimizer_steps,
            "publish_pending": self.publish_pending,
            "updates_since_publish": self.updates_since_publish,
            "lineage": self.lineage.to_json()}
        if self.ranks.sharded:
            self._save_sharded(counters)
        else:
            files, meta = checkpoint.capture(self._state(), self.opt, counters)
            self.checkpoints.save(self.policy, self.step, files, meta)
            self.checkpoints.prune(self.policy, self.ctx.flow.trainer.keep_checkpoints)
        self._checkpointed = self.step
        took = time.time() - t0
        if self.main:
            self.ledger.log("trainer", self.policy, self.step - 1, {"checkpoint_s": took})
        return took

    def _save_sharded(self, counters: dict) -> None:
        """DCP across the ranks: rank 0 makes room, every rank writes its own shard
        files, rank 0 writes the manifest naming them all, last."""
        if self.main:
            self.checkpoints.prepare(self.policy, self.step)
        self.ranks.barrier()
        with tempfile.TemporaryDirectory(prefix="astraflow-dcp-") as tmp:
            files, meta = checkpoint.capture_sharded(self.module, self.opt, counters, tmp)
        infos = self.checkpoints.put_files(self.policy, self.step, files)
        every = self.ranks.gather(infos)
        if self.main:
            self.checkpoints.commit(self.policy, self.step,
                                    {n: i for d in every for n, i in d.items()}, meta)
            self.checkpoints.prune(self.policy, self.ctx.flow.trainer.keep_checkpoints)
        self.ranks.barrier()

    def _optimize(self, batch: Batch) -> tuple[dict[str, float], int]:
        """One trainer step's updates on the batch (on every rank); returns (metrics,
        optimizer updates made)."""
        algo, stop = self.spec.algorithm, self.ctx.flow.stop
        used, floor = self.ranks.share((budget_used(algo, stop.max_minutes, self._v0_time),
                                        self.floor.nats()) if self.main else None)
        settings = step_settings(
            algo, temperature=self.ctx.flow.rollout.temperature, first_update=self.optimizer_steps,
            autocast=None if self.ranks.sharded else self.compute, ref_model=self.ref_model,
            budget_updates=stop.max_steps * algo.minibatches, budget_used=used, entropy_floor=floor)
        metrics, updates = self.updater(self.module, self.opt, batch, self.codec.pad_id, settings)
        return ({**metrics, "entropy_floor": floor} if floor else metrics), updates

    def _publish(self, parent: int | None = None) -> float:
        t0 = time.time()
        state = None
        if self.ranks.sharded:  # a collective: every rank sends its shards to rank 0
            state = full_state_dict(self.module)
        # Lineage: our weights descend from self.version; a new depth only if they carry
        # updates it lacks (a republish of restored weights may not).
        source = self.version if parent is None else parent
        depth = self.lineage.depth(source) + (1 if self.updates_since_publish else 0)
        version = None
        if self.main:
            staging = self.weights.staging_dir(self.policy)
            if self.publisher.background and state is None and not lora.is_peft(self.model):
                state = frozen_state(self.model)  # the next step moves the live weights
            if self.publisher.background and state is not None:
                write = partial(self._save, staging, state)
            else:  # sync mode, or a LoRA policy's adapters (small): written now
                self._save(staging, state)
                write = None
            version = self.publisher.publish(staging, step=self.step, parent=source,
                                             lineage=depth, write=write)
        self.version = self.ranks.share(version)
        self.lineage.add(self.version, source, depth)
        self.updates_since_publish = 0
        return time.time() - t0

    def run(self, *, max_steps: int | None = None, deadline: float | None = None,
            should_stop=lambda: False) -> int:
        """Train until `max_steps` total steps, the deadline, or `should_stop()`;
        then checkpoint (a stop request is how spot preemption notices arrive)."""
        max_steps = self.ctx.flow.stop.max_steps if max_steps is None else max_steps
        # Metrics are batched only inside this loop (`store.metrics_every_s`), which
        # flushes them when it ends: a direct `train_on` commits its own at once.
        self.ledger.metrics_every_s = self.ctx.flow.store.metrics_every_s
        # So are versions written from a thread (async mode; sync mode's worker reads each
        # version at once): a direct `train_on`, or the republish of a restore, has its
        # version out when it returns.
        self.publisher.background = self.ctx.flow.mode != "sync"
        try:
            return self._loop(max_steps, deadline, should_stop)
        finally:
            self.ledger.metrics_every_s = 0.0
            self.publisher.background = False  # a pending write is awaited by the next call
            if self.main:
                self.ledger.flush_metrics()

    def _loop(self, max_steps: int, deadline: float | None, should_stop) -> int:
        poll = self.ctx.flow.trainer.poll_interval_s
        while True:
            # Rank 0 decides (stop, idle or step) and the ranks follow: a stop request or
            # a deadline seen by one rank alone would leave the others in a collective.
            action, sl = "stop", None
            if self.main and self.step < max_steps and not should_stop() and (
                    deadline is None or time.time() <= deadline):
                sl = self.poll()
                action = "idle" if sl is None else "step"
            action = self.ranks.share(action)
            if action == "stop":
                break
            if action == "idle":
                if self.maybe_publish() is not None:  # the barrier opened while we waited
                    self._write_progress()
                if self.main:
                    self.ledger.flush_due()  # a waiting trainer's last step shows soon
                    time.sleep(poll)
                continue
            res = self.train_on(sl)
            testing.pause_at(self.policy, res.step)  # inert unless a test asks (astraflow.testing)
            if self.main and res.step % 10 == 0:
                m = res.metrics
                log.info("step %d v%d reward %.3f used %d/%d loss %.4f wait %.2fs",
                         res.step, self.version, m["reward_mean"], res.rows_used, res.rows_read,
                         m.get("loss", float("nan")), m["trainer_wait_s"])
        took = self.save_checkpoint()
        if took and self.main:
            log.info("checkpointed %s after step %d in %.2fs", self.policy, self.step - 1, took)
        if self.main:
            self.publisher.wait()
            self.mirror.stop(timeout=10.0)  # the newest version out to the replicas, if it can
        return self.step

