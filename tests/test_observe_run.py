"""A real run seen from outside: a live dashboard in a real browser, TensorBoard event
files and an offline W&B run read back with their own readers, status and inspect.

One math run (the real CLI, launcher + trainer + worker processes) serves the module.
The browser test drives Debian's chromium through Playwright: on a fresh machine run
`bash scripts/setup-browser.sh` first. Without chromium it fails under CI=true (CI must
not silently lose it) and skips elsewhere.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from astraflow.cli.app import app
from astraflow.context import RESOLVED, RunContext
from tests.test_integration import FLOW
from tests.test_kill import stop_run

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
REPO = Path(__file__).resolve().parents[1]
#: Where the screenshot is kept as a test artifact (runs/ is ignored by git).
ARTIFACTS = REPO / "runs" / "test-artifacts"
STEPS = 16


@pytest.fixture(scope="module")
def live_run(tmp_path_factory):
    """A math run in progress: (launcher process, run folder, W&B folder)."""
    tmp = tmp_path_factory.mktemp("obsrun")
    flow = {**FLOW, "name": "obsrun", "rollout": {**FLOW["rollout"], "workers": 1},
            "stop": {**FLOW["stop"], "max_steps": STEPS, "max_minutes": 15}}
    path = tmp / "obsrun.yaml"
    path.write_text(yaml.safe_dump(flow))
    env = {**os.environ, "ASTRAFLOW_CACHE": str(tmp / "cache"), "WANDB_MODE": "offline",
           "ASTRAFLOW_WANDB": "1", "WANDB_DIR": str(tmp / "wandb"), "WANDB_SILENT": "true"}
    (tmp / "wandb").mkdir()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "astraflow", "run", str(path), "--runs", str(tmp / "runs")],
        stdout=open(tmp / "launcher.log", "w"), stderr=subprocess.STDOUT, env=env,
        start_new_session=True)
    run = tmp / "runs" / "obsrun"
    try:
        yield launcher, run, tmp / "wandb"
    finally:
        stop_run(launcher, run)


@pytest.fixture(scope="module")
def finished_run(live_run):
    launcher, run, wandb_dir = live_run
    launcher.wait(timeout=1200)
    log = (run.parent.parent / "launcher.log").read_text()
    assert launcher.returncode == 0, log[-3000:]
    return RunContext.open(run), wandb_dir


def _browser():
    """Playwright's chromium on Debian's binary; fail in CI, skip elsewhere, when missing."""
    missing = None
    if not Path(CHROMIUM).exists():
        missing = f"{CHROMIUM} is missing (bash scripts/setup-browser.sh installs it)"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing = "playwright is not installed (pip install -e '.[dev]')"
    if missing:
        if os.environ.get("CI"):
            pytest.fail(missing)
        pytest.skip(missing)
    return sync_playwright


def _serve(ctx: RunContext):
    """The dashboard's real server (uvicorn) in a thread, on a free port of 127.0.0.1."""
    import uvicorn

    from astraflow.observe.dashboard import State, make_app

    state = State(ctx, refresh_s=1.0, audit_every_s=0)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    # loop="asyncio": uvloop's policy, set process-wide, breaks playwright's subprocesses.
    server = uvicorn.Server(uvicorn.Config(make_app(state, poll_s=1.0), log_level="warning",
                                           loop="asyncio"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    return server, thread, state, f"http://127.0.0.1:{sock.getsockname()[1]}/"


def test_dashboard_follows_a_live_run_in_a_real_browser(live_run, tmp_path):
    sync_playwright = _browser()
    launcher, run, _ = live_run
    # Generous: only a launcher that never starts should fail here (seen: 120 s was not
    # enough for its imports on 2 cores at load average 17).
    deadline = time.time() + 600
    while not (run / RESOLVED).exists():
        assert launcher.poll() is None and time.time() < deadline, "the run did not start"
        time.sleep(0.5)
    ctx = RunContext.open(run)
    # Hold the trainer (SIGSTOP) once it has stepped, so the page surely loads while the
    # run still has steps to take, then let it go and watch the curve grow. It runs in
    # 0.2 s slices and its progress is read while it is held: reading progress on a
    # loaded machine can take longer than the trainer needs for all 16 steps (seen: the
    # page found 16 points), so it must not run on while the test looks.
    led = ctx.ledger()
    deadline = time.time() + 900
    components = run / "components.json"
    while not (components.exists() and "trainer-solver" in json.loads(components.read_text())):
        assert launcher.poll() is None and time.time() < deadline, "no trainer started"
        time.sleep(0.2)
    trainer = json.loads(components.read_text())["trainer-solver"]["pid"]
    os.kill(trainer, signal.SIGSTOP)
    while (prog := led.progress("solver")) is None or prog.step < 1:
        assert launcher.poll() is None and time.time() < deadline, "the trainer never stepped"
        os.kill(trainer, signal.SIGCONT)
        time.sleep(0.2)
        os.kill(trainer, signal.SIGSTOP)
    server = None
    try:
        server, thread, state, url = _serve(ctx)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            failed: list[str] = []
            page.on("requestfailed", lambda r: failed.append(r.url))
            page.set_default_timeout(180_000)  # 2 shared cores under load parse plotly slowly
            page.goto(url)
            points = "() => Number(document.querySelector('#reward-solver')?.dataset.points || 0)"
            page.wait_for_function(f"({points})() >= 1")  # the train-reward curve
            seen = page.evaluate(points)
            assert seen < STEPS
            os.kill(trainer, signal.SIGCONT)
            page.wait_for_function(f"({points})() > {seen}")
            assert page.evaluate(points) > seen
            # The page drew the curve once and then appended the new points (a delta).
            assert page.evaluate("() => Number(document.body.dataset.deltas || 0)") >= 1
            state.run_audit()  # the verdict shows on the next poll
            page.wait_for_function(
                "() => document.getElementById('audit').textContent !== 'pending'")
            page.wait_for_function(
                "() => document.querySelectorAll('#episodes tbody tr').length > 0")
            assert "solver" in page.inner_text("#cards")
            assert page.evaluate("typeof Plotly") == "object"  # served by us, not a CDN
            assert not failed, failed
            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            browser.close()
        assert shot.stat().st_size > 20_000
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, ARTIFACTS / "dashboard.png")
        if os.environ.get("ASTRAFLOW_UPDATE_DOCS"):
            shutil.copy(shot, REPO / "docs" / "dashboard.png")
        # One refresh served every poll of the page in its second: reads stayed bounded.
        assert state.view.reads["metrics"] == state.view.refreshes
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(trainer, signal.SIGCONT)
        if server is not None:
            server.should_exit = True
            thread.join(timeout=10)


def _store_series(ctx: RunContext) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(component, name) -> [(step, value)] in the order logged (one writer each here)."""
    out: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for r in sorted(ctx.ledger().read_metrics().to_pylist(), key=lambda r: r["time"]):
        out[(r["component"], r["name"])].append((r["step"], r["value"]))
    return out


def _tensorboard(logdir: Path) -> dict[tuple[str, str], list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = {}
    for comp in ("trainer", "rollout", "eval", "worker"):
        acc = EventAccumulator(str(logdir / comp), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            name = tag.rsplit("/", 1)[1]
            out[(comp, name)] = [(e.step, e.value) for e in acc.Scalars(tag)]
            want = {"trainer": f"solver/{name}", "worker": f"workers/w0/{name}"}.get(
                comp, f"solver/{comp}/{name}")
            assert tag == want
    return out


def _check_same(store, got, label: str) -> None:
    assert set(got) == set(store), (label, set(store) ^ set(got))
    for key, points in store.items():
        comp = key[0]
        mine = got[key]
        assert len(mine) == len(points), (label, key)
        if comp == "rollout":  # numbered in commit order
            assert [s for s, _ in mine] == list(range(1, len(points) + 1)), (label, key)
        else:
            assert [s for s, _ in mine] == [s for s, _ in points], (label, key)
        assert [v for _, v in mine] == pytest.approx([v for _, v in points], rel=1e-6,
                                                     abs=1e-6), (label, key)


def test_tensorboard_event_files_match_the_metrics_table(finished_run, tmp_path):
    ctx, _ = finished_run
    store = _store_series(ctx)
    assert len(store[("trainer", "reward_mean")]) == STEPS
    assert ("eval", "heldout_accuracy") in store and ("rollout", "gen_s") in store
    _check_same(store, _tensorboard(ctx.run_dir / "tensorboard"), "launcher")
    res = CliRunner().invoke(app, ["export", str(ctx.run_dir), "--to", "tensorboard",
                                   "--logdir", str(tmp_path / "tb")])
    assert res.exit_code == 0, res.output
    _check_same(store, _tensorboard(tmp_path / "tb"), "export")


def _wandb_history(path: str) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(component, name) -> [(step, value)] from an offline run's .wandb file, read with
    wandb's own record reader."""
    from wandb.proto import wandb_internal_pb2 as pb
    from wandb.sdk.internal import datastore

    ds = datastore.DataStore()
    ds.open_for_scan(path)
    out: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    while (data := ds.scan_data()) is not None:
        rec = pb.Record()
        rec.ParseFromString(data)
        if rec.WhichOneof("record_type") != "history":
            continue
        items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                 for i in rec.history.item}
        for key, value in items.items():
            parts = key.split("/")
            if key.startswith("_") or parts[-1] == "step":
                continue
            if parts[0] == "workers":  # per worker: workers/<id>/<name>
                comp, step_key = "worker", f"workers/{parts[1]}/step"
            else:
                comp = "trainer" if len(parts) == 2 else parts[1]
                step_key = "solver/step" if comp == "trainer" else f"solver/{comp}/step"
            out[(comp, parts[-1])].append((items[step_key], value))
    return out


