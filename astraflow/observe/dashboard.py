"""`astraflow dashboard`: a live page of one run on 127.0.0.1, offline.

    browser ──GET /api/state?since=SEQ every poll_s──► State.get(since)
                                      │ older than refresh_s? → RunView.refresh()
                                      ▼ (each table read once, only what is new)
                                      SEQ += 1; each curve appends its new points
    page holds SEQ      ──► {"seq", "unchanged": true}            (a few bytes)
    page holds SEQ - k  ──► the points added since, to append      (Plotly.extendTraces)
    a new page          ──► every curve, to draw                   (Plotly.react)
    audit thread ──every audit_every_s──► astraflow.observe.audit

Any number of open pages share one refresh per `refresh_s`, and a page nobody looks
at costs the store nothing. Deltas, so a page left open on a long run costs what its
new points cost. FastAPI serves the page; the charts are plotly.js from the `plotly`
wheel (no CDN: it works with no internet).
"""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from astraflow.context import RunContext
from astraflow.observe.status import policy_summary
from astraflow.observe.view import RunView

log = logging.getLogger("astraflow.observe")
STATIC = Path(__file__).parent / "static"
#: Points per curve held by the page: a longer curve keeps every `stride`-th point,
#: the stride doubling as the run grows, so a refresh costs the same at step 100 and
#: at step 100,000 (the newest values are on the page's cards, unthinned).
MAX_POINTS = 500
#: States a page may lag behind and still get only what it lacks (else: everything).
DELTAS = 64


def plotly_js() -> Path:
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise FileNotFoundError(f"plotly.min.js is not in the installed plotly ({path})")
    return path


def _finite(v: Any) -> Any:
    """JSON has no NaN or infinity (browsers refuse the whole document): null instead."""
    return None if isinstance(v, float) and not math.isfinite(v) else v


class Curve:
    """One series as the page draws it: every `stride`-th point, kept incrementally.

    Why a stride, not "thin the whole series evenly on each refresh": the points
    kept never change until the stride doubles (rarely: log2(steps / MAX_POINTS)
    times in a run), so a page holding the curve needs only the points appended
    since, and the server never re-walks the history. `epoch` counts the doublings:
    a page that drew an older epoch is sent the curve whole.
    """

    def __init__(self) -> None:
        self.x: list = []
        self.y: list = []
        self.seen = 0  # points of the series looked at
        self.stride = 1
        self.epoch = 0

    def update(self, xs: list, ys: list) -> None:
        for i in range(self.seen, len(ys)):
            if i % self.stride == 0:
                self.x.append(xs[i])
                self.y.append(_finite(ys[i]))
        self.seen = len(ys)
        while len(self.x) > MAX_POINTS:
            self.stride *= 2
            self.x, self.y = self.x[::2], self.y[::2]  # index % (2 * stride) == 0
            self.epoch += 1

    def mark(self) -> tuple[int, int]:
        """What a page holding the current state holds of this curve."""
        return self.epoch, len(self.x)

    def since(self, mark: tuple[int, int] | None) -> dict[str, list] | None:
        """The points after `mark`, or None when the page must draw the curve anew."""
        if mark is None or mark[0] != self.epoch:
            return None
        return {"x": self.x[mark[1]:], "y": self.y[mark[1]:]}


#: (chart id part, component, metric) of the curves drawn per policy.
CURVES = (("reward", "trainer", "reward_mean"), ("heldout", "eval", "heldout_accuracy"),
          ("staleness", "trainer", "staleness_mean"),
          ("trainer_wait", "trainer", "trainer_wait_s"))
_SOURCE = {name: (comp, metric) for name, comp, metric in CURVES}


