"""`astraflow scale`: the backends (local processes for real; Modal and SkyPilot with
recorders in place of the clouds, as tests/test_launch.py does) and a real local run
that the autoscaler grows and shrinks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from astraflow.policies import Pool

FIX = Path(__file__).parent / "fixtures"
KEYS = {"AWS_ACCESS_KEY_ID": "AKIAFAKEFAKEFAKE", "AWS_SECRET_ACCESS_KEY": "fake-secret-0123"}


def say(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def _until(cond, timeout: float, poll: float = 0.2):
    end = time.time() + timeout
    while time.time() < end:
        if v := cond():
            return v
        time.sleep(poll)
    return cond()


def test_import_of_the_scaler_is_light():
    code = ("import sys, astraflow.scale, astraflow.scale.backends, astraflow.scale.pools; "
            "print([m for m in ('torch', 'modal', 'sky') if m in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_local_backend_outlives_its_autoscaler(tmp_path):
    from astraflow.scale.backends import LocalBackend

    pool = Pool("local", backend="local")
    fake = (sys.executable, str(FIX / "fake_worker.py"))
    be = LocalBackend(tmp_path, command=fake)
    a, b = be.launch(pool, "local-a"), be.launch(pool, "local-b")
    assert _until(lambda: all((tmp_path / f"{w}.started").exists() for w in ("local-a", "local-b")),
                  30)
    assert [w.worker_id for w in be.live(pool)] == ["local-a", "local-b"]
    # A new autoscaler (the old one killed) finds the same workers from the run folder.
    again = LocalBackend(tmp_path, command=fake)
    assert [w.worker_id for w in again.live(pool)] == ["local-a", "local-b"]
    assert again.live(Pool("other")) == []
    again.retire(pool, [b])  # SIGTERM: the worker finishes its batch and exits 0
    assert _until(lambda: (tmp_path / "local-b.finished").exists(), 30)
    assert _until(lambda: [w.worker_id for w in be.live(pool)] == ["local-a"], 30)
    assert be._children[int(b.handle)].wait(10) == 0
    state = json.loads((tmp_path / "scale" / "local.json").read_text())
    assert list(state) == ["local-a"] and state["local-a"]["pid"] == int(a.handle)
    be.retire(pool, [a])
    assert be._children[int(a.handle)].wait(10) == 0


class _ModalRecorder:
    """modal.Cls.from_name(...).with_options(gpu=)().run.spawn(**kw) and
    modal.FunctionCall.from_id(id).get(timeout=0) / .cancel(), recorded."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.cancelled: set[str] = set()

    def from_name(self, app, cls_name, **_):
        rec = self

        class _Method:
            def __init__(self, gpu):
                self.gpu = gpu

            def spawn(self, **kw):
                rec.calls.append(("spawn", app, cls_name, self.gpu, kw))
                return type("FC", (), {"object_id": f"fc-{len(rec.calls)}"})()

        class _Cls:
            def __init__(self, gpu=None):
                self.gpu = gpu

            def with_options(self, gpu=None, **_):
                rec.calls.append(("with_options", gpu))
                return _Cls(gpu)

            def __call__(self):
                return type("Obj", (), {"run": _Method(self.gpu)})()

        return _Cls()

    def from_id(self, call_id, **_):
        rec = self

        class _FC:
            def get(self, timeout=None):
                if call_id in rec.cancelled:
                    raise RuntimeError("cancelled")  # stands for modal's InputCancellation
                raise TimeoutError

            def cancel(self, terminate_containers=False):
                rec.calls.append(("cancel", call_id))
                rec.cancelled.add(call_id)

        return _FC()