def _wandb_settled(path: str, want: dict) -> dict:
    """Read the offline run until it holds as many points as `want` (or 60 s passed): wandb's
    service may still be writing the file's tail when `finish()` returned."""
    deadline = time.time() + 60
    while True:
        got = _wandb_history(path)
        if all(len(got.get(k, ())) >= len(v) for k, v in want.items()) or time.time() > deadline:
            return got
        time.sleep(1)


def test_offline_wandb_run_gets_the_same_series(finished_run, tmp_path, monkeypatch):
    ctx, wandb_dir = finished_run
    store = _store_series(ctx)
    runs = glob.glob(str(wandb_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(runs) == 1, runs  # one W&B run for the whole flow
    _check_same(store, _wandb_settled(runs[0], store), "launcher")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    res = CliRunner().invoke(app, ["export", str(ctx.run_dir), "--to", "wandb"])
    assert res.exit_code == 0, res.output
    (exported,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    _check_same(store, _wandb_settled(exported, store), "export")


def test_status_inspect_and_duckdb_on_the_finished_run(finished_run):
    ctx, _ = finished_run
    run = str(ctx.run_dir)
    res = CliRunner().invoke(app, ["status", run], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert re.search(rf"│ solver\s*│\s*{STEPS - 1}\s*│", res.output), res.output
    assert "rollout-w0" in res.output and "finished" in res.output
    res = CliRunner().invoke(app, ["inspect", run, "--where", "reward < 1", "--limit", "3",
                                   "--json"])
    assert res.exit_code == 0, res.output
    eps = [json.loads(line) for line in res.output.splitlines()]
    assert len(eps) == 3 and all(e["reward"] < 1 for e in eps)
    assert all(e["prompt"].endswith("=") and "+" in e["prompt"] for e in eps)
    assert all(e["extras"]["finish_reason"] in ("stop", "length") for e in eps)
    assert all(e["advantage"] is not None for e in eps)
    # The README's DuckDB recipe, on the same table.
    import duckdb
    import lancedb

    traj = lancedb.connect(ctx.store_uri).open_table("traj_solver").to_lance()  # noqa: F841
    (n, mean), = duckdb.sql("SELECT count(*), avg(reward) FROM traj").fetchall()
    assert n == ctx.trajectories().count("solver") and 0 <= mean <= 1