class State:
    """The page's data, refreshed from at most one store read per `refresh_s`."""

    def __init__(self, ctx: RunContext, *, refresh_s: float = 5.0, audit_every_s: float = 120.0,
                 episodes: int = 8):
        self.ctx = ctx
        self.view = RunView(ctx, episodes=episodes)
        self.refresh_s = refresh_s
        self.audit_every_s = audit_every_s
        self._lock = threading.Lock()
        self._read = 0.0
        self._stamp: Any = None
        self.seq = 0
        """Counts the distinct states; a page sends the one it holds as `since`."""
        self.curves: dict[tuple[str, str], Curve] = {
            (p, name): Curve() for p in self.view.policies for name, *_ in CURVES}
        self._marks: dict[int, dict[tuple[str, str], tuple[int, int]]] = {}
        """seq -> what a page holding it holds of each curve (the last DELTAS states)."""
        self._answers: dict[int | None, bytes] = {}  # since -> JSON, for the current seq
        self._codecs: dict[str, Any] = {}
        self._episodes: dict[str, dict[str, Any]] = {}  # traj_id -> decoded, for the page
        self.audit: dict[str, Any] = {"verdict": "pending", "checked_at": None, "policies": {}}
        self.asked = threading.Event()
        """Set by every page's poll, cleared by each audit: audits run only while a page
        looks (an audit hashes every weight file; nobody reads its verdict otherwise)."""
        self.t0: float | None = None

    def get(self, since: int | None = None) -> bytes:
        """The page's state as JSON: `{"seq", "unchanged": true}` when the asking page
        already holds state `since` and nothing newer exists; the points added since
        (`"delta": true`) when it holds a recent one; else everything."""
        self.asked.set()
        with self._lock:
            if not self.seq or time.time() - self._read >= self.refresh_s:
                self.view.refresh()
                self._read = time.time()
                stamp = self.stamp()
                if stamp != self._stamp:
                    self._advance()
                    self._stamp = stamp
            if since == self.seq:
                return json.dumps({"seq": self.seq, "unchanged": True,
                                   "refreshed_at": self.view.refreshed_at}).encode()
            key = since if since in self._marks else None
            if key not in self._answers:  # built once per state for every page like it
                self._answers[key] = json.dumps({**self.build(self._marks.get(key)),
                                                 "seq": self.seq}, default=str).encode()
            return self._answers[key]

    def _advance(self) -> None:
        """A new state: the curves take their new points; what a page holding the
        previous state holds is remembered, so it can be sent only what it lacks."""
        v = self.view
        for (p, name), curve in self.curves.items():
            comp, metric = _SOURCE[name]
            s = v.get(comp, p, metric)
            curve.update(s.steps, s.values)
        self.seq += 1
        self._marks[self.seq] = {k: c.mark() for k, c in self.curves.items()}
        self._marks.pop(self.seq - DELTAS, None)
        self._answers.clear()

    def stamp(self) -> tuple:
        """Everything the page shows depends on: equal stamps, equal pages."""
        v = self.view
        return (v.cursors(), tuple(v.progress.items()),
                tuple((p, tuple(vs)) for p, vs in v.versions.items()),
                json.dumps(v.components, sort_keys=True, default=str), self.audit["checked_at"])

    def _decode(self, policy: str, ids: list[int]) -> str:
        codec = self._codecs.get(policy)
        if codec is None:
            from astraflow.models.codec import load_codec

            ws = self.ctx.weights()
            vs = ws.versions(policy)
            if not vs:
                return f"<{len(ids)} tokens>"
            # Every version of a policy carries the same tokenizer; the oldest kept is
            # version 0, which pruning never deletes. The newest can be pruned between
            # listing and loading it on a fast run (seen: a page failing with a 500).
            codec = self._codecs[policy] = load_codec(ws.load(policy, vs[0]))
        return codec.decode(ids)

    def _episode(self, policy: str, r: dict[str, Any]) -> dict[str, Any]:
        if r["traj_id"] in self._episodes:
            return self._episodes[r["traj_id"]]
        extras = json.loads(r["extras"] or "{}")
        return {"traj_id": r["traj_id"], "policy": policy, "version": r["behavior_version"],
                "reward": r["reward"], "worker": r["worker"],
                "finish": extras.get("finish_reason", ""),
                "created_at": r["created_at"].timestamp(),
                "prompt": self._decode(policy, r["prompt_ids"]),
                "completion": self._decode(policy, r["completion_ids"])}

    def build(self, marks: dict[tuple[str, str], tuple[int, int]] | None = None
              ) -> dict[str, Any]:
        """The page's state; each curve whole, or, given what a page holds of them
        (`marks`), only the points after those (then `"delta": true`)."""
        v, flow = self.view, self.ctx.flow
        starts = [pr.times[0] for pr in v.rows.values() if pr.times]
        starts += [s.times[0] for s in v.series.values() if s.times]
        if starts and self.t0 is None:
            self.t0 = min(starts)
        t0 = self.t0 or time.time()
        parts = {k: c.since(marks[k]) if marks else None for k, c in self.curves.items()}
        delta = all(x is not None for x in parts.values())
        policies = {}
        for p in v.policies:
            policies[p] = {"summary": {k: _finite(x) for k, x in policy_summary(v, p).items()}}
            for name, *_ in CURVES:
                c = self.curves[(p, name)]
                policies[p][name] = parts[(p, name)] if delta else {"x": c.x, "y": c.y}
        pools = {pool: {"t": [x - t0 for x in ts], "n": ns}
                 for pool, (ts, ns) in v.workers_per_pool().items()}
        eps = []
        for p in v.policies:
            for r in v.rows[p].newest:
                eps.append(self._episode(p, r))
        self._episodes = {e["traj_id"]: e for e in eps}  # decoded once, kept while shown
        eps.sort(key=lambda e: -e["created_at"])
        return {"flow": flow.name, "mode": flow.mode, "store": self.ctx.store_uri,
                "refreshed_at": v.refreshed_at, "refreshes": v.refreshes, "delta": delta,
                "policies": policies, "pools": pools, "episodes": eps[:8],
                "audit": self.audit, "components": v.components}

    def run_audit(self) -> None:
        from astraflow.observe.audit import audit

        try:
            reports = audit(self.ctx)
            bad = sum(len(r.violations) for r in reports)
            self.audit = {"verdict": "OK" if bad == 0 else f"{bad} violation(s)",
                          "checked_at": time.time(),
                          "policies": {r.policy: {"counts": r.counts,
                                                  "violations": r.violations[:5]}
                                       for r in reports}}
        except Exception as err:  # noqa: BLE001 - shown on the page, retried later
            self.audit = {**self.audit, "verdict": f"audit failed: {err}",
                          "checked_at": time.time()}

    def audit_loop(self, stop: threading.Event) -> None:
        """An audit when a page asks, then at most one per `audit_every_s` while pages
        keep asking; none while no page is open."""
        while not stop.is_set():
            self.asked.wait()
            if stop.is_set():
                return
            self.asked.clear()
            self.run_audit()
            stop.wait(self.audit_every_s)