def test_modal_backend_spawns_lists_and_cancels(monkeypatch, tmp_path):
    modal = pytest.importorskip("modal")
    from astraflow.scale.backends import ModalBackend

    rec = _ModalRecorder()
    monkeypatch.setattr(modal.Cls, "from_name", rec.from_name)
    monkeypatch.setattr(modal.FunctionCall, "from_id", rec.from_id)
    store = str(tmp_path / "store")
    pool = Pool("m-l4", backend="modal", cloud="modal", accelerator="L4", region="us-east-1")
    be = ModalBackend(store, minutes=15)
    w1, w2 = be.launch(pool, "m-l4-1"), be.launch(pool, "m-l4-2")
    spawns = [c for c in rec.calls if c[0] == "spawn"]
    assert [c[1:4] for c in spawns] == [("astraflow-rollout", "Rollout", "L4")] * 2
    assert spawns[0][4] == {"target": store, "worker_id": "m-l4-1", "minutes": 15,
                            "region": "us-east-1"}
    # The call ids live in the store: a restarted autoscaler lists the same workers.
    assert [w.handle for w in ModalBackend(store).live(pool)] == ["fc-2", "fc-4"]
    be.retire(pool, [w1])
    assert ("cancel", w1.handle) in rec.calls
    assert [w.worker_id for w in ModalBackend(store).live(pool)] == ["m-l4-2"]
    assert w2.handle == "fc-4"


class _SkyRecorder:
    def __init__(self):
        self.calls: list[tuple] = []
        self.jobs: dict[str, dict] = {}

    def jobs_launch(self, task, name=None, **_):
        self.calls.append(("launch", name, task))
        self.jobs[name] = {"job_name": name, "status": "ManagedJobStatus.RUNNING",
                           "submitted_at": float(len(self.jobs)), "recovery_count": 1}
        return f"req-{name}"

    def stream_and_get(self, request):
        return [len(self.calls)], None

    def queue_v2(self, refresh, skip_finished=False, **_):
        return "queue"

    def cancel(self, name=None, **_):
        self.calls.append(("cancel", name))
        self.jobs[name]["status"] = "ManagedJobStatus.CANCELLED"
        return "cancel-req"

    def get(self, request):
        if request == "queue":
            return list(self.jobs.values()), len(self.jobs), {}, 0
        return None


