"""Run an untrusted Python program where it can do no harm, and return what it printed.

Programs the model writes (the code workload's `run` tool and its grading) never run
in the worker's process. Each run is one bubblewrap (`bwrap`) sandbox started as its
own unprivileged uid: new namespaces (no network, not even the host's loopback), a
fresh root with only `/usr` read-only and a `disk_mb` tmpfs working directory,
setrlimit limits (CPU, address space, file size, processes), and on a timeout or the
output cap a SIGKILL to the pid namespace's init, so nothing of a run outlives the
call; `--die-with-parent` takes the sandboxes along when a worker dies. Memory and
CPU are bounded per process, not across a run's processes (no delegated cgroup here).
The comment above `run_python` gives each mechanism in detail.
"""

from __future__ import annotations

import os
import secrets
import selectors
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

#: Environment variable every sandbox process carries (value: the run's marker), so an
#: operator or a test can find sandbox processes in /proc.
MARKER_ENV = "ASTRAFLOW_SANDBOX"
WORKDIR = "/sandbox"
_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")


class SandboxUnavailable(RuntimeError):
    """The machine lacks what the sandbox needs (root, bwrap, prlimit, /usr/bin/python3)."""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0
    """Wall-clock seconds for the whole run; then the sandbox is killed."""
    cpu_s: int = 5
    """RLIMIT_CPU per process (SIGXCPU, then SIGKILL)."""
    memory_mb: int = 256
    """RLIMIT_AS per process: a large allocation raises MemoryError."""
    file_mb: int = 4
    """RLIMIT_FSIZE: the largest file a program may write."""
    disk_mb: int = 16
    """Size of the working directory's tmpfs: all files a program writes, together."""
    nproc: int = 16
    """RLIMIT_NPROC for the run's uid: processes and threads, bwrap's own two included."""
    output_bytes: int = 16_384
    """Bytes kept of stdout and of stderr each; more ends the run (truncated)."""


@dataclass(frozen=True)
class RunResult:
    stdout: str
    stderr: str
    exit_code: int | None
    """The program's exit status (128+N when a signal N ended it, as bwrap reports);
    None when the sandbox was killed (timeout or output cap)."""
    timed_out: bool
    truncated: bool
    seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.truncated


def _python() -> str:
    for p in _PYTHONS:
        if os.path.exists(p):
            return p
    raise SandboxUnavailable(f"no python3 at {' or '.join(_PYTHONS)}: the sandbox binds only "
                             "/usr, so it needs a system python3 there (apt-get install python3)")


def check_available() -> None:
    """Raise SandboxUnavailable, saying how to fix it, when a run cannot work here."""
    if os.geteuid() != 0:
        # Not root: no uid of its own per run, so RLIMIT_NPROC would count every process
        # of the calling user (either blocking bwrap itself or not bounding a fork bomb).
        raise SandboxUnavailable("the sandbox runs each program as its own uid, which needs "
                                 "root: run the rollout worker as root (containers, "
                                 "`sudo` on a VM)")
    for tool, pkg in (("bwrap", "bubblewrap"), ("prlimit", "util-linux")):
        if shutil.which(tool) is None:
            raise SandboxUnavailable(f"`{tool}` not found: apt-get install {pkg} "
                                     "(scripts/setup-sandbox.sh does it)")
    _python()
    with _PROBED_LOCK:
        if not _PROBED:
            # Once per process: a sandbox that cannot start (user namespaces disabled, a
            # seccomp profile refusing mount) must fail loudly here, not look like a
            # program that printed an error and scored 0.
            slot = _UIDS.acquire()
            try:
                r = _run("print('ok')", SandboxLimits(timeout_s=30), "", [], "probe",
                         _UIDS.uid(slot), time.monotonic())
            finally:
                _UIDS.release(slot)
            if r.stdout != "ok\n":
                raise SandboxUnavailable(f"a bwrap sandbox does not start here: {r.stderr!r}")
            _PROBED.append(True)


