"""Local process supervision: start components, restart crashes with backoff, stop by pid.

Each component is a plain `astraflow` CLI process with its own log file; the
supervisor knows nothing about what they do — they talk only through the store.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("astraflow.supervise")


@dataclass
class Component:
    name: str
    argv: list[str]
    threads: int
    log_path: Path
    restart: bool = True
    proc: subprocess.Popen | None = None
    restarts: int = 0
    next_start: float = 0.0
    finished: bool = False  # exited 0 on its own: done, not crashed
    exit_codes: list[int] = field(default_factory=list)

    def start(self) -> None:
        env = dict(os.environ)
        env.update({"OMP_NUM_THREADS": str(self.threads), "ASTRAFLOW_THREADS": str(self.threads),
                    "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"})
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        out = self.log_path.open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "astraflow.cli", *self.argv],
                                     stdout=out, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        out.close()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Supervisor:
    def __init__(self, components: list[Component], max_restarts: int = 20):
        self.components = components
        self.max_restarts = max_restarts

    def start_all(self) -> None:
        for c in self.components:
            c.start()

    def check(self) -> None:
        """Restart crashed components (exponential backoff, capped)."""
        now = time.time()
        for c in self.components:
            if c.finished or c.proc is None:
                continue
            code = c.proc.poll()
            if code is None:
                continue
            if c.next_start == 0.0:
                c.exit_codes.append(code)
                if code == 0:
                    c.finished = True
                    log.info("%s finished", c.name)
                    continue
                if not c.restart or c.restarts >= self.max_restarts:
                    raise RuntimeError(
                        f"{c.name} exited with code {code} and will not be restarted "
                        f"(restarts so far: {c.restarts}); see {c.log_path}"
                    )
                c.next_start = now + min(30.0, 0.5 * 2**c.restarts)
                log.warning("%s exited with code %d; restarting in %.1fs (log: %s)", c.name, code,
                            c.next_start - now, c.log_path)
            elif now >= c.next_start:
                c.restarts += 1
                c.next_start = 0.0
                c.start()

    def stop_all(self, grace_s: float = 10.0) -> None:
        """SIGTERM every live component, then SIGKILL whatever is left after `grace_s`."""
        for c in self.components:
            if c.alive:
                os.killpg(c.proc.pid, signal.SIGTERM)
        deadline = time.time() + grace_s
        for c in self.components:
            if c.proc is None:
                continue
            try:
                c.proc.wait(timeout=max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(c.proc.pid, signal.SIGKILL)
                c.proc.wait()