def test_sky_backend_launches_pinned_jobs_lists_and_cancels(monkeypatch, tmp_path):
    sky = pytest.importorskip("sky")
    from astraflow.scale.backends import SkyBackend

    rec = _SkyRecorder()
    monkeypatch.setattr(sky.jobs, "launch", rec.jobs_launch)
    monkeypatch.setattr(sky.jobs, "queue_v2", rec.queue_v2)
    monkeypatch.setattr(sky.jobs, "cancel", rec.cancel)
    monkeypatch.setattr(sky, "stream_and_get", rec.stream_and_get)
    monkeypatch.setattr(sky, "get", rec.get)
    store = "s3://bucket/runs/math"
    spot = Pool("east-l4", cloud="aws", region="us-east-2", accelerator="L4", spot=True)
    od = Pool("east-l4-od", cloud="aws", region="us-east-1", accelerator="L4", spot=False)
    be = SkyBackend(store, "math", minutes=30, environ=KEYS)
    be.launch(spot, "east-l4-aa")
    be.launch(spot, "east-l4-bb")
    be.launch(od, "east-l4-od-cc")
    [(_, name, task), *_] = [c for c in rec.calls if c[0] == "launch"]
    assert name == "math-east-l4-xaa"
    # A real sky.Task (validated by SkyPilot offline): pinned to the pool, spot as it says.
    [res] = list(task.resources)
    assert res.use_spot and str(res.cloud).lower() == "aws" and res.region == "us-east-2"
    assert res.accelerators == {"L4": 1}
    assert task.envs["ASTRAFLOW_STORE"] == store and task.envs["ASTRAFLOW_POOL"] == "east-l4-aa"
    assert task.envs["ASTRAFLOW_MINUTES"] == "30"
    assert KEYS["AWS_SECRET_ACCESS_KEY"] not in repr(task.envs)
    odt = [c[2] for c in rec.calls if c[0] == "launch"][2]
    assert not next(iter(odt.resources)).use_spot
    # The job queue is the state: names by pool prefix; "east-l4-od-*" is another pool's.
    assert [(w.worker_id, w.handle) for w in be.live(spot)] == [
        ("east-l4-aa", "math-east-l4-xaa"), ("east-l4-bb", "math-east-l4-xbb")]
    assert [w.handle for w in be.live(od)] == ["math-east-l4-od-xcc"]
    # No recovery times: SkyPilot's recovery_count, and no clock.
    assert be.preemptions(spot, time.time()) == (2, None)
    # With recovery times: one job recovered 2 h ago, one 10 min ago. Only the recent one
    # counts, so a pool preempted long ago may grow again; the clock runs from the newest.
    now = time.time()
    rec.jobs["math-east-l4-xaa"]["last_recovered_at"] = now - 7200
    rec.jobs["math-east-l4-xbb"]["last_recovered_at"] = now - 600
    rec.jobs["math-east-l4-od-xcc"]["recovery_count"] = 0  # never preempted
    lost, since = be.preemptions(spot, now - 9000)  # reads its own clock, after `now`
    assert lost == 1 and 600 <= since <= 600 + time.time() - now
    lost, since = be.preemptions(od, now - 9000)
    assert lost == 0 and 9000 <= since <= 9000 + time.time() - now  # the run's age
    from astraflow.policies import CostAware
    from astraflow.scale import Autoscaler

    scaler = Autoscaler(_run_folder(tmp_path), CostAware(), be, [spot, od], started=now - 9000)
    # observe() reads its own clock: allow exactly the time that passed since `now`, so
    # a loaded machine cannot fail it.
    st = scaler.observe().pool("east-l4")
    assert st.preemptions_1h == 1 and 600 <= st.since_preemption_s <= 600 + time.time() - now
    since_od = scaler.observe().pool("east-l4-od").since_preemption_s
    assert 9000 <= since_od <= 9000 + time.time() - now
    rec.jobs["math-east-l4-xbb"]["last_recovered_at"] = now - 5400
    st = scaler.observe().pool("east-l4")
    assert st.preemptions_1h == 0 and CostAware().can_grow(st)  # quiet for 90 min: grows
    be.retire(spot, be.live(spot)[:1])
    assert ("cancel", "math-east-l4-xaa") in rec.calls
    assert [w.handle for w in be.live(spot)] == ["math-east-l4-xbb"]
    with pytest.raises(ValueError, match="worker id"):
        be.job(spot, "east-l4-A_B")


def test_cloud_pools_from_a_flow_and_a_price_csv():
    from astraflow.config.loader import parse_flow
    from astraflow.scale.pools import cloud_pools

    repo = Path(__file__).resolve().parents[1]
    data = yaml.safe_load((repo / "examples" / "cloud.yaml").read_text())
    data["launch"]["rollout"] = [{"name": "east", "backend": "sky", "workers": 1,
                                  "accelerators": ["L4:1"], "cold_start_s": 900,
                                  "infra": ["aws/us-east-1", "aws/us-west-2"]}]
    pools = cloud_pools(parse_flow(data), "sky", prices=FIX / "prices_small.csv")
    assert {p.cold_start_s for p in pools} == {900.0}  # the flow's: lead time, refusal wait
    assert {(p.name, p.spot, round(p.price_per_hour, 4)) for p in pools} == {
        ("east-l4-us-east-1", True, 0.3653), ("east-l4-us-east-1-od", False, 0.8048),
        ("east-l4-us-west-2", True, 0.425), ("east-l4-us-west-2-od", False, 0.8048)}
    data["launch"]["rollout"][0]["accelerators"] = ["H100:1"]
    with pytest.raises(ValueError, match="no spot price for aws us-east-1 H100"):
        cloud_pools(parse_flow(data), "sky", prices=FIX / "prices_small.csv")


