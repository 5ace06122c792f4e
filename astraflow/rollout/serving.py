"""The endpoint worker mode: a rollout worker whose episodes come from your agent.

    agent (any OpenAI client) ──HTTP──► endpoint.py ──jobs──► one generation thread
        (batches concurrent calls per policy, the engine at its loaded version)
    background loop (every 0.25 s): reload weights / backpressure (RolloutWorker.room),
        drop episodes past the reward timeout, write complete groups ──► traj_<policy>

It reuses the rollout worker's weights and backpressure: a call waits while its
policy's backlog is full or its weights trail too far, as a worker's batch would.
The engine serves one batch at a time under a lock that weight reloads take too.
Stopping (SIGTERM, `stop()`) ends the server, then writes every rewarded group.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import queue
import threading
import time
from collections import defaultdict
from concurrent.futures import Future
from dataclasses import dataclass, field

from astraflow.context import RunContext
from astraflow.models.codec import Codec
from astraflow.rollout.episodes import Book, row_dict
from astraflow.rollout.generation import LENGTH, generate_with_stops
from astraflow.rollout.worker import RolloutWorker

log = logging.getLogger("astraflow.rollout.endpoint")
ENDPOINT_FILE = "endpoint.json"


@dataclass
class Job:
    """One call's generation: done through `future` as (ids, logprobs, finish, version)."""

    policy: str
    prompt: list[int]
    max_tokens: int
    greedy: bool
    stop: tuple[str, ...]
    future: Future = field(default_factory=Future)


