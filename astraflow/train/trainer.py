"""The trainer: consume trajectories after a cursor, step, publish versions.

    traj_<policy> ──read_after(cursor)──► stages (staleness, filters, advantages)
         ▲                                     │
         │ rollout workers append              ▼
         │                             PPO-clip loss → AdamW step
         │                                     │ every publish_every steps
    weights/<policy>/v<N+1>/ ◄──publish────────┘   ledger row + metrics per step

Contract: each step consumes whole commits in the version range
(cursor, end] and records that range in the ledger with the fate of every row
(used / stale / filtered). On start it resumes from the ledger's last cursor
and the newest weight version, so a restarted trainer continues where the
last one stopped. (Optimizer state and RNG checkpoints are a later step.)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from astraflow.data.stages import StageContext, run_stages
from astraflow.models.factory import load_policy, save_policy
from astraflow.models.tokenizer import CharCodec
from astraflow.run import RunContext
from astraflow.stores import LedgerEntry, Progress, Slice
from astraflow.train.loss import completion_logprobs, ppo_clip_loss

log = logging.getLogger("astraflow.trainer")

COLUMNS = ["group_id", "behavior_version", "prompt_ids", "completion_ids",
           "behavior_logprobs", "loss_mask", "reward"]


@dataclass
class StepResult:
    step: int
    rows_read: int
    rows_used: int
    metrics: dict[str, float]


class Trainer:
    def __init__(self, ctx: RunContext, policy: str | None = None):
        self.ctx = ctx
        self.spec = ctx.flow.policy if policy is None else next(
            p for p in ctx.flow.policies if p.name == policy)
        self.policy = self.spec.name
        self.traj = ctx.trajectories()
        self.weights = ctx.weights()
        self.ledger = ctx.ledger()
        version = self.weights.latest(self.policy)
        if version is None:
            raise RuntimeError(
                f"no weight version of policy {self.policy!r} in {ctx.weights_root}; "
                f"version 0 is published by `astraflow run` (warm start) before trainers start"
            )
        path = self.weights.load(self.policy, version)
        self.model = load_policy(path)
        self.model.train()
        self.codec = CharCodec.from_pretrained(path)
        self.version = version
        algo = self.spec.algorithm
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=algo.lr, betas=algo.betas,
                                     weight_decay=algo.weight_decay)
        past = self.ledger.entries(self.policy)
        self.cursor = past[-1].cursor_end if past else 0
        self.step = past[-1].step + 1 if past else 0
        self.optimizer_steps = sum(e.optimizer_step for e in past)
        self.rows_consumed = sum(e.rows_read for e in past)
        self.stages = [(s.name, dict(s.params)) for s in ctx.flow.stages]
        self._last_step_end = time.time()
        if past:
            log.info("resuming %s at step %d, cursor %d, weights v%d",
                     self.policy, self.step, self.cursor, version)

    def poll(self) -> Slice | None:
        """Whole commits after the cursor, at least one batch of rows."""
        batch = self.ctx.flow.batch_rows()
        return self.traj.read_after(self.policy, self.cursor, min_rows=batch, max_rows=batch,
                                    columns=COLUMNS)

    def train_on(self, sl: Slice) -> StepResult:
        t0 = time.time()
        wait = t0 - self._last_step_end
        ctx = StageContext(policy=self.policy, version=self.version, step=self.step)
        staged = run_stages(sl.rows, ctx, self.stages)
        rows = staged.rows
        stale = staged.dropped.get("stale", 0)
        filtered = sum(v for k, v in staged.dropped.items() if k != "stale")
        metrics: dict[str, float] = {
            "reward_mean": float(torch.tensor(sl.rows.column("reward").to_pylist()).mean()),
            "staleness_mean": float(
                self.version - torch.tensor(sl.rows.column("behavior_version").to_pylist(),
                                            dtype=torch.float64).mean()),
            "trainer_wait_s": wait,
            "rows_read": sl.num_rows,
            "rows_used": rows.num_rows,
        }
        did_step = rows.num_rows > 0
        if did_step:
            metrics.update(self._optimize(rows))
            self.optimizer_steps += 1
            if self.optimizer_steps % self.spec.algorithm.publish_every == 0:
                metrics["publish_s"] = self._publish()
        self.ledger.record(LedgerEntry(
            policy=self.policy, step=self.step, cursor_start=sl.start, cursor_end=sl.end,
            rows_read=sl.num_rows, rows_used=rows.num_rows, rows_stale=stale,
            rows_filtered=filtered, optimizer_step=did_step, weight_version=self.version,
        ))
        self.cursor = sl.end
        self.rows_consumed += sl.num_rows
        self.ledger.write_progress(Progress(
            policy=self.policy, step=self.step, cursor=self.cursor,
            rows_consumed=self.rows_consumed, weight_version=self.version, time=time.time()))
        metrics["step_time_s"] = time.time() - t0
        metrics["weight_version"] = self.version
        self.ledger.log("trainer", self.policy, self.step, metrics)
        result = StepResult(self.step, sl.num_rows, rows.num_rows, metrics)
        self.step += 1
        self._last_step_end = time.time()
        return result

    def _optimize(self, rows) -> dict[str, float]:
        prompts = rows.column("prompt_ids").to_pylist()
        comps = rows.column("completion_ids").to_pylist()
        old = torch.tensor([x for r in rows.column("behavior_logprobs").to_pylist() for x in r])
        mask = torch.tensor([x for r in rows.column("loss_mask").to_pylist() for x in r],
                            dtype=torch.float32)
        adv_rows = rows.column("advantage").to_pylist()
        adv = torch.tensor([a for a, c in zip(adv_rows, comps, strict=True) for _ in c],
                           dtype=torch.float32)
        self.model.train()
        new = completion_logprobs(self.model, prompts, comps, self.codec.pad_id)
        loss, stats = ppo_clip_loss(new, old, adv, mask, self.spec.algorithm.clip_eps)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                                   self.spec.algorithm.grad_clip)
        self.opt.step()
        return {"loss": stats.loss, "clip_frac": stats.clip_frac, "approx_kl": stats.approx_kl,
                "ratio_mean": stats.ratio_mean, "grad_norm": float(grad_norm),
                "tokens": stats.tokens}

    def _publish(self) -> float:
        t0 = time.time()
        staging = self.weights.staging_dir(self.policy)
        save_policy(self.model, None, staging)
        self.version = self.weights.publish(self.policy, staging, step=self.step)
        store = self.ctx.flow.store
        self.weights.prune(self.policy, keep_last=store.keep_last, keep_every=store.keep_every)
        return time.time() - t0

    def run(self, *, max_steps: int | None = None, deadline: float | None = None,
            should_stop=lambda: False) -> int:
        """Train until `max_steps` total steps, the deadline, or `should_stop()`."""
        max_steps = self.ctx.flow.stop.max_steps if max_steps is None else max_steps
        poll = self.ctx.flow.trainer.poll_interval_s
        while self.step < max_steps and not should_stop():
            if deadline is not None and time.time() > deadline:
                break
            sl = self.poll()
            if sl is None:
                time.sleep(poll)
                continue
            res = self.train_on(sl)
            if res.step % 10 == 0:
                m = res.metrics
                log.info("step %d v%d reward %.3f used %d/%d loss %.4f wait %.2fs",
                         res.step, self.version, m["reward_mean"], res.rows_used, res.rows_read,
                         m.get("loss", float("nan")), m["trainer_wait_s"])
        return self.step