# -- a real local run ---------------------------------------------------------------------

# Mechanics, not learning: a tiny model, no warm start, and a modelled 1.5 s env wait per
# batch, so one worker cannot keep the trainer busy (the trainer waits) while the waiting
# workers cost this loaded machine almost no CPU.
FLOW = {
    "name": "scaled",
    "policies": [{"name": "solver",
                  "model": {"hidden_size": 64, "layers": 2, "heads": 2, "intermediate_size": 128},
                  "warm_start": {"max_steps": 0}, "algorithm": {"publish_every": 2}}],
    "env": {"digits": 2, "eval_size": 20, "turn_latency_ms": 1500},
    "rollout": {"workers": 1, "prompts_per_batch": 4, "samples_per_prompt": 4,
                "max_backlog_batches": 4},
    "stages": [{"name": "staleness", "params": {"max_versions": 8}},
               {"name": "group_advantages"}],
    "stop": {"max_steps": 100000, "max_minutes": 6, "eval_every_s": 60, "live_eval_size": 10},
}


def _scale_rows(run_dir: Path) -> list[dict]:
    from astraflow.context import RunContext

    rows = RunContext.open(run_dir).ledger().read_metrics(since=0.0).to_pylist()
    return sorted((r for r in rows if r["component"] == "scale"), key=lambda r: r["time"])


def _start_scaler(run_dir: Path, log: Path) -> subprocess.Popen:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "astraflow", "scale", str(run_dir), "--policy", "deadband",
             "--policy-config", "{high: 0.3, low: 0.1, min_workers: 0}",
             "--max-workers", "2", "--interval", "2", "--window", "8", "--worker-minutes", "5"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.slow
