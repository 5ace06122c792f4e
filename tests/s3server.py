"""A real S3-compatible server (moto in server mode) for tests, on 127.0.0.1.

``MotoServer`` runs ``python -m moto.server`` as a child process in its own
session, with its output in a log file, and stops it by process id. Tests can
``pause()`` it (SIGSTOP) to make the store unreachable without closing its
socket: connections are still accepted by the kernel but nothing answers,
which is what a hung or partitioned store looks like to a client. ``resume()``
(SIGCONT) brings it back with its state intact.

Fixtures (import them into a test module or ``conftest.py``)::

    from tests.s3server import moto_server, s3_env  # noqa: F401

``moto_server`` is module-scoped: one server per test module (start-up costs
a second or two), always stopped at the end of the module. ``s3_env`` is
function-scoped: it sets the standard AWS variables (see ``MotoServer.env``)
with ``monkeypatch``, creates a fresh uniquely named bucket and yields its
name; on teardown it resumes the server if the test left it paused, so one
test's outage never leaks into the next.

The secret key is the distinctive string ``TEST_SECRET_KEY`` so tests can
assert that it never shows up in logs or error messages.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pyarrow.fs import S3FileSystem

TEST_ACCESS_KEY_ID = "testing-key-id"
TEST_SECRET_KEY = "astraflow-test-secret-DO-NOT-LOG"
TEST_REGION = "us-east-1"

_START_TIMEOUT_S = 20.0
_STOP_TIMEOUT_S = 5.0
_LOG_TAIL_CHARS = 4000


def _free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MotoServer:
    """One moto S3 server process on 127.0.0.1, started and stopped by pid.

    Args:
        log_dir: directory for the server's combined stdout/stderr log
            (``moto-<port>.log``); created if missing.
        port: port to bind; a free one is picked when ``None``.
    """

    def __init__(self, log_dir: str | os.PathLike[str], port: int | None = None) -> None:
        self.log_dir = Path(log_dir)
        self._requested_port = port
        self.port: int | None = None
        self.log_path: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False

    # ------------------------------------------------------------------ state
    @property
    def pid(self) -> int | None:
        """Process id of the running server, or ``None`` when not started."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """True while the server process exists (paused counts as running)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def paused(self) -> bool:
        """True between ``pause()`` and ``resume()``."""
        return self._paused

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT``; only valid after ``start()``."""
        if self.port is None:
            raise RuntimeError("MotoServer not started")
        return f"http://127.0.0.1:{self.port}"

    # -------------------------------------------------------------- lifecycle
    def start(self, timeout_s: float = _START_TIMEOUT_S) -> MotoServer:
        """Spawn the server and wait until it answers HTTP (`timeout_s` at most:
        benchmarks on a loaded machine wait longer than tests do).

        Raises ``RuntimeError`` with the tail of the server log when it exits
        early or does not answer in time (the process is then stopped).
        """
        if self.running:
            raise RuntimeError(f"MotoServer already running (pid {self.pid})")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.port = self._requested_port or _free_port()
        self.log_path = self.log_dir / f"moto-{self.port}.log"
        env = dict(os.environ)
        # The server itself must not try to reach real AWS or read real creds.
        env.update(AWS_ACCESS_KEY_ID=TEST_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY=TEST_SECRET_KEY)
        env.pop("AWS_ENDPOINT_URL", None)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
        self._paused = False
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                rc = self._proc.returncode
                self._proc = None
                raise RuntimeError(
                    f"moto server exited early (rc={rc}) on port {self.port}:\n{self.log_tail()}"
                )
            if self._answers():
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(
            f"moto server did not answer on {self.endpoint} within {timeout_s:.0f} s:\n{self.log_tail()}"
        )

    def stop(self) -> None:
        """Stop the server by pid: SIGTERM, then SIGKILL after 5 s; then reap it.

        Safe to call twice and on a paused server (it is resumed first, since a
        stopped process does not act on SIGTERM).
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                if self._paused:
                    os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
                try:
                    proc.wait(timeout=_STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=_STOP_TIMEOUT_S)
            except ProcessLookupError:
                pass
        self._paused = False

    def pause(self) -> None:
        """SIGSTOP the server: requests hang (connects succeed, no reply)."""
        self._require_running()
        assert self._proc is not None
        os.kill(self._proc.pid, signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT the server; requests queued while paused are then served."""
        self._require_running()
        assert self._proc is not None
        os.kill(self._proc.pid, signal.SIGCONT)
        self._paused = False

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- helpers
    def env(self) -> dict[str, str]:
        """AWS environment variables pointing at this server.

        The standard ones, plus ``AWS_ALLOW_HTTP=true``: lance reads every
        ``AWS_*`` variable that names an object_store option, and without that
        one it refuses the plain-http endpoint ("URL scheme is not allowed").
        """
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": TEST_ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": TEST_SECRET_KEY,
            "AWS_REGION": TEST_REGION,
            "AWS_DEFAULT_REGION": TEST_REGION,
        }

    def lance_storage_options(self, **extra: str) -> dict[str, str]:
        """``storage_options`` for ``lancedb.connect`` / ``lance.dataset`` on this server."""
        opts = {
            "aws_endpoint": self.endpoint,
            "aws_access_key_id": TEST_ACCESS_KEY_ID,
            "aws_secret_access_key": TEST_SECRET_KEY,
            "aws_region": TEST_REGION,
            "allow_http": "true",
        }
        opts.update(extra)
        return opts

    def filesystem(self, **kwargs: Any) -> S3FileSystem:
        """A ``pyarrow.fs.S3FileSystem`` on this server (extra kwargs passed through).

        ``allow_delayed_open=True`` by default so that small files are written
        with one PutObject: moto 5.2.1 answers CompleteMultipartUpload with a
        root tag pyarrow rejects (getmoto/moto#10055), so multipart uploads
        (any stream opened without delayed open, or too big for one part) fail with
        ``OSError ... INTERNAL_FAILURE during CompleteMultipartUpload``.
        """
        from pyarrow import fs

        params: dict[str, Any] = dict(
            endpoint_override=self.endpoint,
            allow_delayed_open=True,
            scheme="http",
            access_key=TEST_ACCESS_KEY_ID,
            secret_key=TEST_SECRET_KEY,
            region=TEST_REGION,
        )
        params.update(kwargs)
        return fs.S3FileSystem(**params)

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (pyarrow; raw HTTP PUT as a fallback). Returns the name."""
        try:
            self.filesystem(
                connect_timeout=5, request_timeout=10, allow_bucket_creation=True
            ).create_dir(name)
        except (ImportError, OSError):
            # moto accepts unsigned requests, so a bare PUT /<bucket> works too.
            req = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT", data=b"")
            with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 (local http)
                if resp.status not in (200, 204):
                    raise RuntimeError(
                        f"creating bucket {name!r} failed: HTTP {resp.status}"
                    ) from None
        return name

    def log_tail(self, chars: int = _LOG_TAIL_CHARS) -> str:
        """The last ``chars`` characters of the server log ('' if none yet)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_bytes()[-chars:].decode("utf-8", "replace")

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.endpoint + "/", timeout=1):  # noqa: S310 (local http)
                return True
        except urllib.error.HTTPError:
            return True  # any HTTP status means the server is up
        except (OSError, ValueError):
            return False

    def _require_running(self) -> None:
        if not self.running:
            raise RuntimeError("MotoServer not running")


@pytest.fixture(scope="module")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """A started moto S3 server shared by one test module; always stopped after."""
    server = MotoServer(tmp_path_factory.mktemp("moto"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_env(moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """AWS env vars pointing at ``moto_server`` and a fresh bucket; yields the bucket name."""
    for key, value in moto_server.env().items():
        monkeypatch.setenv(key, value)
    bucket = moto_server.create_bucket(f"astraflow-test-{uuid.uuid4().hex[:12]}")
    try:
        yield bucket
    finally:
        if moto_server.running and moto_server.paused:
            moto_server.resume()


class Gate:
    """A TCP forwarder on 127.0.0.1 in front of a server that tests can close and reopen.

    Closed, it refuses new connections and resets open ones at once — a store
    that is *down* (as opposed to ``MotoServer.pause``, a store that *hangs*).
    The server behind it keeps its state, so the store comes back intact.
    """

    def __init__(self, target_port: int) -> None:
        import threading

        self.target_port = target_port
        self.port = _free_port()
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.open()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def open(self) -> None:
        import threading

        lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lst.bind(("127.0.0.1", self.port))
        lst.listen(64)
        self._listener = lst
        threading.Thread(target=self._accept, args=(lst,), daemon=True).start()

    def close(self) -> None:
        """Stop listening and reset every open connection."""
        with self._lock:
            lst, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        if lst is not None:
            lst.close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def _accept(self, lst: socket.socket) -> None:
        import threading

        while True:
            try:
                client, _ = lst.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
