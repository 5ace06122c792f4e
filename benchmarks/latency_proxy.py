"""A loopback TCP proxy that delays every HTTP request by a fixed time (a nearby S3 region),
and with `rate_bps` caps the bytes per second each way over all its connections (a WAN).

    proxy = LatencyProxy(target_port=moto.port, delay_s=0.020)   # then point
    os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint               # clients at it

Runs in its own process, so the benchmark's writers do not share a Python
interpreter (and its GIL) with the forwarding. Per connection, the first bytes a
client sends after the server has answered (the start of the next request on a
keep-alive connection) wait `delay_s` before they are forwarded; so each
request/response round trip costs `delay_s` more, whatever its size.

With `log=` a path, every request is written there as one line when its answer
starts: `<start time> <server seconds> <method> <path>` (server seconds: from
forwarding it to the first byte of the answer, i.e. the server's own time,
queueing included). `requests(log)` reads them back, so a benchmark can say how
many round trips an operation costs and where the server spends its time.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import threading
import time
from collections import Counter

METHODS = (b"GET ", b"PUT ", b"POST ", b"HEAD ", b"DELETE ")

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(port: int, target_port: int, delay_s: float, ready, log: str | None = None,
           rate_bps: float | None = None) -> None:
    out = open(log, "a", buffering=1) if log else None  # noqa: SIM115 (lives with the process)
    lock = threading.Lock()
    # One link each way, shared by every connection: when it is next free.
    link = {"lock": threading.Lock(), True: 0.0, False: 0.0, "rate": rate_bps}
    lst = socket.socket()
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lst.bind(("127.0.0.1", port))
    lst.listen(512)
    ready.set()
    while True:
        client, _ = lst.accept()
        try:
            upstream = socket.create_connection(("127.0.0.1", target_port), timeout=10)
        except OSError:
            client.close()
            continue
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.settimeout(None)
        # A new connection's first bytes start a request; `req` is the request in
        # flight (start, forwarded, request line) until its answer starts.
        turn: dict = {"answered": True, "req": None, "out": out, "lock": lock, "link": link}
        threading.Thread(target=_pipe, args=(client, upstream, turn, delay_s, True),
                         daemon=True).start()
        threading.Thread(target=_pipe, args=(upstream, client, turn, delay_s, False),
                         daemon=True).start()


def _pipe(src: socket.socket, dst: socket.socket, turn: dict, delay_s: float,
          upstream: bool) -> None:
    try:
        while data := src.recv(1 << 16):
            if upstream:
                if turn["answered"]:
                    t0 = time.time()
                    time.sleep(delay_s)  # a new request: one more round trip's latency
                    turn["answered"] = False
                    if data.startswith(METHODS):  # not the body after a `100 Continue`
                        line = data.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
                        turn["req"] = (t0, time.time(), line[0], line[1] if len(line) > 1 else "")
            else:
                turn["answered"] = True
                req, turn["req"] = turn["req"], None
                if req is not None and turn["out"] is not None:
                    with turn["lock"]:
                        turn["out"].write(f"{req[0]:.6f} {time.time() - req[1]:.6f} "
                                          f"{req[2]} {req[3]}\n")
            link = turn.get("link")
            if link and link["rate"]:  # the link carries `rate` bits/s, one chunk after another
                with link["lock"]:
                    start = max(time.monotonic(), link[upstream])
                    link[upstream] = start + len(data) * 8 / link["rate"]
                    done = link[upstream]
                time.sleep(max(done - time.monotonic(), 0.0))
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class LatencyProxy:
    def __init__(self, target_port: int, delay_s: float = 0.020, log: str | None = None,
                 rate_bps: float | None = None):
        self.port = _free_port()
        self.log = log
        ctx = mp.get_context("spawn")
        ready = ctx.Event()
        self.proc = ctx.Process(target=_serve, args=(self.port, target_port, delay_s, ready, log,
                                                          rate_bps),
                                daemon=True)
        self.proc.start()
        if not ready.wait(30):
            raise RuntimeError("latency proxy did not start")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.join()


def requests(log: str, since: float = 0.0) -> list[tuple[float, float, str, str]]:
    """(start time, server seconds, method, path) of every request logged from `since` on."""
    out = []
    with open(log) as f:
        for line in f:
            parts = line.split(" ", 3)
            if len(parts) == 4 and float(parts[0]) >= since:
                out.append((float(parts[0]), float(parts[1]), parts[2], parts[3].rstrip("\n")))
    return out


def kind(method: str, path: str) -> str:
    """A request's kind for counting: 'LIST', or the method and what it touches."""
    from urllib.parse import parse_qs, urlsplit

    u = urlsplit(path)
    q = parse_qs(u.query, keep_blank_values=True)
    if method == "GET" and ("list-type" in q or "prefix" in q):
        prefix = q.get("prefix", [""])[0]
        return f"LIST {_what(prefix)}"
    if method == "POST" and "delete" in q:
        return "DELETE-MANY"
    if "uploads" in q or "uploadId" in q:
        return f"{method} multipart {_what(u.path)}"
    return f"{method} {_what(u.path)}"


def _what(path: str) -> str:
    for part, name in (("_staged", "marker"), ("_versions", "manifest"), ("_transactions",
                       "transaction"), ("/data/", "data"), ("_latest.manifest", "manifest"),
                       (".parquet", "parquet"), ("_indices", "index")):
        if part in path:
            return name
    return "other"


def count(reqs: list[tuple[float, float, str, str]]) -> Counter:
    return Counter(kind(m, p) for _, _, m, p in reqs)