def test_autoscaler_grows_and_shrinks_a_real_local_run(tmp_path):
    flow = tmp_path / "scaled.yaml"
    flow.write_text(yaml.safe_dump(FLOW))
    run_dir = tmp_path / "runs" / "scaled"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "astraflow", "run", str(flow), "--runs", str(tmp_path / "runs")],
        stdout=(tmp_path / "run.log").open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True)
    scaler = None
    try:
        def trainer_pid() -> int | None:
            try:
                state = json.loads((run_dir / "components.json").read_text())
            except (OSError, json.JSONDecodeError):
                return None
            return state.get("trainer-solver", {}).get("pid")

        assert _until(lambda: (run_dir / "store" / "_progress" / "solver.json").exists(), 150,
                      1.0), (tmp_path / "run.log").read_text()
        say("run started")
        scaler = _start_scaler(run_dir, tmp_path / "scale.log")
        # 1. The trainer waits on one slow worker: the dead band adds workers.
        grew = _until(lambda: [r for r in _scale_rows(run_dir)
                               if r["name"] == "live" and r["value"] >= 1], 120, 1.0)
        assert grew, (tmp_path / "scale.log").read_text()
        say("grew")
        # 2. Kill the autoscaler: its workers keep running; a new one finds them.
        os.killpg(scaler.pid, signal.SIGKILL)
        scaler.wait(10)
        state = json.loads((run_dir / "scale" / "local.json").read_text())
        pids = [v["pid"] for v in state.values()]
        assert pids and all(Path(f"/proc/{p}").exists() for p in pids)
        n_before = len(state)
        t_restart = time.time()
        scaler = _start_scaler(run_dir, tmp_path / "scale.log")
        first = _until(lambda: [r for r in _scale_rows(run_dir)
                                if r["name"] == "live" and r["time"] > t_restart], 90, 1.0)
        assert first and first[0]["value"] == n_before  # carried on with the same workers
        say("restarted")
        assert len(json.loads((run_dir / "scale" / "local.json").read_text())) <= 2
        # 3. Hold the trainer (a slow or preempted trainer): the backlog grows past the
        #    dead band's bound and the autoscaler retires its workers.
        say(f"phase 3: holding the trainer ({n_before} autoscaled workers)")
        t_stop, shrank = time.time(), []
        for _ in range(4):  # a trainer stopped while holding the table's commit lock holds
            tpid = trainer_pid()  # the writers too: let it go and stop it again
            os.kill(tpid, signal.SIGSTOP)
            try:
                shrank = _until(lambda: [r for r in _scale_rows(run_dir)
                                         if r["name"] == "target" and r["time"] > t_stop
                                         and r["value"] < n_before], 40, 1.0)
            finally:
                os.kill(tpid, signal.SIGCONT)
            if shrank:
                break
            time.sleep(2)
        if not shrank:
            os.kill(scaler.pid, signal.SIGUSR1)  # its stacks into the log
            time.sleep(1)
        assert shrank, (tmp_path / "scale.log").read_text()
        say("shrank")
        # The retired workers finish their batch and exit cleanly (the trainer runs again,
        # so the dead band may well add new ones meanwhile: follow the retired ids).
        import re

        gone = re.findall(r"retiring local worker (\S+)", (tmp_path / "scale.log").read_text())
        assert gone, (tmp_path / "scale.log").read_text()
        assert _until(lambda: not set(gone) & set(json.loads(
            (run_dir / "scale" / "local.json").read_text())), 90, 1.0)
        for wid in gone:
            log = (run_dir / "logs" / f"rollout-{wid}.log").read_text()
            assert "Traceback" not in log, log
        say("retired")
    finally:
        if scaler is not None and scaler.poll() is None:
            os.killpg(scaler.pid, signal.SIGTERM)
            scaler.wait(30)
        for v in json.loads((run_dir / "scale" / "local.json").read_text()).values() \
                if (run_dir / "scale" / "local.json").exists() else []:
            try:
                os.kill(v["pid"], signal.SIGTERM)
            except ProcessLookupError:
                pass
        launcher.send_signal(signal.SIGTERM)  # stop the run: evaluate, summary
        launcher.wait(240)
    # Nothing lost, nothing twice, with workers added and retired mid-run.
    r = subprocess.run([sys.executable, "-m", "astraflow", "audit", str(run_dir)],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    # The autoscaled workers' rows are in the table, and the plot is drawn from the metrics.
    from astraflow.context import RunContext
    from astraflow.scale import plot_scale
    from astraflow.stores import _lance

    ctx = RunContext.open(run_dir)
    workers = set(_lance.latest_dataset(ctx.trajectories().table("solver"))
                  .to_table(columns=["worker"]).column("worker").to_pylist())
    assert any(w.startswith("local-") for w in workers), workers
    plot_scale(ctx, run_dir / "scale.png")
    assert (run_dir / "scale.png").stat().st_size > 5000


def _run_folder(tmp_path: Path):
    from astraflow.config.loader import parse_flow
    from astraflow.local.launcher import prepare_run

    return prepare_run(parse_flow({**FLOW, "stop": {**FLOW["stop"], "max_steps": 10}}),
                       tmp_path / "runs")


def test_autoscaler_observes_the_store_and_acts(tmp_path):
    """One tick against a store holding trainer metrics and a progress file: the observation
    (wait share, demand, backlog), the dead band's decision, the `scale` metrics row; then a
    second autoscaler (the first one killed) finds the worker the first one started."""
    from astraflow.policies import DeadBand
    from astraflow.scale import Autoscaler, local_pool
    from astraflow.scale.backends import LocalBackend
    from astraflow.stores import Progress

    ctx = _run_folder(tmp_path)
    led = ctx.ledger()
    for step in range(3):  # each step waited 3 s for rows and trained 1 s on 16 rows
        led.log("trainer", "solver", step, {"trainer_wait_s": 3.0, "step_time_s": 1.0,
                                            "rows_read": 16})
    led.write_progress(Progress("solver", step=2, cursor=0, rows_consumed=0, weight_version=1,
                                time=time.time()))
    fake = (sys.executable, str(FIX / "fake_worker.py"))
    pool = local_pool(max_workers=2)
    scaler = Autoscaler(ctx, DeadBand(high=0.3, min_workers=0), LocalBackend(ctx.run_dir,
                        command=fake), [pool], window_s=60.0)
    obs = scaler.observe()
    [tr] = obs.trainers
    assert 0.7 <= tr.wait_fraction <= 0.8  # 9 s of waiting in 12 s (plus the last few ms)
    assert tr.demand_rows_per_s == pytest.approx(16.0)  # rows per second of training
    assert tr.backlog_rows == 0 and tr.batch_rows == 16 and tr.steps_done == 3
    assert tr.max_backlog_rows == 4 * 16 and obs.pool("local").live == 0
    d = scaler.tick()
    assert d.targets == {"local": 1} and "add 1" in d.reason
    rows = [r for r in led.read_metrics(since=0.0).to_pylist() if r["component"] == "scale"]
    assert {r["name"]: r["value"] for r in rows} == {
        "target": 1.0, "live": 0.0, "wait_fraction": pytest.approx(d.wait_fraction),
        "backlog_rows": 0.0}
    try:
        again = Autoscaler(ctx, DeadBand(), LocalBackend(ctx.run_dir, command=fake), [pool])
        [w] = again.backend.live(pool)
        assert again.observe().pool("local").live == 1 and w.worker_id.startswith("local-")
        # Its rows reach the autoscaler as `worker_rows` metrics rows naming the worker.
        assert again.observe().pool("local").starting == 1  # no row yet
        led.log("worker", w.worker_id, 1, {"worker_rows": 16})
        led.log("worker", "another-worker", 1, {"worker_rows": 64})
        st = again.observe().pool("local")
        assert st.starting == 0 and st.rows_per_s and st.rows_per_s > 0
        assert again._rows_by_worker(time.time()) == {w.worker_id: 16, "another-worker": 64}
        assert not again.trainers_done()
        led.write_progress(Progress("solver", step=9, cursor=0, rows_consumed=0,
                                    weight_version=1, time=time.time()))
        assert again.trainers_done()  # stop.max_steps 10 reached: run() retires and returns
        assert again.run(echo=lambda _: None) == []
        assert _until(lambda: again.backend.live(pool) == [], 30)
    finally:
        for w in LocalBackend(ctx.run_dir).live(pool):
            os.kill(int(w.handle), signal.SIGKILL)


def test_a_launch_that_never_gives_a_row_is_a_refused_launch(tmp_path):
    """SkyPilot keeps a managed job with no capacity in STARTING and Modal queues a call:
    the autoscaler sees a worker that never gives a row. Past `refuse_after_s` it retires
    it and writes a `launch_refused` row, and every observation in the next hour (of this
    autoscaler or a restarted one) reports the refusal, so the cost policy grows
    elsewhere. A worker that gave rows before (now blocked, say) is left alone, and none
    is judged while the backlog is at its bound (backpressure also stops rows)."""
    from dataclasses import replace

    from astraflow.policies import CostAware, Plan, Policy
    from astraflow.scale import Autoscaler
    from astraflow.scale.backends import LocalBackend

    class Want(Policy):
        name = "want"
        targets = {"cheap": 1, "od": 1}

        def plan(self, obs):
            return Plan(dict(self.targets), "as told")

    ctx = _run_folder(tmp_path)
    led = ctx.ledger()
    fake = (sys.executable, str(FIX / "fake_worker.py"))
    cheap = Pool("cheap", backend="local", spot=True, price_per_hour=0.3, rows_per_s=5.0,
                 cold_start_s=60.0, max_workers=2)
    od = Pool("od", backend="local", price_per_hour=1.0, rows_per_s=5.0, cold_start_s=60.0,
              max_workers=2)
    be = LocalBackend(ctx.run_dir, command=fake)
    pol = Want()
    scaler = Autoscaler(ctx, pol, be, [cheap, od], window_s=0.5, refuse_after_s=1.5)
    assert Autoscaler(ctx, pol, be, [cheap]).refuse_after(cheap) == 600.0  # the floor
    assert Autoscaler(ctx, pol, be, [cheap], refuse_after_s=0).refuse_after(cheap) == float("inf")
    try:
        scaler.tick()
        [w_cheap], [w_od] = be.live(cheap), be.live(od)
        led.log("worker", w_od.worker_id, 1, {"worker_rows": 16})  # od gives rows
        assert _until(lambda: time.time() - w_cheap.started > 2.0, 10)
        obs = scaler.observe()
        assert obs.pool("cheap").starting == 1 and obs.pool("od").starting == 1  # window 0.5 s
        # At the backlog's bound nothing is judged: backpressure also keeps rows back.
        full = replace(obs, trainers=tuple(replace(t, backlog_rows=t.max_backlog_rows)
                                           for t in obs.trainers))
        assert scaler.refuse_stuck(full) == {}
        d = scaler.tick()
        # Retired: SIGTERM, and the worker finished as a real one finishes its batch.
        assert _until(lambda: (ctx.run_dir / f"{w_cheap.worker_id}.finished").exists(), 10)
        assert [w.worker_id for w in be.live(od)] == [w_od.worker_id]  # it gave rows once
        refused = led.read_metrics(since=0.0, names=["launch_refused"]).to_pylist()
        assert [(r["component"], r["policy"], r["value"]) for r in refused] == [
            ("scale", "cheap", 1.0)]
        assert "as told" in d.reason
        assert scaler.observe().pool("cheap").launch_failures_1h == 1
        # A restarted autoscaler finds the refusal in the store: the cost policy holds
        # the pool back for the hour and grows elsewhere.
        again = Autoscaler(ctx, CostAware(), LocalBackend(ctx.run_dir, command=fake),
                           [cheap, od], window_s=0.5, refuse_after_s=1.5)
        st = again.observe().pool("cheap")
        assert st.launch_failures_1h == 1 and st.quiet_s is None  # no preemption clock
        assert not CostAware().can_grow(st)
        again.backend.preemptions = lambda pool, started: (0, 5000.0)  # a backend with one
        st = again.observe().pool("cheap")
        assert st.quiet_s is not None and st.quiet_s < 60.0
        assert again.observe().pool("od").launch_failures_1h == 0
    finally:
        for pool in (cheap, od):
            for w in LocalBackend(ctx.run_dir).live(pool):
                os.kill(int(w.handle), signal.SIGKILL)


def test_the_scaling_guide_snippet_simulates_and_its_policy_scales(tmp_path, monkeypatch):
    """Issue 13's point 4 as a user meets it: the scaling guide's Python block (a custom policy,
    simulated on a scenario) runs as written, with a trace file of that name; saved as
    mymodule.py, its policy is what `PYTHONPATH=. astraflow scale RUN --policy
    mymodule:Greedy` (the guide's command, through the installed console script) loads,
    and an autoscaler under it launches a worker. Without PYTHONPATH the error says so."""
    import contextlib
    import io
    import re
    import shutil

    from astraflow.registry import make_policy
    from astraflow.scale import Autoscaler, local_pool
    from astraflow.scale.backends import LocalBackend
    from astraflow.stores import Progress

    guide = (Path(__file__).resolve().parents[1] / "docs" / "scaling.md").read_text()
    section = guide[guide.index("# Cost-aware scaling"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    [cmd] = [ln for ln in section.split("```bash", 1)[1].split("```", 1)[0].splitlines()
             if "mymodule:Greedy" in ln]
    assert cmd.startswith("PYTHONPATH=. astraflow scale ")
    trace = re.search(r'load_trace\("([^"]+)"\)', code).group(1)
    shutil.copy(FIX / "trace_small.json", tmp_path / trace)
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme_snippet"})
    assert float(out.getvalue().strip()) > 0  # the rollout dollars of the simulated run
    (tmp_path / "mymodule.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    pol = make_policy("mymodule:Greedy")
    ctx = _run_folder(tmp_path)
    ctx.ledger().log("trainer", "solver", 0, {"trainer_wait_s": 3.0, "step_time_s": 1.0,
                                              "rows_read": 16})
    fake = (sys.executable, str(FIX / "fake_worker.py"))
    pool = local_pool(max_workers=2)
    try:
        d = Autoscaler(ctx, pol, LocalBackend(ctx.run_dir, command=fake), [pool],
                       window_s=60.0).tick()
        assert d.targets == {"local": 1} and d.reason.startswith("wait ")
        assert len(LocalBackend(ctx.run_dir).live(pool)) == 1
    finally:
        for w in LocalBackend(ctx.run_dir).live(pool):
            os.kill(int(w.handle), signal.SIGKILL)
    # The README's command, by the console script, on a run whose trainer is done: it
    # loads the policy and stops at once ("every trainer reached stop.max_steps").
    ctx.ledger().write_progress(Progress("solver", step=9, cursor=0, rows_consumed=0,
                                         weight_version=1, time=time.time()))
    exe = shutil.which("astraflow")
    assert exe, "the astraflow console script is not installed"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    args = [exe, "scale", str(ctx.run_dir), "--policy", "mymodule:Greedy", "--minutes", "1"]
    r = subprocess.run(args, cwd=tmp_path, env={**env, "PYTHONPATH": "."},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "every trainer reached stop.max_steps" in r.stdout, r.stderr
    r = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "PYTHONPATH=." in r.stdout + r.stderr


def test_scale_cli_refuses_bad_arguments(tmp_path):
    from typer.testing import CliRunner

    from astraflow.cli.app import app

    ctx = _run_folder(tmp_path)
    r = CliRunner().invoke(app, ["scale", str(ctx.run_dir), "--backend", "nope"])
    assert r.exit_code == 2 and "local, modal or sky" in r.output
    r = CliRunner().invoke(app, ["scale", str(ctx.run_dir), "--policy", "nope"])
    assert r.exit_code == 2 and "no built-in scaling policy" in r.output
    r = CliRunner().invoke(app, ["scale", str(ctx.run_dir), "--backend", "sky"])
    assert r.exit_code == 2 and "no sky pool" in r.output  # the flow has no launch: section
    r = CliRunner().invoke(app, ["scale", str(ctx.run_dir), "--refuse-after", "-1"])
    assert r.exit_code == 2 and "--refuse-after must be >= 0" in r.output


def test_a_real_worker_reports_its_rows_to_the_autoscaler(tmp_path, tiny_policy_dir):
    """The rollout worker logs `worker_rows` with its id; the autoscaler counts a worker's
    rows from those metrics (not by scanning the trajectory tables)."""
    from astraflow.policies import Fixed
    from astraflow.rollout.worker import RolloutWorker
    from astraflow.scale import Autoscaler, local_pool
    from astraflow.scale.backends import LocalBackend
    from tests.runs import seeded_run, worker_flow

    ctx = seeded_run(tmp_path / "run", worker_flow(max_backlog_batches=4), tiny_policy_dir,
                     versions=1)
    w = RolloutWorker(ctx, "local-pool-abc")
    assert w.refresh_weights()
    assert w.produce_batch() == 6 and w.produce_batch() == 6
    scaler = Autoscaler(ctx, Fixed(1), LocalBackend(ctx.run_dir), [local_pool()], window_s=60.0)
    assert scaler._rows_by_worker(time.time()) == {"local-pool-abc": 12}
    assert scaler._rows_by_worker(time.time() + 120) == {}  # out of the window
