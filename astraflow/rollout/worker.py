"""The rollout worker: a stateless loop that turns weights into trajectories.

    weights/<policy>/latest ──(verify sha256, swap in place)──► one engine per policy
                                  (policies sharing a base: one base, an adapter each)
    workload.sample(seeded rng) ──► tasks ──► workflow.episodes(tasks, actor)
        ──► one Part per policy per episode ──► traj_<policy> (one commit per table)

It serves every policy the workflow casts and reloads each when its trainer publishes.
Before each batch it decides which roles to play (astraflow/rollout/admission.py): a
policy is *open* while the batch's rows would still fit its backlog bound and the
worker's weights trail the newest version by at most `max_weight_lag`; a closed
policy's roles are not started (`rows_not_started`), and a role plays only with the
roles whose turns it reads, so one slow trainer neither stalls the others nor costs
generation that nobody trains. The worker waits while no role can play. Kill it at any
instant: nothing is lost but the batch it had not committed.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import torch

from astraflow.context import RunContext
from astraflow.models.codec import Codec
from astraflow.rollout.adapters import SharedAdapters
from astraflow.rollout.admission import Admission, PolicyState, admit, fits, rows_not_started
from astraflow.rollout.engine import make_engine
from astraflow.rollout.generation import Engine, Generation, generate_with_stops
from astraflow.rollout.sampler import TaskSampler
from astraflow.stores import TamperedWeights, WeightError, retry
from astraflow.workflows import Workflow
from astraflow.workflows.workload import make_env, make_workflow

log = logging.getLogger("astraflow.rollout")


class _Actor:
    """What the workflow sees: generate as a role (with that role's policy), wait."""

    def __init__(self, worker: RolloutWorker, roles: frozenset[str]):
        self.w = worker
        self.roles = roles  # what this batch admitted: generating another role is a bug
        self.codec = worker.workflow.codec
        self.gen_s: dict[str, float] = defaultdict(float)
        self.truncated: dict[str, int] = defaultdict(int)
        self.completions: dict[str, int] = defaultdict(int)
        self.env_wait_s = 0.0

    def generate(self, role: str, prompts: list[list[int]], *, samples: int,
                 max_new_tokens: int, stop: Sequence[str] = ()) -> Generation:
        if role not in self.roles:
            raise RuntimeError(f"workflow {self.w.ctx.flow.workflow.name!r} played role "
                               f"{role!r}, which this batch did not admit "
                               f"(admitted: {sorted(self.roles)})")
        policy = self.w.cast[role]
        engine = self.w.engines[policy]
        ro = self.w.ctx.flow.rollout
        t0 = time.time()
        out = generate_with_stops(
            engine, prompts, stop, samples_per_prompt=samples, max_new_tokens=max_new_tokens,
            temperature=ro.temperature, generator=self.w.gen,
            max_prompt_tokens=ro.max_prompt_tokens)
        self.gen_s[policy] += time.time() - t0
        self.truncated[policy] += sum(r == "length" for r in out.finish_reasons)
        self.completions[policy] += len(out.completions)
        return out

    def env_wait(self) -> None:
        latency = self.w.ctx.flow.env.turn_latency_ms / 1000.0
        if latency > 0:
            time.sleep(latency)
            self.env_wait_s += latency


class RolloutWorker:
    def __init__(self, ctx: RunContext, worker_id: str, *, region: str | None = None):
        self.ctx, self.worker_id = ctx, worker_id
        self.cast = ctx.flow.role_map()  # role → policy
        self.policies = ctx.flow.policy_names()
        self.region = region or os.environ.get("ASTRAFLOW_REGION", "local")
        self.traj = ctx.trajectories()
        # A worker in a region with a weight replica reads from it: near, and cheap egress.
        self.weights = ctx.weights(self.region)
        self.ledger = ctx.ledger()
        # The workflow encodes with the codec saved with the primary policy's weights:
        # built on the first load (a worker may start before version 0 exists).
        self._workflow: Workflow | None = None
        self.env = make_env(ctx.flow)
        # Seeded per worker and per start, so restarted workers do not replay tasks.
        seed = hash((ctx.flow.seed, worker_id, time.time_ns())) & 0x7FFFFFFF
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.sampler = TaskSampler(self.env, self.rng,
                                   skip_versions=ctx.flow.rollout.skip_solved_versions)
        self.engines: dict[str, Engine] = {}
        self.shared: dict[str, SharedAdapters] = {}  # model.shared_base → its one engine
        self.versions: dict[str, int | None] = dict.fromkeys(self.policies)
        self.newest: dict[str, int | None] = dict.fromkeys(self.policies)
        self.host = socket.gethostname()
        self.batches = 0
        self.last_wait_s = 0.0
        # The roles the next batch plays; a direct produce_batch() plays every role.
        self.admission = Admission(frozenset(self.cast))
        self.open: set[str] = set(self.policies)  # policies whose rows the next batch appends
        # bounds checked every poll: worked out once
        self.batch_rows = {p: ctx.flow.batch_rows(p) for p in self.policies}
        self.backlog_limit = {p: ctx.flow.backlog_rows(p) for p in self.policies}
        self.step_rows_max = {p: self._step_rows_max(p) for p in self.policies}
        self.reload_s: dict[str, float] = defaultdict(float)

    @property
    def workflow(self) -> Workflow:
        """The flow's workflow, encoding with the primary policy's codec (from its loaded
        weights). Every policy of a workflow shares that tokenizer (flow validation)."""
        if self._workflow is None:
            primary = self.policies[0]
            if primary not in self.engines:
                raise RuntimeError("the workflow needs the primary policy's weights: "
                                   "refresh_weights() first")
            self._workflow = make_workflow(self.ctx.flow, self.engines[primary].codec)
        return self._workflow

    @property
    def codec(self) -> Codec:
        return self.workflow.codec

    @property
    def version(self) -> int | None:
        """The loaded version of the primary policy (the only one in one-policy flows)."""
        return self.versions[self.policies[0]]

    # -- weights -----------------------------------------------------------
    def refresh_weights(self, policies: list[str] | None = None) -> bool:
        """Load the newest verified version of each policy; keep the previous one of a
        policy whose newest fails. True if any policy changed."""
        changed = False
        for p in policies or self.policies:
            changed |= self._refresh(p)
        return changed

    def _refresh(self, policy: str) -> bool:
        latest = self.newest[policy] = self.weights.latest(policy)
        held = self.versions[policy]
        if latest is None or latest == held:
            return False
        t0 = time.time()  # the reload: fetch (S3), verify sha256, swap into the engine
        try:
            path = self.weights.load(policy, latest)
        except TamperedWeights as err:
            log.warning("%s: refusing %s v%d (%s); keeping v%s", self.worker_id, policy,
                        latest, err, held)
            return False
        except WeightError as err:  # pruned between listing and loading: try again later
            log.info("%s: %s v%d vanished before loading (%s)", self.worker_id, policy,
                     latest, err)
            return False
        try:
            if policy not in self.engines:
                self.engines[policy] = self._engine(policy, path)
            else:
                self.engines[policy].load_weights(path)
        except OSError as err:
            # Pruned while reading: keep what we had. transformers reports a folder that
            # vanished mid-load as an OSError about a repo id, not FileNotFoundError, so
            # tell a pruned version (its folder is gone) from a real I/O failure.
            if Path(path).exists() and not isinstance(err, FileNotFoundError):
                raise
            log.info("%s: %s v%d pruned while loading (%s)", self.worker_id, policy,
                     latest, err)
            return False
        self.versions[policy] = latest
        self.reload_s[policy] += time.time() - t0  # reported with the next batch
        return True

    def _engine(self, policy: str, path: Path) -> Engine:
        """A policy's engine on its first version: its own, or its adapter on the one
        copy of a base it shares (`model.shared_base`) with other policies."""
        model = self.ctx.flow.policy_spec(policy).model
        if model.shared_base is not None:
            shared = self.shared.get(model.shared_base)
            if shared is None:
                shared = self.shared[model.shared_base] = SharedAdapters(path, dtype=model.dtype)
            return shared.engine_for(policy, path)
        return make_engine(self.ctx.flow.rollout.engine, path, dtype=model.dtype,
                           lora_rank=model.lora.r if model.lora else None,
                           gpu_memory_utilization=self.ctx.flow.rollout.gpu_memory_utilization)

    # -- backpressure --------------------------------------------------------
    def policy_state(self, policy: str, incoming: int | None = None) -> PolicyState:
        """Whether `policy` is open for `incoming` more rows (default: one batch of its
        rows; weights loaded, lag in bounds, backlog + incoming within the bound), whether
        its trainer is done, and the batches its table holds. Reloads its weights when
        its trainer has published since."""
        # The trainer's progress file names its newest version: list the weight store
        # (a LIST request on S3) only when that differs from ours.
        progress = self.ledger.progress(policy)
        if progress is None or progress.weight_version != self.versions[policy]:
            self._refresh(policy)
            if progress is not None and self.newest[policy] is not None:
                # A replica may trail the trainer: the lag counts from the trainer's newest.
                self.newest[policy] = max(self.newest[policy], progress.weight_version)
        else:
            self.newest[policy] = progress.weight_version
        held, newest = self.versions[policy], self.newest[policy]
        lag = 0 if newest is None or held is None else newest - held
        # Two counts: one that may count a moving row twice (the backlog, erring toward
        # closed), one that may miss it (erring toward "more rows needed").
        rows, rows_min = self.traj.count(policy), self.rows_at_least(policy)
        consumed = progress.rows_consumed if progress else 0
        incoming = self.batch_rows[policy] if incoming is None else incoming
        # Predicted closure for good: the rows already in its table cover every step
        # its trainer has left, so a row started now would never be trained.
        steps_left = self.ctx.flow.stop.max_steps - (progress.step + 1 if progress else 0)
        return PolicyState(
            open=(held is not None and lag <= self.ctx.flow.rollout.max_weight_lag
                  and fits(rows - consumed, incoming, self.backlog_limit[policy])),
            done=rows_min - consumed >= steps_left * self.step_rows_max[policy],
            batches=rows / self.batch_rows[policy],
            batches_min=rows_min / self.batch_rows[policy])

    def _step_rows_max(self, policy: str) -> int:
        """The most rows one trainer step of `policy` may consume: `step_rows` (default a
        batch), or with the batch fill (`min_signal_rows`) the backlog bound. "Done"
        counts steps left at this size, so a trainer is never left waiting for rows."""
        algo = self.ctx.flow.policy_spec(policy).algorithm
        if algo.min_signal_rows is not None:
            return self.backlog_limit[policy]
        return max(algo.step_rows or 0, self.batch_rows[policy])

    def rows_at_least(self, policy: str) -> int:
        """`policy`'s rows, a lower bound: `TrajectoryStore.count` may count a row that
        moves (staged → table → archive) twice for a moment; reading each place before
        the one its rows move from may miss it for a moment instead, never count it twice."""
        def rows(table) -> int:
            table.checkout_latest()
            return int(table.count_rows())

        where = f"table {policy!r} at {self.traj.uri}"
        arch = self.traj.archive(policy)
        old = 0 if arch is None else retry.call(lambda: rows(arch), what=f"retired rows of {where}",
                                                 budget_s=self.traj.budget_s)
        live = retry.call(lambda: rows(self.traj.table(policy)), what=f"rows of {where}",
                          budget_s=self.traj.budget_s)
        return old + live + self.traj.pending(policy)

    def room(self, policy: str, incoming: int = 1) -> bool:
        """Whether `policy` takes `incoming` more rows now (the endpoint's check: it
        appends episodes as agents finish them, not whole batches)."""
        return self.policy_state(policy, incoming).open

    def admit(self) -> Admission:
        """Check every policy (reloading any that published) and decide the next batch's
        roles (astraflow/rollout/admission.py); sets `self.admission` and `self.open`."""
        states = {p: self.policy_state(p) for p in self.policies}
        roles = list(self.cast)
        self.admission = admit(roles, self.cast, lambda r: self.workflow.needs(r, roles),
                               states, self.ctx.flow.rollout.max_lead_batches)
        self.open = {self.cast[r] for r in self.admission.keep}
        return self.admission

    def wait_for_room(self, should_stop=lambda: False, poll_s: float = 0.05) -> float:
        """Block until some role can play and every policy has weights; returns seconds
        waited. `self.admission` then names the roles the next batch plays, `self.open`
        the policies whose rows it appends."""
        t0 = time.time()
        while not should_stop():
            if all(v is not None for v in self.versions.values()):
                if self.admit().play:
                    break
            else:
                self.refresh_weights()
            self.ledger.flush_due()  # a held-back worker's last metrics show soon
            time.sleep(poll_s)
        return time.time() - t0

    # -- one batch ---------------------------------------------------------------
    def produce_batch(self) -> int:
        """Run one batch of episodes with the admitted roles (`self.admission`); append
        each kept role's rows (one commit per policy). Returns rows written."""
        assert all(v is not None for v in self.versions.values()), "refresh_weights() first"
        ro = self.ctx.flow.rollout
        adm = self.admission
        t0 = time.time()
        version = self.version  # the batch's tasks and their solved record use one version
        tasks = self.sampler.draw(ro.prompts_per_batch, version)
        actor = _Actor(self, adm.play)
        parts = self.workflow.episodes(tasks, actor)
        stray = {p.role for p in parts} - adm.play
        if stray:
            raise RuntimeError(f"workflow {self.ctx.flow.workflow.name!r} returned parts "
                               f"for role(s) {sorted(stray)} this batch did not admit")
        self.sampler.record(parts, version)
        t_roll = time.time()
        now = datetime.now(UTC)
        batch_tag = uuid.uuid4().hex[:12]  # unique across restarts of this worker id
        rows: dict[str, list[dict]] = {p: [] for p in self.policies}
        fed: dict[str, int] = dict.fromkeys(self.policies, 0)
        played = sorted(adm.play)
        for part in parts:
            policy = self.cast[part.role]
            if part.role not in adm.keep:  # input to a kept role; its policy is done
                fed[policy] += 1
                continue
            rows[policy].append({
                "traj_id": uuid.uuid4().hex, "group_id": f"{self.worker_id}-{batch_tag}-{part.group}",
                "policy": policy, "behavior_version": self.versions[policy],
                "prompt_ids": part.prompt_ids, "completion_ids": part.completion_ids,
                "behavior_logprobs": part.logprobs, "loss_mask": part.loss_mask,
                "reward": part.reward, "env": self.env.name, "task_id": part.task_id,
                "worker": self.worker_id, "region": self.region, "created_at": now,
                "extras": json.dumps({
                    "host": self.host, "role": part.role, "roles_played": played,
                    "finish_reason": part.finish_reason, **part.extras}),
            })
        wf_cls, params = type(self.workflow), self.ctx.flow.workflow.params
        held = rows_not_started(
            list(self.cast), self.cast, adm.play,
            lambda r: ro.prompts_per_batch * wf_cls.parts_per_task(r, params, ro.samples_per_prompt))
        self.batches += 1
        total = 0
        metrics = []
        for policy, prow in rows.items():
            if policy in self.open and not prow:
                raise RuntimeError(f"workflow {self.ctx.flow.workflow.name!r} produced no part "
                                   f"for policy {policy!r} in a batch")
            values = {"rows": len(prow), "rows_not_started": held[policy],
                      "rows_fed": fed[policy], "batch_s": t_roll - t0,
                      "backpressure_s": self.last_wait_s,
                      "reload_s": self.reload_s.pop(policy, 0.0),
                      "draws_skipped": self.sampler.skipped}
            if actor.completions[policy]:  # it generated: as kept or fed
                values.update(gen_s=actor.gen_s[policy], env_wait_s=actor.env_wait_s,
                              truncated_frac=actor.truncated[policy] / actor.completions[policy])
            if prow:
                t_a = time.time()
                self.traj.append(policy, prow)
                total += len(prow)
                values.update(
                    append_s=time.time() - t_a,
                    reward_mean=sum(r["reward"] for r in prow) / len(prow),
                    # multi-turn episodes (tool_agent): seconds their tool calls took, summed
                    tool_s=sum(float(p.extras.get("tool_s", 0.0)) for p in parts
                               if self.cast[p.role] == policy and p.role in adm.keep))
            metrics.append((policy, self.batches, values))
        # Per worker, for the autoscaler: component `worker`, keyed by the worker's id (the
        # `rollout` rows above are keyed by policy).
        self.ledger.log_many("rollout", metrics,
                             more=[("worker", self.worker_id, self.batches, {"worker_rows": total})])
        return total

    def run(self, *, max_batches: int | None = None, deadline: float | None = None,
            should_stop=lambda: False) -> int:
        def done() -> bool:  # the deadline also ends a wait for room (a full backlog)
            return should_stop() or (deadline is not None and time.time() > deadline)

        # Metrics are batched only inside this loop (`store.metrics_every_s`), which
        # flushes them when it ends: a direct `produce_batch` commits its own at once.
        self.ledger.metrics_every_s = self.ctx.flow.store.metrics_every_s
        try:
            self._loop(done, max_batches)
        finally:
            self.ledger.metrics_every_s = 0.0
            self.ledger.flush_metrics()
        return self.batches

    def _loop(self, done, max_batches: int | None) -> None:
        while not done():
            if max_batches is not None and self.batches >= max_batches:
                break
            self.last_wait_s = self.wait_for_room(done)
            if done():
                break
            n = self.produce_batch()
            if self.batches % 20 == 0:
                log.info("%s: %d batches, last %d rows with %s", self.worker_id, self.batches, n,
                         ", ".join(f"{p} v{v}" for p, v in self.versions.items()))