class _Uids:
    """Per-run uids, unique on the machine: a base, the worker's pid, a slot."""

    def __init__(self, base: int, slots: int = 256):
        self.base, self.slots = base, slots
        self._free = list(range(slots))
        self._cv = threading.Condition()

    def acquire(self) -> int:
        with self._cv:
            while not self._free:
                self._cv.wait()
            return self._free.pop()

    def release(self, slot: int) -> None:
        with self._cv:
            self._free.append(slot)
            self._cv.notify()

    def uid(self, slot: int) -> int:
        return self.base + os.getpid() * self.slots + slot


_UIDS = _Uids(base=1_000_000_000)  # pid_max 2**22 * 256 slots stays below 2**31
_PROBED: list[bool] = []
_PROBED_LOCK = threading.Lock()


def command(limits: SandboxLimits, program_fd: int, argv: list[str]) -> list[str]:
    """The bwrap command line of one run: the program (read from `program_fd`) is copied
    to /sandbox/main.py and run as `python3 -I -S main.py ARGV...`."""
    mb = 1 << 20
    return [
        "bwrap", "--die-with-parent", "--unshare-all", "--unshare-user", "--disable-userns",
        "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
        "--symlink", "usr/lib64", "/lib64",
        "--dev", "/dev", "--proc", "/proc", "--remount-ro", "/dev",
        "--size", str(limits.disk_mb * mb), "--tmpfs", WORKDIR,
        "--file", str(program_fd), f"{WORKDIR}/main.py",
        "--chdir", WORKDIR, "--hostname", "sandbox", "--remount-ro", "/",
        "--", "prlimit", f"--cpu={limits.cpu_s}", f"--as={limits.memory_mb * mb}",
        f"--fsize={limits.file_mb * mb}", f"--nproc={limits.nproc}", "--core=0",
        "--", _python(), "-I", "-S", "main.py", *argv,
    ]


# How a run is contained:
#
#     worker (root) ── Popen(user=U, start_new_session) ──> bwrap  [new session/pgid]
#         └─ bwrap init (pid 1 of a new pid namespace) ─> prlimit ─> python3 -I -S main.py
#
#   * namespaces: `--unshare-all` (user, pid, net, ipc, uts, cgroup). The new network
#     namespace has only its own loopback, so nothing outside is reachable, not even
#     the host's 127.0.0.1. `--disable-userns` forbids nested user namespaces.
#   * files: a fresh root holding only `/usr` read-only (with Debian's `/bin`, `/lib`
#     links), a private `/dev` and `/proc`, and the working directory: a new tmpfs of
#     `disk_mb` at `/sandbox`, the program copied in. It vanishes with the sandbox (no
#     host directory to clean up), and its size caps what a program can write in total;
#     everything else is read-only or absent (the host's /tmp, /root, /work are not there).
#   * limits (setrlimit through util-linux `prlimit`): CPU seconds, address space, file
#     size, processes, no core files. Python ignores SIGXFSZ, so an oversized write
#     fails with EFBIG instead of killing the program.
#   * processes: root is exempt from RLIMIT_NPROC, so the sandbox runs as an unprivileged
#     uid chosen per run (`uid_base + pid * 256 + slot`, unique on the machine while the
#     run lasts): the process limit then holds, per run, and concurrent runs never
#     share one count (a fork bomb in one cannot starve another).
#   * killing: on timeout (wall clock) or when the output cap is hit, SIGKILL goes to
#     bwrap's init, pid 1 of the run's pid namespace: the kernel kills every process in
#     the namespace, including ones that left the process group (setsid), and init and
#     bwrap exit only when all are gone; then to the run's process group. The call
#     returns only after bwrap has exited, so nothing of the run is left running.
#   * a dying worker takes its sandboxes along: `--die-with-parent` sets
#     PR_SET_PDEATHSIG=SIGKILL on bwrap and its init. PDEATHSIG fires when the *thread*
#     that started the child exits, not the process; the starting thread is the one
#     blocked in `run_python` until the sandbox ends, so it cannot exit first.
#
# What it does not bound: memory across processes (RLIMIT_AS is per process, so at
# most `nproc * memory_mb`, plus the tmpfs), CPU across processes (per process, so up
# to `nproc * cpu_s` within the wall-clock timeout). A cgroup would; this container's
# cgroup v1 is not delegated, so it is not used.
def run_python(code: str, limits: SandboxLimits = SandboxLimits(), *, stdin: str = "",
               argv: list[str] | None = None, marker: str | None = None) -> RunResult:
    """Run `code` as a Python program in a fresh sandbox; blocks until it ended or was
    killed, and every process it started is gone. Safe to call from many threads."""
    check_available()
    start = time.monotonic()
    marker = marker or secrets.token_hex(6)
    slot = _UIDS.acquire()
    try:
        return _run(code, limits, stdin, argv or [], marker, _UIDS.uid(slot), start)
    finally:
        _UIDS.release(slot)


