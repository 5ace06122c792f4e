"""The sandbox, attacked for real: network, files, limits, fork bombs, runaway loops,
floods of output, and a worker SIGKILLed mid-run. Sandbox processes are found by the
marker every one of them carries in its environment (`ASTRAFLOW_SANDBOX=<marker>`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from astraflow.envs.sandbox import MARKER_ENV, SandboxLimits, check_available, run_python


@pytest.fixture(autouse=True, scope="module")
def _bwrap():
    check_available()  # fails (not skips) on a machine without bwrap: the sandbox is core


def marked(marker: str) -> list[int]:
    """Live processes (zombies have an empty environ) carrying the marker."""
    needle = f"{MARKER_ENV}={marker}".encode()
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            pids.append(int(d))
    return pids


def _argv0(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[0]
    except OSError:
        return b""


def wait_until(cond, timeout: float = 20.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_runs_a_program_and_reports_its_exit():
    r = run_python("import sys\nprint(input()[::-1])\nprint('e', file=sys.stderr)\nsys.exit(3)",
                   stdin="abc\n")
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out, r.truncated) == ("cba\n", "e\n", 3,
                                                                          False, False)


def test_no_network_even_to_the_hosts_loopback():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    port = server.getsockname()[1]
    probe = textwrap.dedent(f"""
        import socket
        s = socket.socket(); s.settimeout(2)
        try:
            s.connect(("127.0.0.1", {port})); print("CONNECTED")
        except OSError as e:
            print("refused", type(e).__name__)
    """)
    try:
        # Control: the same probe outside the sandbox reaches the server.
        plain = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
        assert "CONNECTED" in plain.stdout
        server.accept()[0].close()
        r = run_python(probe)
        assert r.exit_code == 0 and "refused" in r.stdout and "CONNECTED" not in r.stdout
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing came in from the sandbox
    finally:
        server.close()


def test_cannot_write_outside_its_fresh_workdir(tmp_path):
    target = tmp_path / "escape.txt"
    prog = textwrap.dedent(f"""
        import os
        open("mine.txt", "w").write("ok")
        print("cwd", os.getcwd(), sorted(os.listdir(".")))
        for p in [{str(target)!r}, "/escape.txt", "/usr/escape.txt", "/dev/shm/escape.txt",
                  "/tmp/escape.txt", "/proc/escape.txt"]:
            try:
                open(p, "w").write("x"); print("WROTE", p)
            except OSError as e:
                print("denied", p, e.errno)
    """)
    r = run_python(prog)
    assert r.exit_code == 0, r.stderr
    assert "cwd /sandbox ['main.py', 'mine.txt']" in r.stdout
    assert "WROTE" not in r.stdout and r.stdout.count("denied") == 6
    assert not target.exists() and not os.path.exists("/escape.txt")
    # Fresh every run: nothing of the last run's files is left.
    again = run_python("import os; print(sorted(os.listdir('.')))")
    assert again.stdout == "['main.py']\n"


def test_cpu_memory_file_and_disk_limits():
    lim = SandboxLimits(timeout_s=60, cpu_s=1, memory_mb=128, file_mb=1, disk_mb=4)
    spin = run_python("while True: pass", lim)
    assert not spin.timed_out and spin.exit_code == 128 + signal.SIGKILL  # RLIMIT_CPU
    mem = run_python("x = bytearray(256 * 2**20)", lim)
    assert mem.exit_code == 1 and "MemoryError" in mem.stderr
    big = run_python("open('f', 'wb').write(b'x' * (2 * 2**20))", lim)
    assert big.exit_code == 1 and "File too large" in big.stderr
    disk = run_python("for i in range(8): open(f'f{i}', 'wb').write(b'x' * 2**20)", lim)
    assert disk.exit_code == 1 and "No space left" in disk.stderr


def _watch(marker: str, stop: threading.Event, seen: list[int]) -> None:
    while not stop.is_set():
        seen.append(len(marked(marker)))
        time.sleep(0.02)


def test_fork_bomb_is_contained_and_cleaned_up():
    bomb = textwrap.dedent("""
        import os, time
        while True:
            try:
                os.fork()
            except OSError:
                time.sleep(0.01)
    """)
    lim = SandboxLimits(timeout_s=3, nproc=12)
    stop, seen = threading.Event(), []
    watcher = threading.Thread(target=_watch, args=("bomb", stop, seen))
    watcher.start()
    try:
        r = run_python(bomb, lim, marker="bomb")
    finally:
        stop.set()
        watcher.join()
    assert r.timed_out
    assert max(seen) > 4  # it did fork...
    assert max(seen) <= lim.nproc + 1  # ...up to the limit (+1: bwrap outside the pid ns)
    assert marked("bomb") == []


def test_infinite_loop_killed_at_timeout_with_everything_it_started():
    # A child in the process group, and a grandchild that left it (setsid) and closed
    # its output pipes, so neither the group nor the pipes' closing would catch it.
    prog = textwrap.dedent("""
        import os
        if os.fork() == 0:
            if os.fork() == 0:
                os.setsid(); os.close(1); os.close(2)
            while True: pass
        while True: pass
    """)
    t0 = time.monotonic()
    r = run_python(prog, SandboxLimits(timeout_s=1.5, cpu_s=30), marker="loop")
    assert r.timed_out and r.exit_code is None
    assert 1.5 <= time.monotonic() - t0 < 15
    assert marked("loop") == []  # run_python returns only after all of them are gone


def test_closing_its_output_does_not_end_the_wait():
    r = run_python("import os, time\nos.close(1); os.close(2)\ntime.sleep(60)",
                   SandboxLimits(timeout_s=1.5), marker="closed")
    assert r.timed_out and marked("closed") == []
    quick = run_python("import os, time\nos.close(1); time.sleep(0.3); raise SystemExit(4)")
    assert quick.exit_code == 4 and not quick.timed_out


def test_huge_output_is_truncated_and_ends_the_run():
    r = run_python("while True: print('x' * 1000)", SandboxLimits(timeout_s=30,
                                                                 output_bytes=10_000))
    assert r.truncated and not r.timed_out and len(r.stdout) == 10_000


def test_concurrent_runs_from_threads():
    results: dict[int, str] = {}

    def one(i: int) -> None:
        results[i] = run_python(f"import time; time.sleep(0.3); print({i} * {i})").stdout

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: f"{i * i}\n" for i in range(6)}


def test_worker_killed_mid_run_leaves_no_sandbox_process():
    """A worker runs a sandboxed sleep from a tool thread (PDEATHSIG is per thread)
    and is SIGKILLed; every sandbox process must die with it."""
    marker = f"orphan{os.getpid()}"
    worker = textwrap.dedent(f"""
        import threading
        from astraflow.envs.sandbox import SandboxLimits, run_python
        t = threading.Thread(target=run_python, args=("import time; time.sleep(120)",),
                             kwargs=dict(limits=SandboxLimits(timeout_s=120), marker={marker!r}))
        t.start(); t.join()
    """)
    proc = subprocess.Popen([sys.executable, "-c", worker])
    try:
        # bwrap, bwrap's init and the program's python3 (prlimit exec'd into it), all up.
        def program_up() -> bool:
            return len(marked(marker)) >= 3 and any(
                _argv0(p).endswith(b"/python3") for p in marked(marker))

        assert wait_until(program_up, timeout=60), marked(marker)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert wait_until(lambda: marked(marker) == [], timeout=20), marked(marker)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
