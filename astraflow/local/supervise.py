"""Local process supervision: start components, restart crashes with backoff, stop by pid.

Each component is a plain `astraflow` CLI process with its own log file; the
supervisor knows nothing about what they do — they talk only through the store.
A component killed by a signal (preemption, the OOM killer, an operator) is
restarted at once; one that fails on its own is restarted after a backoff that
doubles with consecutive quick failures, and only a crash loop
(`max_quick_crashes` in a row) stops the run. The live process table goes to
`components.json` in the run folder so operators can find every pid; components
stop by themselves when the launcher's pid disappears (`stop_flag`), and a new
launcher clears any leftovers. Components, at the start and on every restart, fork
from a warm zygote (`local/zygote.py`) that imported torch, transformers and lancedb
once.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("astraflow.local.supervise")


@dataclass
class Component:
    name: str
    argv: list[str]
    threads: int
    log_path: Path
    restart: bool = True
    launcher: list[str] = field(default_factory=list)
    """Python arguments before `-m astraflow`: e.g. `-m torch.distributed.run
    --standalone --nproc-per-node 2` for a multi-rank trainer, which torchrun runs as
    one process tree (any rank dying ends it) and so is supervised as one component."""
    proc: subprocess.Popen | ForkedProc | None = None
    restarts: int = 0
    quick_crashes: int = 0  # consecutive crashes within healthy_s of starting
    started_at: float = 0.0
    next_start: float = 0.0
    finished: bool = False  # exited 0 on its own: done, not crashed
    exit_codes: list[int] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        # ASTRAFLOW_LAUNCHER_PID: components stop by themselves once this process is gone.
        return {**process_env(self.threads), "ASTRAFLOW_LAUNCHER_PID": str(os.getpid())}

    def start(self, zygote: Zygote | None = None) -> None:
        """Fork from the warm zygote when it is ready, else start a fresh process."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # The zygote forks the `astraflow` CLI itself; a launcher prefix needs a fresh process.
        self.proc = zygote.fork(self) if zygote is not None and not self.launcher else None
        if self.proc is None:
            self.proc = _spawn(self.argv, self.env(), self.log_path, launcher=self.launcher)
        self.started_at = time.time()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def process_env(threads: int) -> dict[str, str]:
    """The environment of a local process that imports torch: its thread count, and
    `OMP_WAIT_POLICY=PASSIVE` unless the user set a policy. Local components share the
    machine's cores (a rollout worker generates while the trainer steps), and an idle
    OpenMP thread spins at its barrier by default, on a core another process needs
    (measured in docs/benchmarks/peers.md). libgomp reads the policy once, when torch
    loads, so the zygote needs it too: its forks inherit its OpenMP state."""
    return {"OMP_NUM_THREADS": str(threads), "ASTRAFLOW_THREADS": str(threads),
            "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1",
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}


def _spawn(argv: list[str], env: dict[str, str], log_path: Path,
           stdin: int | None = None, stdout: int | None = None,
           launcher: list[str] | None = None) -> subprocess.Popen:
    with log_path.open("ab") as out:
        return subprocess.Popen([sys.executable, *(launcher or []), "-m", "astraflow", *argv],
                                stdout=out if stdout is None else stdout,
                                stderr=out if stdout is not None else subprocess.STDOUT,
                                stdin=stdin, env={**os.environ, **env}, start_new_session=True)


class ForkedProc:
    """A component forked by the zygote: poll/wait like Popen, exit codes reported by the zygote."""

    def __init__(self, pid: int, zygote: Zygote):
        self.pid, self._zygote = pid, zygote

    def poll(self) -> int | None:
        code = self._zygote.exit_code(self.pid)
        if code is None and not self._zygote.alive and not pid_alive(self.pid):
            return -signal.SIGKILL  # the zygote died too; its exit report is lost
        return code

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.time() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.time() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
            time.sleep(0.05)
        return code