def _run(code: str, limits: SandboxLimits, stdin: str, argv: list[str], marker: str,
         uid: int, start: float) -> RunResult:
    # The program travels through a pipe bwrap copies into the tmpfs (`--file`); a program
    # larger than the pipe buffer would block us, so it goes in from a temp file instead.
    import tempfile

    with tempfile.TemporaryFile() as src:
        src.write(code.encode())
        src.seek(0)
        proc = subprocess.Popen(
            command(limits, src.fileno(), argv),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=(src.fileno(),), start_new_session=True, close_fds=True,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", MARKER_ENV: marker},
            user=uid, group=uid, extra_groups=[],
        )
    try:
        out, err, timed_out, truncated = _collect(proc, stdin.encode(), limits, start)
        if not (timed_out or truncated):  # pipes closed; the program may still be running
            try:
                proc.wait(timeout=max(0.0, start + limits.timeout_s - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        if proc.poll() is None:
            _kill(proc)
        proc.wait()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            f.close()
    code_ = None if (timed_out or truncated) else proc.returncode
    return RunResult(stdout=out.decode(errors="replace"), stderr=err.decode(errors="replace"),
                     exit_code=code_, timed_out=timed_out, truncated=truncated,
                     seconds=time.monotonic() - start)


def _kill(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGKILL bwrap's init first: it is pid 1 of the run's pid namespace, so the kernel
    kills every process in the namespace, and init (hence bwrap, which waits for it)
    exits only once they are all gone; after `proc` exits, nothing of the run is left.
    Then SIGKILL the process group (pgid == bwrap's pid, start_new_session), for bwrap
    itself if init was not up yet (its die-with-parent then takes init along)."""
    try:
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            children = [int(c) for c in f.read().split()]
    except OSError:  # bwrap already gone
        children = []
    for child in children:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if children:
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass  # the process group below, then the caller's wait, finish it
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _collect(proc: subprocess.Popen, stdin: bytes, limits: SandboxLimits,
             start: float) -> tuple[bytes, bytes, bool, bool]:
    """Feed stdin, read stdout and stderr until both close (every sandbox process holding
    them is gone) or the deadline; kill at the deadline or at the output cap."""
    assert proc.stdin and proc.stdout and proc.stderr
    try:
        proc.stdin.write(stdin)  # small inputs only: a full pipe would block here
        proc.stdin.close()
    except BrokenPipeError:
        pass
    bufs: dict[int, bytearray] = {proc.stdout.fileno(): bytearray(),
                                  proc.stderr.fileno(): bytearray()}
    sel = selectors.DefaultSelector()
    for f in (proc.stdout, proc.stderr):
        os.set_blocking(f.fileno(), False)
        sel.register(f.fileno(), selectors.EVENT_READ)
    timed_out = truncated = killed = False
    kill_grace = 5.0  # after SIGKILL the namespace's processes die within the kernel's time
    try:
        while sel.get_map():
            left = start + limits.timeout_s - time.monotonic()
            if left <= 0 and not killed:
                timed_out = killed = True
                _kill(proc)
                kill_deadline = time.monotonic() + kill_grace
            if killed and time.monotonic() > kill_deadline:
                raise RuntimeError(f"sandbox pid {proc.pid}: pipes still open {kill_grace}s "
                                   "after SIGKILL")
            for key, _ in sel.select(timeout=max(0.01, left) if not killed else 0.1):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                buf = bufs[key.fd]
                room = limits.output_bytes - len(buf)
                buf += chunk[:max(room, 0)]
                if len(chunk) > room and not killed:
                    truncated = killed = True
                    _kill(proc)
                    kill_deadline = time.monotonic() + kill_grace
    finally:
        sel.close()
    return (bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()]),
            timed_out, truncated)
