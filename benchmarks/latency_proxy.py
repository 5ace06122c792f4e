"""A loopback TCP proxy that delays every HTTP request by a fixed time (a nearby S3 region).

    proxy = LatencyProxy(target_port=moto.port, delay_s=0.020)   # then point
    os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint               # clients at it

Runs in its own process, so the benchmark's writers do not share a Python
interpreter (and its GIL) with the forwarding. Per connection, the first bytes a
client sends after the server has answered (the start of the next request on a
keep-alive connection) wait `delay_s` before they are forwarded; so each
request/response round trip costs `delay_s` more, whatever its size.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import threading
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(port: int, target_port: int, delay_s: float, ready) -> None:
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
        turn = {"answered": True}  # a new connection's first bytes start a request
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
                    time.sleep(delay_s)  # a new request: one more round trip's latency
                    turn["answered"] = False
            else:
                turn["answered"] = True
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
    def __init__(self, target_port: int, delay_s: float = 0.020):
        self.port = _free_port()
        ctx = mp.get_context("spawn")
        ready = ctx.Event()
        self.proc = ctx.Process(target=_serve, args=(self.port, target_port, delay_s, ready),
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