def is_component(pid: int, run_dir: Path) -> bool:
    """Whether `pid` is a live astraflow process of this run (pids get reused). Components
    and the zygote they are forked from name the run folder on their command line."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"astraflow" in cmd and str(run_dir).encode() in cmd


def stop_flag() -> Callable[[], bool]:
    """A `should_stop()` for component loops: true once SIGTERM/SIGINT arrived (finish the
    step, checkpoint, exit cleanly), or once the launcher that started this process is
    gone — a SIGKILLed launcher must not leave orphans that a re-run would duplicate."""
    flag = {"flag": False}

    def handler(signum, _frame):
        flag["flag"] = True

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    launcher = int(os.environ.get("ASTRAFLOW_LAUNCHER_PID", "0"))

    def should_stop() -> bool:
        if flag["flag"]:
            return True
        if launcher and not pid_alive(launcher):
            log.warning("launcher (pid %d) is gone; stopping", launcher)
            flag["flag"] = True
        return flag["flag"]

    return should_stop


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (zombies included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Zygote:
    """One `astraflow zygote` process that imported torch, transformers and lancedb once
    and forks a ready component on request: a restart costs a fork, not ~7 s of imports.

    Protocol (JSON lines): we write {argv, env, log}; it answers {"pid": N} and,
    whenever a child exits, {"exit": N, "code": C} (C < 0: killed by signal -C).
    """

    def __init__(self, log_path: Path, label: str = ""):
        import queue
        import threading

        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.label = label  # the run folder, so that its forks are recognisable by cmdline
        self.proc = _spawn(["zygote", "--label", label], process_env(1), log_path,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._pids: queue.Queue[int] = queue.Queue()
        self._exits: dict[int, int] = {}
        self._lock = threading.Lock()
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            if "ready" in msg:
                self.ready.set()
            elif "pid" in msg:
                self._pids.put(msg["pid"])
            elif "exit" in msg:
                with self._lock:
                    self._exits[msg["exit"]] = msg["code"]

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether it finished its imports within `timeout_s`; False at once if it died."""
        deadline = time.time() + timeout_s
        while not self.ready.wait(0.2):
            if not self.alive or time.time() > deadline:
                return False
        return True

    def exit_code(self, pid: int) -> int | None:
        with self._lock:
            return self._exits.get(pid)

    def fork(self, c: Component, timeout: float = 5.0) -> ForkedProc | None:
        """Fork `c` from the zygote; None if it is not ready or not answering."""
        import queue

        if not (self.alive and self.ready.is_set()):
            return None
        job = {"argv": c.argv, "env": c.env(), "log": str(c.log_path)}
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.flush()
            return ForkedProc(self._pids.get(timeout=timeout), self)
        except (OSError, queue.Empty) as err:
            log.warning("zygote did not fork %s (%s); starting it cold", c.name, err)
            return None

    def stop(self) -> None:
        if self.alive:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


