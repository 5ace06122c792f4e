"""Where the autoscaler's workers run: local processes, Modal calls, SkyPilot managed jobs.

One small protocol: `live(pool)` lists the pool's workers (from state that outlives
the autoscaler), `launch(pool, worker_id)` starts one, `retire(pool, workers)` asks
them to stop. Every worker runs the one command `astraflow rollout RUN --worker-id ID`
(SIGTERM: it finishes the batch in hand, commits it and exits, so retiring loses nothing).

    local  a process per worker; pids in <run>/scale/local.json (atomic rewrite)
    modal  Rollout().run.spawn(...) of the deployed app; call ids in <store>/_scale/modal.json;
           retire = FunctionCall.cancel()
    sky    one managed job per worker named <flow>-<pool>-<id>; the job queue is the
           state; retire = sky.jobs.cancel(name=...)
Modal and SkyPilot are imported inside the methods that call them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from astraflow.policies import Pool

log = logging.getLogger("astraflow.scale")


@dataclass(frozen=True)
class Worker:
    worker_id: str
    pool: str
    started: float
    handle: str = ""  # pid, Modal call id, or SkyPilot job name


def new_worker_id(pool: Pool) -> str:
    return f"{pool.name}-{uuid.uuid4().hex[:6]}"


class Backend(Protocol):
    def live(self, pool: Pool) -> list[Worker]: ...
    def launch(self, pool: Pool, worker_id: str) -> Worker: ...
    def retire(self, pool: Pool, workers: list[Worker]) -> None: ...
    def preemptions(self, pool: Pool, run_started: float) -> tuple[int, float | None]:
        """Workers the cloud took from `pool` in the last hour, and seconds since it last
        took one (since `run_started` if it never did; None: unknown)."""
        ...


class _JsonState:
    """A small JSON object in a file or an object store, rewritten whole (atomic)."""

    def __init__(self, objects, rel: str):
        self.objects, self.rel = objects, rel

    def read(self) -> dict:
        try:
            return json.loads(self.objects.get_bytes(self.rel))
        except FileNotFoundError:
            return {}

    def write(self, d: dict) -> None:
        self.objects.put_bytes(self.rel, json.dumps(d, indent=1).encode())


class LocalBackend:
    """Worker processes on this machine, started detached (they outlive the autoscaler)."""

    def __init__(self, run_dir: str | Path, *, threads: int = 1, minutes: float = 60.0,
                 command: tuple[str, ...] = (sys.executable,)):
        from astraflow.stores.objects import ObjectStore

        self.run_dir = Path(run_dir).resolve()
        self.state = _JsonState(ObjectStore(self.run_dir), "scale/local.json")
        self.threads, self.minutes, self.command = threads, minutes, tuple(command)
        self._children: dict[int, subprocess.Popen] = {}  # ours: reaped, so no zombies

    def _alive(self, pid: int) -> bool:
        from astraflow.local.supervise import is_component

        child = self._children.get(pid)
        if child is not None:
            return child.poll() is None
        return is_component(pid, self.run_dir)

    def live(self, pool: Pool) -> list[Worker]:
        state = self.state.read()
        alive = {k: v for k, v in state.items() if self._alive(v["pid"])}
        if alive.keys() != state.keys():
            self.state.write(alive)
        return sorted((Worker(k, v["pool"], v["started"], str(v["pid"]))
                       for k, v in alive.items() if v["pool"] == pool.name),
                      key=lambda w: w.started)

    def launch(self, pool: Pool, worker_id: str) -> Worker:
        from astraflow.local.supervise import process_env

        logs = self.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **process_env(self.threads)}
        env.pop("ASTRAFLOW_LAUNCHER_PID", None)  # not tied to the autoscaler's life
        with (logs / f"rollout-{worker_id}.log").open("ab") as out:
            proc = subprocess.Popen(
                [*self.command, "-m", "astraflow", "rollout", str(self.run_dir),
                 "--worker-id", worker_id, "--minutes", str(self.minutes)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True)
        self._children[proc.pid] = proc
        w = Worker(worker_id, pool.name, time.time(), str(proc.pid))
        state = self.state.read()
        state[worker_id] = {"pid": proc.pid, "pool": pool.name, "started": w.started}
        self.state.write(state)
        log.info("launched local worker %s (pid %d)", worker_id, proc.pid)
        return w

    def retire(self, pool: Pool, workers: list[Worker]) -> None:
        for w in workers:
            try:
                os.kill(int(w.handle), signal.SIGTERM)  # finishes its batch, then exits
                log.info("retiring local worker %s (pid %s)", w.worker_id, w.handle)
            except ProcessLookupError:
                pass

    def preemptions(self, pool: Pool, run_started: float) -> tuple[int, float | None]:
        return 0, None  # no cloud takes local processes; no clock reported, as before


class ModalBackend:
    """Calls of the deployed Modal app (`modal deploy apps/rollout.py`), one per worker."""

    def __init__(self, store: str, *, app: str = "astraflow-rollout", minutes: float = 60.0,
                 retry_budget_s: float = 120.0):
        from astraflow.stores.objects import ObjectStore

        self.store, self.app, self.minutes = store, app, minutes
        self.state = _JsonState(ObjectStore(store, retry_budget_s=retry_budget_s),
                                "_scale/modal.json")

    def _cls(self, pool: Pool):
        import modal

        from astraflow.cloud.jobs import MODAL_CLASS

        cls = modal.Cls.from_name(self.app, MODAL_CLASS)
        return cls.with_options(gpu=pool.accelerator) if pool.accelerator else cls

    @staticmethod
    def _running(call_id: str) -> bool:
        import modal

        try:
            modal.FunctionCall.from_id(call_id).get(timeout=0)
        except TimeoutError:
            return True
        except Exception as err:  # finished with an error, cancelled, expired: not running
            log.info("modal call %s is over: %s", call_id, type(err).__name__)
        return False

    def live(self, pool: Pool) -> list[Worker]:
        state = self.state.read()
        alive = {k: v for k, v in state.items() if self._running(v["call"])}
        if alive.keys() != state.keys():
            self.state.write(alive)
        return sorted((Worker(k, v["pool"], v["started"], v["call"]) for k, v in alive.items()
                       if v["pool"] == pool.name), key=lambda w: w.started)

    def launch(self, pool: Pool, worker_id: str) -> Worker:
        fc = self._cls(pool)().run.spawn(target=self.store, worker_id=worker_id,
                                         minutes=self.minutes, region=pool.region or None)
        w = Worker(worker_id, pool.name, time.time(), fc.object_id)
        state = self.state.read()
        state[worker_id] = {"call": fc.object_id, "pool": pool.name, "started": w.started}
        self.state.write(state)
        return w

    def retire(self, pool: Pool, workers: list[Worker]) -> None:
        import modal

        for w in workers:
            modal.FunctionCall.from_id(w.handle).cancel()

    def preemptions(self, pool: Pool, run_started: float) -> tuple[int, float | None]:
        return 0, None  # Modal retries preempted inputs itself (apps/rollout.py: retries)


class SkyBackend:
    """One SkyPilot managed job per worker (`sky/rollout.sky.yaml`), named
    `<flow>-<pool>-<id>`, pinned to the pool's cloud/region/accelerator and spot choice."""

    TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "FAILED_SETUP", "FAILED_PRECHECKS",
                "FAILED_NO_RESOURCE", "FAILED_CONTROLLER", "CANCELLING")

    def __init__(self, store: str, flow_name: str, *, minutes: float = 60.0,
                 environ: dict[str, str] | None = None):
        self.store, self.flow_name, self.minutes = store, flow_name, minutes
        self.env = dict(os.environ if environ is None else environ)

    def _prefix(self, pool: Pool) -> str:
        from astraflow.cloud.jobs import job_name

        return job_name(self.flow_name, pool.name) + "-"

    def _mine(self, pool: Pool, name: str) -> str | None:
        """The worker suffix if job `name` is one of `pool`'s (`<flow>-<pool>-x<suffix>`;
        the `x` keeps pool `a` from claiming pool `a-od`'s jobs), else None."""
        pre = self._prefix(pool)
        rest = name[len(pre):] if name.startswith(pre) else ""
        return rest[1:] if re.fullmatch(r"x[0-9a-z]+", rest) else None

    def _records(self) -> list[dict]:
        import sky

        result = sky.get(sky.jobs.queue_v2(refresh=False, skip_finished=True))
        return list(result[0] if isinstance(result, tuple) else result)

    def live(self, pool: Pool) -> list[Worker]:
        out = []
        for r in self._records():
            name, status = r.get("job_name") or "", str(r.get("status", ""))
            suffix = self._mine(pool, name)
            if suffix is not None and not any(status.endswith(s) for s in self.TERMINAL):
                out.append(Worker(f"{pool.name}-{suffix}", pool.name,
                                  float(r.get("submitted_at") or 0.0), name))
        return sorted(out, key=lambda w: w.started)

    def job(self, pool: Pool, worker_id: str):
        from astraflow.cloud.jobs import OPTIONAL_SECRETS, REQUIRED_SECRETS, SkyJob
        from astraflow.cloud.skypilot import ROLLOUT_TASK

        acc = f"{pool.accelerator}:{pool.accelerator_count}" if pool.accelerator else None
        infra = "/".join(x for x in (pool.cloud, pool.region) if x)
        entry = {k: v for k, v in (("infra", infra), ("accelerators", acc)) if v}
        secrets = REQUIRED_SECRETS + tuple(n for n in OPTIONAL_SECRETS if self.env.get(n))
        suffix = worker_id.removeprefix(pool.name + "-")
        if not re.fullmatch(r"[0-9a-z]+", suffix):
            raise ValueError(f"worker id {worker_id!r}: want {pool.name}-<letters/digits>")
        return SkyJob(role="rollout", name=f"{self._prefix(pool)}x{suffix}",
                      task_file=ROLLOUT_TASK, num_jobs=1,
            # The task file names its worker "$ASTRAFLOW_POOL-<job id>-<rank>": our id first,
            # so the autoscaler finds this worker's rows by prefix.
            envs={"ASTRAFLOW_STORE": self.store, "ASTRAFLOW_POOL": worker_id,
                  "ASTRAFLOW_MINUTES": str(self.minutes), "ASTRAFLOW_REGION": pool.region},
            secrets=secrets, any_of=(entry,) if entry else (), use_spot=pool.spot,
            # A worker that fails on its own is not restarted (SkyPilot still relaunches a
            # preempted one; the policy sees it through `preemptions_1h`).
            job_recovery={"max_restarts_on_errors": 0}, pool=pool.name,
            command=f"astraflow rollout {self.store} --worker-id {worker_id}")

    def launch(self, pool: Pool, worker_id: str) -> Worker:
        import sky
        from astraflow.cloud.skypilot import build_sky_task

        job = self.job(pool, worker_id)
        task = build_sky_task(job, secrets={n: self.env[n] for n in job.secrets
                                            if self.env.get(n)})
        sky.stream_and_get(sky.jobs.launch(task, name=job.name))
        return Worker(worker_id, pool.name, time.time(), job.name)

    def retire(self, pool: Pool, workers: list[Worker]) -> None:
        import sky

        for w in workers:  # SkyPilot stops the job; a batch in flight is lost, never half-written
            sky.get(sky.jobs.cancel(name=w.handle))

    def preemptions(self, pool: Pool, run_started: float) -> tuple[int, float | None]:
        """From one listing of the job queue: this pool's live jobs that SkyPilot
        recovered from a preemption (it relaunches a preempted managed job itself) within
        the last hour, each once (the queue keeps only a job's latest recovery time, so
        two in the hour count one; a job with no recovery time counts its whole
        `recovery_count`); and seconds since the latest recovery (since `run_started`
        if none; None where a recovery's time is unknown): the cost policy's preemption
        clock (`PoolState.since_preemption_s`). Only the last hour counts, so one old
        preemption does not keep a pool "short of capacity" for the rest of a run."""
        now, n_1h, times = time.time(), 0, []
        for r in self._records():
            n = int(r.get("recovery_count") or 0)
            if n <= 0 or self._mine(pool, r.get("job_name") or "") is None:
                continue
            at = r.get("last_recovered_at")
            at = float(at) if at is not None and float(at) > 0 else None
            n_1h += n if at is None else int(now - at <= 3600.0)
            times.append(at)
        if any(at is None for at in times):
            return n_1h, None
        return n_1h, now - max(times, default=run_started)