class Refused(RuntimeError):
    """The endpoint will not start as configured (the message says what to change)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Served:
    """A run's endpoint worker: engines, the episode book, the writer loop, the server."""

    def __init__(self, ctx: RunContext, worker_id: str = "w0", *, region: str | None = None):
        spec = ctx.flow.rollout.endpoint
        if spec is None:
            raise ValueError("this flow has no rollout.endpoint: the worker plays the workflow")
        self.ctx, self.spec, self.worker_id = ctx, spec, worker_id
        self.token = os.environ.get(spec.token_env) or None
        if not is_loopback(spec.host) and not self.token:
            raise Refused(
                f"rollout.endpoint.host is {spec.host!r}, reachable from other machines: set a "
                f"bearer token in ${spec.token_env} (clients then send `Authorization: Bearer "
                f"<token>`), or listen on 127.0.0.1")
        self.worker = RolloutWorker(ctx, worker_id, region=region)
        self.policies = self.worker.policies
        self.book = Book(group_size=ctx.flow.rollout.samples_per_prompt,
                         timeout_s=spec.reward_timeout_s)
        self.engine_lock = threading.Lock()
        self.jobs: queue.Queue[Job] = queue.Queue()
        self.open: set[str] = set()
        self.rows_written = 0
        self.gen_s: dict[str, float] = defaultdict(float)
        self._dropped_logged = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.server = None
        self.url = ""

    @property
    def codec(self) -> Codec:
        """The primary policy's codec (every policy of a flow shares the tokenizer)."""
        return self.worker.codec

    def version(self, policy: str) -> int | None:
        return self.worker.versions[policy]

    # -- generation --------------------------------------------------------------
    def submit(self, policy: str, prompt: list[int], max_tokens: int, greedy: bool,
               stop: tuple[str, ...]) -> Future:
        """Queue one call's generation; its future gives (ids, logprobs, finish, version)."""
        job = Job(policy, prompt, max_tokens, greedy, stop)
        self.jobs.put(job)
        return job.future

    def _generate_loop(self) -> None:
        while not self._stop.is_set():
            try:
                first = self.jobs.get(timeout=0.1)
            except queue.Empty:
                continue
            batch = [first]
            while len(batch) < 64:
                try:
                    batch.append(self.jobs.get_nowait())
                except queue.Empty:
                    break
            groups: dict[tuple, list[Job]] = defaultdict(list)
            for j in batch:
                groups[(j.policy, j.greedy, j.stop)].append(j)
            for (policy, greedy, stop), jobs in groups.items():
                self._run(policy, greedy, stop, jobs)

    def _run(self, policy: str, greedy: bool, stop: tuple[str, ...], jobs: list[Job]) -> None:
        ro = self.ctx.flow.rollout
        width = max(j.max_tokens for j in jobs)
        try:
            with self.engine_lock:
                t0 = time.time()
                version = self.worker.versions[policy]
                out = generate_with_stops(
                    self.worker.engines[policy], [j.prompt for j in jobs], stop,
                    max_new_tokens=width, temperature=ro.temperature, greedy=greedy,
                    generator=self.worker.gen, max_prompt_tokens=ro.max_prompt_tokens)
                self.gen_s[policy] += time.time() - t0
        except Exception as err:  # the callers answer with it; the loop serves on
            for j in jobs:
                j.future.set_exception(err)
            return
        for j, ids, lps, why in zip(jobs, out.completions, out.logprobs, out.finish_reasons,
                                    strict=True):
            if len(ids) > j.max_tokens:  # generated with a wider batch's budget: cut
                ids, lps, why = ids[: j.max_tokens], lps[: j.max_tokens], LENGTH
            j.future.set_result((ids, lps, why, version))

    # -- writing ----------------------------------------------------------------
    def flush(self, *, flush_all: bool = False) -> int:
        """Drop late episodes, write ready groups (one commit per policy); rows written."""
        self.book.expire()
        ready = self.book.take_ready(flush_all=flush_all)
        rows: dict[str, list[dict]] = defaultdict(list)
        host = self.worker.host
        for group, members in ready:
            for row, reward, task, episode in members:
                rows[row.policy].append(row_dict(
                    row, reward, group, task, episode, worker=self.worker_id,
                    region=self.worker.region, host=host,
                    role=self.ctx.flow.role_of(row.policy)))
        dropped = self.book.dropped - self._dropped_logged
        if not rows and not dropped:
            return 0
        total = 0
        metrics = []
        for policy in self.policies:
            prow = rows.get(policy, [])
            if prow:
                self.worker.traj.append(policy, prow)
                total += len(prow)
            values = {"rows": len(prow), "episodes_dropped": dropped,
                      "gen_s": self.gen_s.pop(policy, 0.0)}
            if prow:
                values["reward_mean"] = sum(r["reward"] for r in prow) / len(prow)
            metrics.append((policy, self.worker.batches, values))
        self.worker.batches += 1
        self._dropped_logged += dropped
        self.rows_written += total
        self.worker.ledger.log_many("rollout", metrics, more=[
            ("worker", self.worker_id, self.worker.batches, {"worker_rows": total})])
        return total

    def _maintain_loop(self) -> None:
        while not self._stop.wait(0.25):
            try:
                with self.engine_lock:  # a reload swaps weights: never mid-generation
                    self.open = {p for p in self.policies if self.worker.room(p)}
                self.flush()
            except Exception:  # keep serving; the log says what failed
                log.exception("%s: endpoint maintenance failed", self.worker_id)

    # -- lifecycle ----------------------------------------------------------------
    def start(self, *, wait_s: float = 600.0) -> str:
        """Load every policy's weights, start the server and loops; returns the URL."""
        import uvicorn

        from astraflow.rollout.endpoint import make_app

        deadline = time.monotonic() + wait_s
        while not all(v is not None for v in self.worker.versions.values()):
            self.worker.refresh_weights()
            if time.monotonic() > deadline:
                raise RuntimeError(f"no weights to serve after {wait_s:.0f}s")
            time.sleep(0.2)
        self.open = set(self.policies)
        config = uvicorn.Config(make_app(self), host=self.spec.host, port=self.spec.port,
                                log_level="warning", lifespan="off", ws="none",
                                timeout_graceful_shutdown=10)
        self.server = uvicorn.Server(config)
        for target in (self.server.run, self._generate_loop, self._maintain_loop):
            t = threading.Thread(target=target, daemon=True, name=f"endpoint-{target.__name__}")
            t.start()
            self._threads.append(t)
        while not self.server.started:
            if not self._threads[0].is_alive():
                raise Refused(f"the endpoint could not listen on {self.spec.host}:"
                                   f"{self.spec.port} (see the log above)")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        host = f"[{self.spec.host}]" if ":" in self.spec.host else self.spec.host
        self.url = f"http://{host}:{port}"
        (self.ctx.run_dir / ENDPOINT_FILE).write_text(json.dumps(
            {"url": self.url, "base_url": f"{self.url}/v1", "pid": os.getpid(),
             "worker": self.worker_id, "models": self.policies}))
        log.info("%s: serving %s at %s/v1", self.worker_id, ", ".join(self.policies), self.url)
        return self.url

    def stop(self) -> None:
        """Stop the server and loops, then write every rewarded group."""
        if self.server is not None:  # calls in flight finish first (at most 10 s)
            self.server.should_exit = True
            self._threads[0].join(timeout=30)
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)
        self.flush(flush_all=True)
        where = self.ctx.run_dir / ENDPOINT_FILE
        if where.is_file() and json.loads(where.read_text()).get("pid") == os.getpid():
            where.unlink()  # an agent waiting for the next start must not find this URL

    def run(self, should_stop=lambda: False, deadline: float | None = None) -> None:
        """Serve until `should_stop()` or the deadline (the `astraflow rollout` command)."""
        self.start()
        try:
            while not should_stop() and (deadline is None or time.time() < deadline):
                if not self._threads[0].is_alive():
                    raise RuntimeError("the endpoint's server stopped")
                time.sleep(0.2)
        finally:
            self.stop()
