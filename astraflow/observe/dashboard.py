"""`astraflow dashboard`: a live page of one run on 127.0.0.1, offline.

    browser ──GET /api/state?since=SEQ every poll_s──► State.get(since)
                                               │ older than refresh_s? (one lock)
                                               ▼
                                      RunView.refresh(): each table read once,
                                      only the fragments written since the last one
                                               │ anything new? (the view's stamp)
                                               ▼
                                      build + encode the JSON once, SEQ += 1
    audit thread ──every audit_every_s──► astraflow.audit (its own cadence: it
                                          verifies every weight version's sha256)

Any number of open pages share one refresh per `refresh_s`, and a page nobody
looks at costs the store nothing. The JSON is built only when a refresh found
something new, and a page that already holds the newest (its `since` is SEQ) gets
a few bytes back and redraws nothing: polling faster than the store changes costs
neither the server nor the browser. FastAPI serves the page; the charts are
plotly.js, served from the copy inside the `plotly` wheel (no CDN: the page
works on a machine with no internet).
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

from astraflow.observe.status import policy_summary
from astraflow.observe.view import RunView
from astraflow.run import RunContext

log = logging.getLogger("astraflow.observe")
STATIC = Path(__file__).parent / "static"
#: Points per curve sent to the page: longer curves are thinned evenly (the newest kept),
#: so a refresh costs the same at step 100 and at step 100,000.
MAX_POINTS = 500


def plotly_js() -> Path:
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise FileNotFoundError(f"plotly.min.js is not in the installed plotly ({path})")
    return path


def _finite(v: Any) -> Any:
    """JSON has no NaN or infinity (browsers refuse the whole document): null instead."""
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _xy(s, x: str = "steps") -> dict[str, list]:
    xs, ys = getattr(s, x), s.values
    if len(xs) > MAX_POINTS:
        idx = [round(i * (len(xs) - 1) / (MAX_POINTS - 1)) for i in range(MAX_POINTS)]
        xs, ys = [xs[i] for i in idx], [ys[i] for i in idx]
    return {"x": list(xs), "y": [_finite(v) for v in ys]}


class State:
    """The page's data, rebuilt from at most one store refresh per `refresh_s`."""

    def __init__(self, ctx: RunContext, *, refresh_s: float = 5.0, audit_every_s: float = 120.0,
                 episodes: int = 8):
        self.ctx = ctx
        self.view = RunView(ctx, episodes=episodes)
        self.refresh_s = refresh_s
        self.audit_every_s = audit_every_s
        self._lock = threading.Lock()
        self._json: bytes = b""
        self._built = 0.0
        self._stamp: Any = None
        self.seq = 0
        """Counts the distinct states built; a page sends the one it holds as `since`."""
        self._codecs: dict[str, Any] = {}
        self._episodes: dict[str, dict[str, Any]] = {}  # traj_id -> decoded, for the page
        self.audit: dict[str, Any] = {"verdict": "pending", "checked_at": None, "policies": {}}
        self.t0: float | None = None

    def get(self, since: int | None = None) -> bytes:
        """The page's state as JSON, or `{"seq", "unchanged": true}` when the asking page
        already holds state `since` and nothing newer exists."""
        with self._lock:
            if not self._json or time.time() - self._built >= self.refresh_s:
                self.view.refresh()
                self._built = time.time()
                stamp = self.stamp()
                if stamp != self._stamp:
                    self.seq += 1
                    self._json = json.dumps({**self.build(), "seq": self.seq},
                                            default=str).encode()
                    self._stamp = stamp
            if since == self.seq:
                return json.dumps({"seq": self.seq, "unchanged": True,
                                   "refreshed_at": self.view.refreshed_at}).encode()
            return self._json

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

    def build(self) -> dict[str, Any]:
        v, flow = self.view, self.ctx.flow
        starts = [pr.times[0] for pr in v.rows.values() if pr.times]
        starts += [s.times[0] for s in v.series.values() if s.times]
        if starts and self.t0 is None:
            self.t0 = min(starts)
        t0 = self.t0 or time.time()
        policies = {}
        for p in v.policies:
            g = v.get
            policies[p] = {
                "summary": {k: _finite(x) for k, x in policy_summary(v, p).items()},
                "reward": _xy(g("trainer", p, "reward_mean")),
                "heldout": _xy(g("eval", p, "heldout_accuracy")),
                "staleness": _xy(g("trainer", p, "staleness_mean")),
                "trainer_wait": _xy(g("trainer", p, "trainer_wait_s")),
            }
        pools = {pool: {"t": [x - t0 for x in ts], "n": ns}
                 for pool, (ts, ns) in v.workers_per_pool().items()}
        eps = []
        for p in v.policies:
            for r in v.rows[p].newest:
                eps.append(self._episode(p, r))
        self._episodes = {e["traj_id"]: e for e in eps}  # decoded once, kept while shown
        eps.sort(key=lambda e: -e["created_at"])
        return {"flow": flow.name, "mode": flow.mode, "store": self.ctx.store_uri,
                "refreshed_at": v.refreshed_at, "refreshes": v.refreshes,
                "policies": policies, "pools": pools, "episodes": eps[:8],
                "audit": self.audit, "components": v.components}

    def run_audit(self) -> None:
        from astraflow.audit import audit

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
        while not stop.is_set():
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