class Supervisor:
    def __init__(self, components: list[Component], *, max_quick_crashes: int = 8,
                 healthy_s: float = 60.0, state_path: Path | None = None,
                 zygote_log: Path | None = None):
        self.components = components
        self.max_quick_crashes = max_quick_crashes
        self.healthy_s = healthy_s
        self.state_path = state_path
        self.zygote_log = zygote_log
        self.zygote: Zygote | None = None

    def start_all(self, ready_timeout_s: float = 300.0) -> None:
        """Start every component, each forked from the zygote once it has imported:
        one import of torch, transformers and lancedb instead of one per component, all
        competing for the same cores (plus the zygote's own, for restarts). A zygote
        that dies or is not ready in `ready_timeout_s` is said in the log, and the
        components start cold."""
        self._stop_leftovers()
        if self.zygote_log is not None:
            self.warm_up()
            assert self.zygote is not None
            if not self.zygote.wait_ready(ready_timeout_s):
                log.warning("zygote not ready (%s; see %s): starting the components cold",
                            f"not in {ready_timeout_s:.0f} s" if self.zygote.alive
                            else "exited", self.zygote_log)
        for c in self.components:
            c.start(self._warm_zygote())
        self._write_state()

    def warm_up(self) -> None:
        """Start the zygote's imports now, without waiting for them: the launcher calls
        this before it publishes and scores version 0, so the ~7 s of imports overlap that
        work instead of following it. `start_all` starts it if nobody did."""
        if self.zygote_log is not None and self.zygote is None:
            self.zygote = Zygote(self.zygote_log, self._label)

    def _warm_zygote(self) -> Zygote | None:
        """The zygote, replaced by a fresh one if it died (it is never a component)."""
        if self.zygote is not None and not self.zygote.alive:
            log.warning("zygote exited (code %s); starting another", self.zygote.proc.returncode)
            self.zygote = Zygote(self.zygote_log, self._label)  # type: ignore[arg-type]
        return self.zygote

    @property
    def _label(self) -> str:
        return str(self.state_path.parent) if self.state_path is not None else ""

    def _stop_leftovers(self, grace_s: float = 15.0) -> None:
        """Components of an earlier launcher of this run that are still alive (it was
        SIGKILLed): they stop by themselves once they notice; wait, then kill them."""
        if self.state_path is None or not self.state_path.exists():
            return
        try:
            state = json.loads(self.state_path.read_text())
        except json.JSONDecodeError:
            return
        run_dir = self.state_path.parent
        pids = [c["pid"] for c in state.values()
                if c.get("pid") and is_component(c["pid"], run_dir)]
        deadline = time.time() + grace_s
        while pids and time.time() < deadline:
            pids = [p for p in pids if pid_alive(p)]
            time.sleep(0.2)
        for p in pids:
            log.warning("killing pid %d left over from an earlier launcher of this run", p)
            try:
                os.killpg(p, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _write_state(self) -> None:
        if self.state_path is None:
            return
        state = {c.name: {"pid": c.proc.pid if c.alive else None, "restarts": c.restarts,
                          "started_at": c.started_at, "exit_codes": c.exit_codes[-5:]}
                 for c in self.components}
        tmp = self.state_path.with_name(f".{self.state_path.name}.tmp")
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, self.state_path)

    def check(self) -> None:
        """Restart crashed components (exponential backoff, reset after a healthy run)."""
        now = time.time()
        changed = False
        for c in self.components:
            if c.finished or c.proc is None:
                continue
            code = c.proc.poll()
            if code is None:
                continue
            if c.next_start == 0.0:
                changed = True
                c.exit_codes.append(code)
                if code == 0:
                    c.finished = True
                    log.info("%s finished", c.name)
                    continue
                if not c.restart:
                    raise RuntimeError(f"{c.name} exited with code {code}; see {c.log_path}")
                if code < 0:
                    # Killed from outside (preemption, OOM killer, an operator, chaos): not a
                    # bug of its own that a restart would repeat, so come back at once.
                    c.next_start = now + 0.5
                    log.warning("%s was killed by signal %d; restarting (log: %s)", c.name, -code,
                                c.log_path)
                    continue
                c.quick_crashes = c.quick_crashes + 1 if now - c.started_at < self.healthy_s else 1
                if c.quick_crashes > self.max_quick_crashes:
                    raise RuntimeError(
                        f"{c.name} exited with code {code} and will not be restarted "
                        f"({c.quick_crashes} crashes in a row, each within {self.healthy_s:.0f}s "
                        f"of starting); see {c.log_path}"
                    )
                c.next_start = now + min(30.0, 0.5 * 2 ** (c.quick_crashes - 1))
                log.warning("%s exited with code %d; restarting in %.1fs (log: %s)", c.name, code,
                            c.next_start - now, c.log_path)
            elif now >= c.next_start:
                c.restarts += 1
                c.next_start = 0.0
                c.start(self._warm_zygote())
                changed = True
        if changed:
            self._write_state()

    def stop_all(self, grace_s: float = 10.0) -> None:
        """SIGTERM every live component, then SIGKILL whatever is left after `grace_s`.

        The exit codes land in `components.json`, so an operator (or a test) can
        tell a clean stop (0) from one that had to be killed."""
        stopping = [c for c in self.components if c.alive]
        for c in stopping:
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
        for c in stopping:
            c.exit_codes.append(c.proc.poll())
            c.finished = True
        self._write_state()
        if self.zygote is not None:  # last: it reports the exit codes of what it forked
            self.zygote.stop()