def make_app(state: State, *, poll_s: float | None = None):
    from fastapi import FastAPI
    from fastapi.responses import FileResponse, HTMLResponse, Response

    app = FastAPI(title=f"AstraFlow · {state.ctx.flow.name}", docs_url=None, redoc_url=None)
    poll_ms = int(1000 * (poll_s if poll_s is not None else max(state.refresh_s / 2, 0.5)))
    page = (STATIC / "index.html").read_text().replace("{{POLL_MS}}", str(poll_ms))
    js = plotly_js()

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return page

    @app.get("/static/app.js")
    def app_js() -> FileResponse:
        return FileResponse(STATIC / "app.js", media_type="text/javascript")

    @app.get("/static/plotly.min.js")
    def plotly() -> FileResponse:
        return FileResponse(js, media_type="text/javascript")

    @app.get("/favicon.ico")
    def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/api/state")
    def api_state(since: int | None = None) -> Response:
        return Response(state.get(since), media_type="application/json")

    return app


def serve(ctx: RunContext, *, port: int = 8765, refresh_s: float = 5.0,
          audit_every_s: float = 120.0, echo: Callable[[str], None] = print) -> None:
    """Serve until interrupted; binds 127.0.0.1 only."""
    import uvicorn

    state = State(ctx, refresh_s=refresh_s, audit_every_s=audit_every_s)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)  # connections wait in the backlog until uvicorn serves them
    stop = threading.Event()
    if audit_every_s > 0:
        threading.Thread(target=state.audit_loop, args=(stop,), daemon=True).start()
    echo(f"dashboard of {ctx.flow.name} on http://127.0.0.1:{sock.getsockname()[1]}/ "
         f"(Ctrl-C stops)")
    server = uvicorn.Server(uvicorn.Config(make_app(state), log_level="warning",
                                           loop="asyncio"))
    try:
        server.run(sockets=[sock])
    finally:
        stop.set()
        state.asked.set()  # the audit thread, if it waits for a page, ends
