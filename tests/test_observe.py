"""Seeing a run (astraflow/observe): status, inspect, metric sinks, the dashboard's reads.

Fast tests here use a store seeded in-process (local and on the moto S3 server);
the real run, TensorBoard/W&B read-back and the browser test are in
tests/test_observe_run.py.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from datetime import UTC, datetime

import pytest
from typer.testing import CliRunner

from astraflow.cli.app import app
from astraflow.config.loader import parse_flow
from astraflow.context import RESOLVED, RunContext, publish_flow
from astraflow.observe.sinks import MAX_FAILURES, Follower, Point
from astraflow.observe.view import RunView
from astraflow.stores import _lance
from astraflow.stores.read import Held
from astraflow.stores.schema import TRAJECTORY_SCHEMA
from tests.test_integration import FLOW

runner = CliRunner()


def _rows(codec, n: int, *, version: int, worker: str = "w0") -> list[dict]:
    """Episodes with two turns: the policy's answer, a tool's reply it only read (mask 0),
    and tool calls in the extras."""
    now = datetime.now(UTC)
    out = []
    for i in range(n):
        a, b = codec.encode(f"{i}"), codec.encode("=9")
        out.append({
            "traj_id": f"{worker}-{version}-{i}", "group_id": f"g{version}-{i // 2}",
            "policy": "solver", "behavior_version": version, "prompt_ids": codec.encode(f"{i}+1="),
            "completion_ids": a + b, "behavior_logprobs": [-0.1] * (len(a) + len(b)),
            "loss_mask": [1] * len(a) + [0] * len(b), "reward": float(i % 2), "env": "math",
            "task_id": f"t{i}", "worker": worker, "region": "", "created_at": now,
            "extras": json.dumps({"finish_reason": "stop", "role": "solver",
                                  "tool_calls": [{"name": "calc", "args": f"{i}+1"}]})})
    return out


def seed(ctx: RunContext, policy_dir, *, steps: int = 6) -> None:
    """A run as its components would leave it: weights, rows, ledger-free metrics."""
    from astraflow.models.codec import load_codec

    ws = ctx.weights()
    for _ in range(2):
        st = ws.staging_dir("solver")
        for f in policy_dir.iterdir():
            shutil.copy(f, st)
        ws.publish("solver", st, step=0)
    codec = load_codec(policy_dir)
    traj, led = ctx.trajectories(), ctx.ledger()
    for v in range(2):
        traj.append("solver", _rows(codec, 4, version=v, worker=f"w{v}"))
    for s in range(steps):
        led.log("trainer", "solver", s, {"reward_mean": s / 10, "trainer_wait_s": 0.5,
                                         "step_time_s": 1.5, "rows_read": 8.0,
                                         "staleness_mean": 0.5, "weight_version": s // 2})
        led.log_many("rollout", [("solver", s, {"reward_mean": 0.2, "rows": 4.0})])
    led.log("eval", "solver", 1, {"heldout_accuracy": 0.25})


@pytest.fixture
def local_run(tmp_path, tiny_policy_dir):
    spec = parse_flow({**FLOW, "name": "seeded"})
    run = tmp_path / "runs" / "seeded"
    run.mkdir(parents=True)
    (run / RESOLVED).write_text(spec.dump())
    ctx = RunContext(spec, run)
    seed(ctx, tiny_policy_dir)
    return ctx


def count_reads(monkeypatch) -> Counter:
    """Every table read goes through `_lance.latest_dataset` or a follower's
    `Held.latest`: count them by table."""
    counts: Counter = Counter()
    real, held = _lance.latest_dataset, Held.latest

    def counted(table):
        counts[table.name] += 1
        return real(table)

    def counted_held(self):
        counts[self.table.name] += 1
        return held(self)

    monkeypatch.setattr(_lance, "latest_dataset", counted)
    monkeypatch.setattr(Held, "latest", counted_held)
    return counts


def test_status_table_and_json(local_run):
    res = runner.invoke(app, ["status", str(local_run.run_dir)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    out = res.output
    assert "solver" in out and "v1" in out and "25.0%" in out  # version, held-out
    assert "0.500 ↑" in out  # newest reward and its rising trend
    assert "25%" in out  # trainer wait: 0.5 s of every 2 s
    assert "w0" in out and "w1" in out  # the pool's workers
    res = runner.invoke(app, ["status", str(local_run.run_dir), "--json"])
    data = json.loads(res.output)
    # Stable shape: per policy under "policies"; one policy's totals also at the top.
    assert data["policies"]["solver"]["trajectory_rows"] == 8 == data["trajectory_rows"]
    assert data["policies"]["solver"]["weight_versions"] == [0, 1]
    assert data["steps"] == 0  # no ledger rows were seeded


def test_inspect_decodes_turns_tools_and_advantage(local_run):
    res = runner.invoke(app, ["inspect", str(local_run.run_dir), "--where", "reward > 0.5",
                              "--version", "1", "--limit", "3", "--json"])
    assert res.exit_code == 0, res.output
    eps = [json.loads(line) for line in res.output.splitlines()]
    assert len(eps) == 2 and all(e["reward"] == 1.0 and e["behavior_version"] == 1 for e in eps)
    e = eps[0]
    i = int(e["traj_id"].rsplit("-", 1)[1])
    assert e["prompt"] == f"{i}+1=" and e["turns"] == [
        {"who": "policy", "text": f"{i}"}, {"who": "context", "text": "=9"}]
    assert e["extras"]["tool_calls"][0]["name"] == "calc"
    # group of two, rewards 0 and 1: GRPO advantage +1 (reward minus mean, over std)
    assert e["advantage"] == pytest.approx(1.0, abs=1e-3)
    res = runner.invoke(app, ["inspect", str(local_run.run_dir), "--limit", "1"],
                        env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "tool_calls" in res.output and "advantage" in res.output


@pytest.mark.parametrize("args, message", [
    (["inspect", "{run}", "--where", "reward <"], "bad --where filter"),
    (["inspect", "{run}", "--where", "no_such_column = 1"], "bad --where filter"),
    (["inspect", "{run}", "--policy", "nobody"], "no policy 'nobody'"),
    (["status", "{missing}"], "is not a run folder"),
    (["inspect", "{missing}"], "is not a run folder"),
    (["eval", "{run}", "--policy", "nobody"], "no policy 'nobody'"),
    (["eval", "{run}", "--version", "999"], "no weight version 999 of solver"),
    (["export", "{run}", "--to", "nothing"], "--to takes tensorboard or wandb, not 'nothing'"),
])
def test_bad_input_is_one_line_and_exit_2(local_run, tmp_path, args, message):
    args = [a.format(run=local_run.run_dir, missing=tmp_path / "nope") for a in args]
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], res.output
    assert ".rs:" not in lines[0]  # no Rust source locations


def test_status_and_inspect_on_s3(s3_env, tmp_path, tiny_policy_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ASTRAFLOW_CACHE", str(tmp_path / "cache"))
    uri = f"s3://{s3_env}/runs/obs"
    spec = parse_flow({**FLOW, "name": "obs-s3", "store": {"uri": uri}})
    publish_flow(spec)
    ctx = RunContext.open(uri, runs_root=tmp_path / "seed")
    seed(ctx, tiny_policy_dir)
    res = runner.invoke(app, ["status", uri], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "v1" in res.output and "25.0%" in res.output and "cloud run" in res.output
    # On S3 a flow stages its rows by default: status and inspect say so until the
    # trainer reads them.
    assert "0 +8 staged" in res.output
    res = runner.invoke(app, ["inspect", uri, "--where", "worker = 'w0'"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "0 episode(s)" in res.output and "8 more row(s) staged" in res.output
    assert ctx.trajectories().read_after("solver", 0) is not None  # the trainer's read
    res = runner.invoke(app, ["status", uri], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "staged" not in res.output, res.output
    res = runner.invoke(app, ["inspect", uri, "--where", "worker = 'w0'", "--json"])
    assert res.exit_code == 0, res.output
    eps = [json.loads(line) for line in res.output.splitlines()]
    assert len(eps) == 4 and {e["behavior_version"] for e in eps} == {0}
    res = runner.invoke(app, ["status", f"s3://{s3_env}/runs/none"])
    assert res.exit_code == 2 and "holds no flow.resolved.yaml" in res.output


def test_view_reads_each_table_once_per_refresh_and_only_new_commits(local_run, monkeypatch):
    counts = count_reads(monkeypatch)
    view = RunView(local_run).refresh()
    assert counts == Counter({"metrics": 1, "traj_solver": 1})
    n = sum(len(s.values) for s in view.series.values())
    local_run.ledger().log("trainer", "solver", 6, {"reward_mean": 0.9})
    view.refresh()
    assert counts == Counter({"metrics": 2, "traj_solver": 2})
    assert sum(len(s.values) for s in view.series.values()) == n + 1  # only the new row
    assert view.get("trainer", "solver", "reward_mean").values[-1] == 0.9
    assert RunView(local_run).refresh().series == view.series  # deltas == one whole read
    assert len(view.rows["solver"].times) == 8
    # The newest episodes (in full) come from the newest commit; every row counts.
    view = RunView(local_run, episodes=3).refresh()
    assert [r["worker"] for r in view.rows["solver"].newest] == ["w1"] * 3
    assert view.rows["solver"].newest[-1]["prompt_ids"]
    assert view.rows["solver"].workers == ["w0"] * 4 + ["w1"] * 4
    assert sum(view.workers_per_pool()["local"][1]) == 2  # w0 and w1, in one bin or two


def test_dashboard_state_reads_once_per_refresh_for_any_number_of_pages(local_run, monkeypatch):
    from fastapi.testclient import TestClient

    from astraflow.observe.dashboard import State, make_app

    counts = count_reads(monkeypatch)
    state = State(local_run, refresh_s=3600, audit_every_s=0)
    client = TestClient(make_app(state))
    for _ in range(5):  # five pages polling within one refresh period
        body = client.get("/api/state").json()
    assert counts == Counter({"metrics": 1, "traj_solver": 1})
    assert body["policies"]["solver"]["reward"]["y"][-1] == 0.5
    assert body["pools"]["local"]["n"] and body["episodes"][0]["completion"].endswith("=9")
    page = client.get("/").text
    assert "/static/plotly.min.js" in page and "http" not in page.split("<body")[0].replace(
        'charset="utf-8"', "")  # nothing from a CDN
    assert client.get("/static/plotly.min.js").status_code == 200
    seq = body["seq"]
    # A page holding the newest state gets a few bytes, with or without a store read.
    assert client.get(f"/api/state?since={seq}").json()["unchanged"] is True
    state.refresh_s = 0
    assert client.get(f"/api/state?since={seq}").json() == {
        "seq": seq, "unchanged": True, "refreshed_at": state.view.refreshed_at}
    assert counts == Counter({"metrics": 2, "traj_solver": 2})  # read, found nothing new
    local_run.ledger().log("trainer", "solver", 6, {"reward_mean": 0.75})
    body = client.get(f"/api/state?since={seq}").json()
    # The page holding `seq` gets only the new point, to append; a new page everything.
    assert body["seq"] == seq + 1 and body["delta"] is True
    assert body["policies"]["solver"]["reward"] == {"x": [6], "y": [0.75]}
    assert body["policies"]["solver"]["heldout"] == {"x": [], "y": []}
    whole = client.get("/api/state").json()
    assert whole["delta"] is False and whole["policies"]["solver"]["reward"]["y"][-2:] == [
        0.5, 0.75]
    assert client.get(f"/api/state?since={seq - 1}").json()["seq"] == seq + 1  # a stale page
    assert counts == Counter({"metrics": 5, "traj_solver": 5})  # refresh_s=0: each get
    state.run_audit()
    assert state.audit["verdict"] == "OK"
    assert client.get(f"/api/state?since={seq + 1}").json()["audit"]["verdict"] == "OK"


def test_dashboard_audits_only_while_a_page_polls(local_run):
    import threading
    import time

    from astraflow.observe.dashboard import State

    state = State(local_run, refresh_s=3600, audit_every_s=0.05)
    audits: list[float] = []
    state.run_audit = lambda: audits.append(time.time())
    stop = threading.Event()
    thread = threading.Thread(target=state.audit_loop, args=(stop,), daemon=True)
    thread.start()

    def wait_for(n: int) -> None:
        deadline = time.time() + 60
        while len(audits) < n and time.time() < deadline:
            time.sleep(0.01)
        assert len(audits) == n

    time.sleep(0.3)
    assert audits == []  # no page yet: no audit
    state.get()
    wait_for(1)
    time.sleep(0.3)  # six audit periods, no page asking: still one
    assert len(audits) == 1
    state.get(state.seq)
    wait_for(2)
    stop.set()
    state.asked.set()
    thread.join(timeout=30)
    assert not thread.is_alive()


def test_dashboard_curve_keeps_every_stride_th_point_and_sends_only_new_ones():
    """A curve past MAX_POINTS keeps every 2^k-th point; a page holding an older
    thinning (epoch) is sent the curve whole, one holding the current one the tail."""
    from astraflow.observe.dashboard import MAX_POINTS, Curve

    c, xs = Curve(), list(range(MAX_POINTS))
    ys = [float(x) for x in xs]
    c.update(xs, ys)
    mark = c.mark()
    assert c.x == xs and c.since(mark) == {"x": [], "y": []}
    xs += [MAX_POINTS, MAX_POINTS + 1]
    ys += [float("nan"), 1.0]
    c.update(xs, ys)  # past MAX_POINTS: every 2nd point kept
    assert c.stride == 2 and c.x == list(range(0, MAX_POINTS + 2, 2)) and c.since(mark) is None
    assert c.y[-1] is None  # NaN is no JSON
    mark = c.mark()
    xs += [MAX_POINTS + 2, MAX_POINTS + 3]
    ys += [2.0, 3.0]
    c.update(xs, ys)
    assert c.since(mark) == {"x": [MAX_POINTS + 2], "y": [2.0]}


class Recorder:
    def __init__(self):
        self.points: list[Point] = []
        self.closed = False

    def write(self, points):
        self.points += points

    def close(self):
        self.closed = True


class Broken:
    calls = 0

    def write(self, points):
        Broken.calls += 1
        raise OSError("disk full")

    def close(self):
        raise OSError("disk full")


def test_a_failing_sink_never_reaches_the_caller(local_run, caplog):
    rec = Recorder()
    f = Follower(local_run, [Broken(), rec])
    led = local_run.ledger()
    total = f.poll()
    for s in range(6, 6 + MAX_FAILURES + 1):
        led.log("trainer", "solver", s, {"reward_mean": 1.0})
        total += f.poll()
    f.close()
    assert Broken.calls == MAX_FAILURES  # then switched off
    assert rec.closed and len(rec.points) == total == local_run.ledger().read_metrics().num_rows
    assert "switched off" in caplog.text
    # Rollout points are numbered per policy in commit order (workers' own numbers collide).
    assert [p.step for p in rec.points if p.component == "rollout" and p.name == "rows"] == \
        list(range(1, 7))
    assert {p.tag for p in rec.points} >= {"solver/reward_mean", "solver/rollout/rows",
                                           "solver/eval/heldout_accuracy"}


def test_trajectory_schema_is_what_inspect_reads():
    from astraflow.observe.view import EPISODE, LIGHT

    assert set(EPISODE) | set(LIGHT) <= set(TRAJECTORY_SCHEMA.names)


def test_dashboard_assets_ship_in_the_package():
    """The page works offline: its files are package data, plotly.min.js comes from the
    plotly wheel (the `dashboard` extra)."""
    import tomllib
    from pathlib import Path

    from astraflow.observe.dashboard import STATIC, plotly_js

    root = Path(__file__).resolve().parents[1]
    cfg = tomllib.loads((root / "pyproject.toml").read_text())
    assert "astraflow.observe" in cfg["tool"]["setuptools"]["packages"]
    assert cfg["tool"]["setuptools"]["package-data"]["astraflow.observe"] == ["static/*"]
    assert {p.name for p in STATIC.iterdir()} >= {"index.html", "app.js"}
    assert plotly_js().stat().st_size > 1_000_000
    assert "plotly" in " ".join(cfg["project"]["optional-dependencies"]["dashboard"])


def test_status_inspect_and_a_fresh_view_see_retired_rows(local_run):
    """Rows the launcher retired (`TrajectoryStore.retire`) still count and show."""
    traj = local_run.trajectories()
    first = traj.read_after("solver", 0, min_rows=1, max_rows=4)
    assert first is not None and first.num_rows == 4
    assert traj.retire("solver", first.end) == 4  # w0's commit leaves the live table
    res = runner.invoke(app, ["status", str(local_run.run_dir), "--json"])
    assert json.loads(res.output)["trajectory_rows"] == 8
    res = runner.invoke(app, ["inspect", str(local_run.run_dir), "--version", "0", "--json",
                              "--where", "reward > 0.5"])
    eps = [json.loads(line) for line in res.output.splitlines()]
    assert res.exit_code == 0 and len(eps) == 2
    assert {e["worker"] for e in eps} == {"w0"}
    assert all(e["advantage"] == pytest.approx(1.0, abs=1e-3) for e in eps)
    view = RunView(local_run, episodes=3).refresh()
    assert view.rows["solver"].workers == ["w0"] * 4 + ["w1"] * 4
    assert [r["worker"] for r in view.rows["solver"].newest] == ["w1"] * 3
