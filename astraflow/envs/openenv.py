"""`openenv`: an OpenEnv environment server, driven through OpenEnv's client.

The env is a server built with OpenEnv's server API (`create_app(Environment, Action,
Observation)`) and started the way OpenEnv starts one locally: `uvicorn MODULE:app`
(what its UV provider runs), here on 127.0.0.1 at a free port, one server per process,
ready when `/health` answers. Or `base_url` names a server already running. Each
episode is one session of OpenEnv's client (`GenericEnvClient`, a WebSocket, so the
server keeps one env instance per episode): `reset(seed=N)` opens it, and each model
turn is sent as `step({action_field: text})`. The observation's fields (or the one
`observation_field`) are what the model reads next; the episode's reward is the sum of
the steps' rewards; `done` ends it. Tasks are reset seeds, held out by a hash.

A server that dies mid-episode ends its episodes with finish reason `env_error` (the
reason in the row); a server this env started is started again for the next episodes
(`openenv_restarts` in the rows counts how often). Needs the `openenv` extra.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Mapping
from typing import Any

from astraflow import registry
from astraflow.envs.base import Limits, Task, Tool
from astraflow.envs.split import Split, SplitTasks
from astraflow.envs.stepped import NoDemonstrations, Step

_OWN_FIELDS = ("done", "reward", "metadata")


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


#: `uvicorn.run(APP)`, as `uvicorn APP` runs it, plus a thread that ends the server when
#: the process that started it is gone (a SIGKILLed worker leaves no server behind).
_SERVE = """import os, sys, threading, time
parent = os.getppid()
def watch():
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(1)
threading.Thread(target=watch, daemon=True).start()
import uvicorn
uvicorn.run(sys.argv[1], host=sys.argv[2], port=int(sys.argv[3]), log_level="warning")
"""


class LocalServer:
    """`uvicorn APP` on 127.0.0.1 in a child process, stopped by its pid."""

    def __init__(self, app: str, start_timeout_s: float, cwd: str | None = None):
        self.app, self.start_timeout_s, self.cwd = app, start_timeout_s, cwd
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.owner = os.getpid()
        """The process that started it (a forked worker starts its own)."""
        self.log = tempfile.TemporaryFile()
        """The server's stderr (a file: a pipe nobody reads would block a chatty server)."""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> str:
        host = "127.0.0.1"
        port = _free_port(host)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE, self.app, host, str(port)], cwd=self.cwd, env=env,
            stdout=subprocess.DEVNULL, stderr=self.log)
        self.url = f"http://{host}:{port}"
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                err = self.log.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"OpenEnv server {self.app!r} exited with "
                                   f"{self.proc.returncode} before it was ready: {err}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return self.url
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"OpenEnv server {self.app!r} not ready within "
                           f"{self.start_timeout_s}s at {self.url}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def render(observation: Any, field: str | None) -> str:
    """What the model reads of an observation: one field, or every field but
    OpenEnv's own (`done`, `reward`, `metadata`): a lone one as itself, several as JSON."""
    if not isinstance(observation, Mapping):
        return str(observation)
    if field is not None:
        return str(observation.get(field, ""))
    rest = {k: v for k, v in observation.items() if k not in _OWN_FIELDS}
    if len(rest) == 1:
        return str(next(iter(rest.values())))
    return json.dumps(rest, sort_keys=True)


class OpenEnvSession:
    """One episode: one WebSocket session of OpenEnv's client, reset with the task's seed."""

    def __init__(self, env: OpenEnvEnv, url: str, seed: int):
        from openenv.core import GenericEnvClient

        self.env = env
        self.client = GenericEnvClient(base_url=url, connect_timeout_s=env.step_timeout_s,
                                       message_timeout_s=env.step_timeout_s).sync()
        try:
            self.client.connect()
            res = self.client.reset(seed=seed, **env.reset_params)
        except BaseException:
            self.client.close()
            raise
        self.messages = [{"role": "user", "content": render(res.observation, env.observation_field)}]

    def step(self, text: str) -> Step:
        res = self.client.step({self.env.action_field: text})
        return Step(observation="" if res.done else render(res.observation, self.env.observation_field),
                    reward=float(res.reward or 0.0), done=bool(res.done))

    def close(self, finish: str) -> Step:
        self.client.close()
        return Step(info={"openenv_restarts": self.env.restarts})


class OpenEnvEnv(SplitTasks, NoDemonstrations):
    """Episodes on an OpenEnv server: `app` (`module:app`, started here) or `base_url`."""

    name = "openenv"

    def __init__(self, app: str | None = None, base_url: str | None = None,
                 action_field: str = "message", observation_field: str | None = None,
                 seeds: int = 10000, heldout_fraction: float = 0.1,
                 reset_params: Mapping[str, Any] | None = None, max_turns: int = 4,
                 max_context_tokens: int | None = None, episode_timeout_s: float | None = 120.0,
                 step_timeout_s: float = 30.0, server_start_timeout_s: float = 60.0,
                 success_reward: float = 1.0, turn_stops: list[str] | None = None,
                 max_new_tokens: int = 128):
        registry.require("openenv.core", "openenv", "env 'openenv'")
        if (app is None) == (base_url is None):
            raise ValueError("openenv env: give exactly one of `app` (`module:app`, an OpenEnv "
                             "server this env starts) or `base_url` (one already running)")
        self.app, self.base_url = app, base_url
        self.action_field, self.observation_field = action_field, observation_field
        self.reset_params = dict(reset_params or {})
        self.split = Split({"seeds": [str(i) for i in range(seeds)]}, heldout_fraction,
                           salt="openenv")
        self.tools: Mapping[str, Tool] = {}
        self.limits = Limits(max_turns=max_turns, max_context_tokens=max_context_tokens,
                             episode_timeout_s=episode_timeout_s)
        self.turn_stops = tuple(turn_stops or ())
        self.step_timeout_s, self.success_reward = step_timeout_s, success_reward
        self.server_start_timeout_s = server_start_timeout_s
        self.open_timeout_s = server_start_timeout_s + step_timeout_s
        """Opening may start (or restart) the server first."""
        self._max_new_tokens = max_new_tokens
        self.server: LocalServer | None = None
        self.restarts = 0
        self._lock = threading.Lock()

    def task(self, key: str) -> Task:
        return Task(key, f"(OpenEnv reset, seed {key})", "", {"seed": int(key)})

    def url(self) -> str:
        """The server's URL; starts this process's server, or starts it again if it died."""
        if self.base_url is not None:
            return self.base_url
        with self._lock:
            mine = self.server is not None and self.server.owner == os.getpid()
            if not mine or self.server is None or not self.server.alive():
                self.restarts += mine
                assert self.app is not None
                server = LocalServer(self.app, self.server_start_timeout_s)
                server.start()
                self.server = server
            return self.server.url

    def open(self, task: Task) -> OpenEnvSession:
        """A session reset with the task's seed. A server of this env's that refuses
        the connection (it died, or hangs) is stopped and started again, once."""
        try:
            return OpenEnvSession(self, self.url(), int(task.data["seed"]))
        except ConnectionError:
            if self.base_url is not None:
                raise
            with self._lock:
                if self.server is not None:
                    self.server.stop()
            return OpenEnvSession(self, self.url(), int(task.data["seed"]))

    def close(self) -> None:
        """Stop the server this env started (by its pid)."""
        with self._lock:
            if self.server is not None:
                self.server.stop()

    def max_new_tokens(self) -> int:
        return self._max_new_tokens
