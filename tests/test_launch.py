"""`astraflow launch`: the launch plan of a flow, the CLI's dry run, and a launch against
a real S3 store with SkyPilot's and Modal's network calls replaced by recorders.

Offline throughout: `plan()` reads only the flow and the task files, the dry run
builds real `sky.Task`s (SkyPilot validates them), and the launch test publishes
to the moto S3 server and checks what SkyPilot and Modal would have been asked.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from astraflow.cli.app import app
from astraflow.cloud.jobs import LaunchError
from astraflow.cloud.launch import launch
from astraflow.cloud.plan import plan
from astraflow.cloud.skypilot import build_sky_task
from astraflow.config.loader import FlowError, load_flow, parse_flow

REPO = Path(__file__).resolve().parents[1]
CLOUD = REPO / "examples" / "cloud.yaml"
SECRET = "fake-secret-value-0123456789"
TOKEN = "fake-session-token-9876543210"
KEYS = {"AWS_ACCESS_KEY_ID": "AKIAFAKEFAKEFAKE", "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_SESSION_TOKEN": TOKEN}


def _cloud_data() -> dict:
    return yaml.safe_load(CLOUD.read_text())


def _two_policy_data() -> dict:
    data = yaml.safe_load((REPO / "examples" / "math-solver-verifier.yaml").read_text())
    data["store"] = {"uri": "s3://bucket/runs/sv"}
    data["launch"] = {"trainer": {"accelerators": ["A100:1"], "infra": ["aws", "gcp"],
                                  "spot": False, "max_restarts_on_errors": 5},
                      "rollout": [{"name": "m", "backend": "modal", "workers": 3,
                                   "accelerators": ["L4"]}]}
    return data


def test_import_and_plan_are_light():
    """`import astraflow.cloud.launch` and `plan()` load neither SkyPilot, Modal nor torch."""
    import subprocess
    import sys

    code = ("import sys; from astraflow.config.loader import load_flow; from astraflow.cloud.launch import launch; from astraflow.cloud.plan import plan; "
            f"plan(load_flow({str(CLOUD)!r})); "
            "print([m for m in ('sky', 'modal', 'torch', 'lancedb') if m in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_plan_of_the_example():
    p = plan(load_flow(CLOUD), launch_id="t0", environ={})
    store = "s3://my-astraflow-bucket/runs/math-cloud"
    assert p.store == store
    # One trainer job per policy, running one astraflow command against the store.
    [t] = p.trainers
    assert t.name == "math-cloud-train-solver" and t.num_jobs == 1
    assert t.envs == {"ASTRAFLOW_STORE": store, "POLICY": "solver"}
    assert t.command == f"astraflow train {store} --policy solver"
    assert t.use_spot and t.job_recovery["strategy"] == "EAGER_NEXT_REGION"
    # The tiny policy trains on CPU: a CPU VM, no GPU rented.
    assert t.any_of == () and not t.gpus and dict(t.node_resources) == {"cpus": "8+"}
    assert t.num_nodes == 1
    # The sky pool: 4 managed jobs, every region × accelerator as an any_of placement.
    [pool] = p.pools
    assert pool.name == "math-cloud-east-west" and pool.num_jobs == 4 and pool.use_spot
    assert pool.envs == {"ASTRAFLOW_STORE": store, "ASTRAFLOW_POOL": "east-west",
                         "ASTRAFLOW_MINUTES": "60", "ASTRAFLOW_REGION": ""}
    assert {(e["infra"], e["accelerators"]) for e in pool.any_of} == {
        (r, a) for r in ("aws/us-east-1", "aws/us-west-2") for a in ("L4:1", "A10G:1")}
    # The modal pool: one spawn per worker, unique ids, the app's own GPU list.
    assert [c.kwargs for c in p.modal] == [
        {"target": store, "worker_id": f"serverless-t0-{i}", "minutes": 30.0, "region": None}
        for i in range(2)]
    assert all(c.app == "astraflow-rollout" and c.gpu is None for c in p.modal)
    assert p.published_flow().launch is None and p.flow.launch is not None


def _with_device(data: dict, device: str, monkeypatch) -> dict:
    """`trainer.device: DEVICE` in the flow where the trainer has that field (the
    distributed trainer's); before it, the one seam plan() reads it through."""
    from astraflow.config.components import TrainerSpec

    if "device" in TrainerSpec.model_fields:
        data.setdefault("trainer", {})["device"] = device
    else:
        monkeypatch.setattr("astraflow.cloud.plan.trainer_device", lambda flow: device)
    return data


def test_plan_of_two_policies(monkeypatch):
    data = _with_device(_two_policy_data(), "cuda", monkeypatch)
    p = plan(parse_flow(data), launch_id="x", environ={})
    assert [(t.name, t.envs["POLICY"]) for t in p.trainers] == [
        ("math-solver-verifier-train-solver", "solver"),
        ("math-solver-verifier-train-verifier", "verifier")]
    for t in p.trainers:
        assert t.command.endswith(f"--policy {t.envs['POLICY']}")
        assert not t.use_spot and t.job_recovery["max_restarts_on_errors"] == 5
        assert t.any_of == ({"infra": "aws", "accelerators": "A100:1"},
                            {"infra": "gcp", "accelerators": "A100:1"})
    assert not p.pools and [c.gpu for c in p.modal] == ["L4"] * 3
    assert len({c.kwargs["worker_id"] for c in p.modal}) == 3


def test_sky_pool_defaults_come_from_the_task_file():
    data = _cloud_data()
    data["launch"]["rollout"] = [{"name": "any", "backend": "sky", "workers": 2},
                                 {"name": "west", "backend": "sky", "infra": ["aws/us-west-2"],
                                  "region": "us-west-2"}]
    p = plan(parse_flow(data), environ={})
    file_any_of = yaml.safe_load((REPO / "sky" / "rollout.sky.yaml").read_text())["resources"]["any_of"]
    assert [dict(e) for e in p.pools[0].any_of] == file_any_of
    # Only infra given: each region with the file's accelerators; the region names a replica.
    assert {e["accelerators"] for e in p.pools[1].any_of} == {e["accelerators"] for e in file_any_of}
    assert {e["infra"] for e in p.pools[1].any_of} == {"aws/us-west-2"}
    assert p.pools[1].envs["ASTRAFLOW_REGION"] == "us-west-2"


def test_no_secret_value_in_plan_or_description(monkeypatch):
    for k, v in KEYS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_REGION", "eu-central-1")
    p = plan(load_flow(CLOUD))
    text = p.describe() + repr(p)
    for value in KEYS.values():
        assert value not in text
    for job in p.sky_jobs:
        # Names only; the session token is passed on because it is set.
        assert job.secrets == ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
        assert not set(KEYS) & set(job.envs)
        assert job.envs["AWS_REGION"] == "eu-central-1"  # not secret: the bucket's region
    # A task with the values keeps them as SkyPilot secrets (redacted), never as envs.
    pytest.importorskip("sky")
    task = build_sky_task(p.trainers[0], secrets=KEYS)
    assert set(task.secrets) == set(KEYS) and not set(KEYS) & set(task.envs)
    assert SECRET not in repr(task) and SECRET not in str(task.to_yaml_config(
        use_user_specified_yaml=True))


def test_tasks_from_a_checkout_upload_it_and_without_one_install_the_package(monkeypatch):
    """From a checkout the jobs' workdir is that checkout (its setup: pip install -e .);
    an installed astraflow has none to upload, so the task has no workdir and its setup
    installs ASTRAFLOW_PACKAGE: this version by default, or what the user names."""
    pytest.importorskip("sky")
    from importlib import metadata

    p = plan(load_flow(CLOUD), launch_id="t0", environ={})
    trainer, pool = p.trainers[0], p.pools[0]
    task = build_sky_task(trainer, environ={})
    assert task.workdir == str(REPO) and not task.envs.get("ASTRAFLOW_PACKAGE")
    assert not any("no source checkout" in n for n in p.notes)

    monkeypatch.setattr("astraflow.cloud.skypilot.checkout", lambda: None)
    monkeypatch.setattr("astraflow.cloud.plan.checkout", lambda: None)
    version = metadata.version("astraflow")
    for job, spec in ((trainer, f"astraflow=={version}"), (pool, f"astraflow[vllm]=={version}")):
        task = build_sky_task(job, environ={})
        assert task.workdir is None and task.envs["ASTRAFLOW_PACKAGE"] == spec
        assert 'uv pip install "${ASTRAFLOW_PACKAGE:?' in task.setup
    url = "https://example.com/astraflow-0.1.0-py3-none-any.whl"
    task = build_sky_task(pool, environ={"ASTRAFLOW_PACKAGE": url})
    assert task.envs["ASTRAFLOW_PACKAGE"] == url
    p = plan(load_flow(CLOUD), launch_id="t0", environ={})
    assert any(f"the VMs install astraflow=={version}" in n for n in p.notes), p.notes


def test_cli_dry_run_prints_the_plan(monkeypatch):
    pytest.importorskip("sky")
    for k, v in KEYS.items():
        monkeypatch.setenv(k, v)
    r = CliRunner().invoke(app, ["launch", str(CLOUD), "--dry-run"])
    assert r.exit_code == 0, r.output
    for needle in ("math-cloud-train-solver", "astraflow train s3://my-astraflow-bucket/runs/"
                   "math-cloud --policy solver", "pool east-west (sky): 4 managed job(s)",
                   "pool serverless (modal): 2 call(s)",
                   "dry run: 2 SkyPilot task(s) built and validated; nothing launched"):
        assert needle in r.output, r.output
    assert SECRET not in r.output and TOKEN not in r.output


@pytest.mark.parametrize("args, needle", [
    (["--set", "store.uri=runs/cloud-store"], "cannot be launched: its store is 'runs/cloud-store'"),
    (["--set", "store.uri=null"], "cannot be launched: it has no store.uri"),
    (["--set", "store.checkpoints=/tmp/ckpt"], "store.checkpoints is a local path"),
    (["--set", "launch.rollout.1.region=eu-north-1"], "region 'eu-north-1' names no weight replica"),
    (["--set", "launch.rollout.1.minutes=180"], "a Modal worker runs at most 120 minutes"),
])
def test_cli_refuses_what_cannot_run_on_the_cloud(args, needle):
    r = CliRunner().invoke(app, ["launch", str(CLOUD), "--dry-run", *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output


def test_modal_limit_matches_the_app():
    """The app's timeout and the planner's limit are one number (the app is not importable
    without modal, so read its constant from the source)."""
    import re

    from astraflow.cloud.jobs import MODAL_CLASS, MODAL_MAX_MINUTES

    source = (REPO / "apps" / "rollout.py").read_text()
    assert float(re.search(r"^MAX_MINUTES = ([0-9.]+)", source, re.M).group(1)) == MODAL_MAX_MINUTES
    assert re.search(r'^APP_NAME = "astraflow-rollout"', source, re.M)
    assert re.search(rf'^CLASS_NAME = "{MODAL_CLASS}"', source, re.M)
    assert re.search(r"def run\(self, target: str, worker_id: str, minutes: float, region:", source)


def test_cli_refuses_a_flow_without_launch_section():
    r = CliRunner().invoke(app, ["launch", str(REPO / "examples" / "math.yaml"), "--dry-run"])
    assert r.exit_code == 2 and "has no `launch:` section" in r.output, r.output


@pytest.mark.parametrize("change, needle", [
    (lambda d: d["launch"]["rollout"][1].update(infra=["aws"]), "`infra` applies to sky pools"),
    (lambda d: d["launch"]["rollout"][1].update(accelerators=["L4", "A10G"]), "at most one"),
    (lambda d: d["launch"]["rollout"].append(dict(d["launch"]["rollout"][0])), "must be unique"),
    (lambda d: d["launch"]["trainer"].update(accelerators=["H100 x1"]), "is not an accelerator"),
    (lambda d: d["launch"]["trainer"].update(accelerator=["H100:1"]), "did you mean 'accelerators'"),
    (lambda d: d["launch"]["rollout"][0].update(backend="ray"), "backend"),
    (lambda d: d["launch"]["rollout"][0].update(workers=0), "workers"),
])
def test_bad_launch_sections_are_refused(change, needle):
    data = copy.deepcopy(_cloud_data())
    change(data)
    with pytest.raises(FlowError, match=needle):
        parse_flow(data)


class _Recorder:
    """Stands in for SkyPilot's and Modal's network calls; records what they were asked."""

    def __init__(self, running: tuple[str, ...] = ()):
        self.calls: list[tuple] = []
        self.running = running

    # sky.jobs.launch / sky.stream_and_get / sky.jobs.queue_v2 / sky.get
    def jobs_launch(self, task, name=None, num_jobs=None, **_):
        self.calls.append(("sky.jobs.launch", name, num_jobs, task))
        return f"request-{name}"

    def stream_and_get(self, request):
        return [len(self.calls)], None

    def queue_v2(self, refresh, skip_finished=False, **_):
        return "queue-request"

    def get(self, request):
        if request == "cancel-request":
            return None
        return [{"job_name": n, "status": "RUNNING"} for n in self.running], 0, {}, 0

    # sky.jobs.cancel(name=) / modal.FunctionCall.from_id(id).cancel(): what `stop` asks
    def jobs_cancel(self, name=None, job_ids=None, all=False, **_):  # noqa: A002
        assert not job_ids and not all, "stop cancels by name only"
        self.calls.append(("sky.jobs.cancel", name))
        return "cancel-request"

    def function_call(self, call_id):
        rec = self

        class _FunctionCall:
            def cancel(self, terminate_containers=False):
                rec.calls.append(("modal.cancel", call_id))

        return _FunctionCall()

    # modal.Cls.from_name(app, cls).hydrate() / .with_options(gpu=) / ()  .run.spawn(**kw)
    def from_name(self, app_name, cls_name, **_):
        rec = self

        class _Call:
            def __init__(self, n):
                self.object_id = f"fc-{n}"

        class _Method:
            def __init__(self, gpu):
                self.gpu = gpu

            def spawn(self, **kwargs):
                rec.calls.append(("modal.spawn", app_name, cls_name, self.gpu, kwargs))
                return _Call(len(rec.calls))

        class _Instance:
            def __init__(self, gpu):
                self.run = _Method(gpu)

        class _Cls:
            def __init__(self, gpu=None):
                self.gpu = gpu

            def hydrate(self):
                rec.calls.append(("modal.hydrate", app_name, cls_name))
                return self

            def with_options(self, gpu=None, **_):
                return _Cls(gpu)

            def __call__(self):
                return _Instance(self.gpu)

        return _Cls()


@pytest.fixture
def recorder(monkeypatch):
    sky = pytest.importorskip("sky")
    modal = pytest.importorskip("modal")

    def install(running: tuple[str, ...] = ()) -> _Recorder:
        rec = _Recorder(running)
        monkeypatch.setattr(sky.jobs, "launch", rec.jobs_launch)
        monkeypatch.setattr(sky.jobs, "queue_v2", rec.queue_v2)
        monkeypatch.setattr(sky, "stream_and_get", rec.stream_and_get)
        monkeypatch.setattr(sky, "get", rec.get)
        monkeypatch.setattr(modal.Cls, "from_name", rec.from_name)
        monkeypatch.setattr(sky.jobs, "cancel", rec.jobs_cancel)
        monkeypatch.setattr(modal.FunctionCall, "from_id", rec.function_call)
        return rec

    return install


def test_launch_publishes_then_starts_every_component(s3_env, moto_server, recorder,
                                                      tmp_path):
    from astraflow.context import RunContext
    from tests.s3server import TEST_SECRET_KEY

    data = _cloud_data()
    data["store"] = {"uri": f"s3://{s3_env}/runs/math-cloud"}
    data["launch"]["rollout"][1]["accelerators"] = ["A10G"]
    flow = parse_flow(data)
    rec = recorder()
    out: list[str] = []
    done = launch(plan(flow, launch_id="t1"), echo=out.append)

    # The flow is in the bucket (without its launch section) and opens by the store URI.
    ctx = RunContext.open(flow.store.uri, runs_root=tmp_path)
    assert ctx.flow.launch is None and ctx.flow.name == "math-cloud"
    assert [d.kind for d in done] == ["publish", "trainer", "sky-pool", "modal", "modal"]
    # Modal is looked up before anything starts; SkyPilot gets real tasks with the keys
    # as secrets and the plan's name, envs, resources and job count.
    kinds = [c[0] for c in rec.calls]
    assert kinds == ["modal.hydrate", "sky.jobs.launch", "sky.jobs.launch", "modal.spawn",
                     "modal.spawn"]
    (_, tname, tnum, ttask), (_, pname, pnum, ptask) = rec.calls[1:3]
    assert (tname, tnum, pname, pnum) == ("math-cloud-train-solver", None,
                                          "math-cloud-east-west", 4)
    for task in (ttask, ptask):
        assert task.secrets["AWS_SECRET_ACCESS_KEY"].get_secret_value() == TEST_SECRET_KEY
        assert task.envs["ASTRAFLOW_STORE"] == flow.store.uri
        assert task.envs["AWS_ENDPOINT_URL"] == moto_server.endpoint  # not secret: passed on
        assert task.workdir == str(REPO) and all(r.use_spot for r in task.resources)
    assert ttask.envs["POLICY"] == "solver"
    assert {(str(r.infra.region), str(r.accelerators)) for r in ptask.resources} == {
        (reg, f"{{'{a}': 1}}") for reg in ("us-east-1", "us-west-2") for a in ("L4", "A10G")}
    spawns = [c for c in rec.calls if c[0] == "modal.spawn"]
    assert [(s[1], s[2], s[3], s[4]["worker_id"]) for s in spawns] == [
        ("astraflow-rollout", "Rollout", "A10G", f"serverless-t1-{i}") for i in range(2)]
    assert all(TEST_SECRET_KEY not in line for line in out)

    # Changing the pools and launching again is the same run: published flow unchanged.
    data["launch"]["rollout"] = data["launch"]["rollout"][:1]
    launch(plan(parse_flow(data)), echo=out.append)


def test_launch_refuses_before_starting_anything(s3_env, recorder, monkeypatch, tmp_path):
    data = _cloud_data()
    data["store"] = {"uri": f"s3://{s3_env}/runs/math-cloud"}
    p = plan(parse_flow(data))
    # A trainer of this flow is still running: a second one would share its store.
    rec = recorder(running=("math-cloud-train-solver",))
    with pytest.raises(LaunchError, match="already running"):
        launch(p, echo=lambda s: None)
    assert [c[0] for c in rec.calls] == ["modal.hydrate"]
    # The Modal app is not deployed: refused before publishing or launching.
    import modal

    rec = recorder()

    def not_deployed(app_name, cls_name, **_):
        cls = rec.from_name(app_name, cls_name)

        def hydrate():
            raise modal.exception.NotFoundError(f"App {app_name} not found")
        cls.hydrate = hydrate
        return cls

    monkeypatch.setattr(modal.Cls, "from_name", not_deployed)
    with pytest.raises(LaunchError, match=r"deploy it first \(modal deploy apps/rollout.py\)"):
        launch(p, echo=lambda s: None)
    assert rec.calls == []
    # No bucket keys in the environment: refused before publishing or launching.
    rec = recorder()
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(LaunchError, match="set AWS_SECRET_ACCESS_KEY"):
        launch(p, echo=lambda s: None)
    assert rec.calls == []
    from astraflow.context import RunContext

    with pytest.raises(FlowError):  # nothing was published
        RunContext.open(p.store, runs_root=tmp_path)


FIX = REPO / "tests" / "fixtures"


def test_trainer_resources_follow_what_the_trainer_can_use(monkeypatch):
    """GPUs only when asked for (launch.trainer.accelerators, or trainer.device: cuda);
    never for a CPU trainer; a CPU VM otherwise."""
    from astraflow.cloud.plan import trainer_resources

    def trainer(device: str, **launch_trainer) -> tuple[list[str], dict[str, str]]:
        data = _cloud_data()
        data["launch"]["trainer"] = launch_trainer
        with monkeypatch.context() as m:
            return trainer_resources(parse_flow(_with_device(data, device, m)))

    assert trainer("cpu") == ([], {"cpus": "8+"})
    assert trainer("auto") == ([], {"cpus": "8+"})  # auto on a CPU VM trains on CPU
    assert trainer("cuda")[0] == ["H100:1", "A100-80GB:1", "A100:1", "L40S:1"]
    assert trainer("cuda")[1] == {}  # the GPU instance's own CPUs
    assert trainer("auto", accelerators=["L4:1"]) == (["L4:1"], {})
    assert trainer("cpu", accelerators=[], cpus="16+", memory="64+") == (
        [], {"cpus": "16+", "memory": "64+"})
    assert trainer("cpu", instance_type="m6i.2xlarge") == ([], {"instance_type": "m6i.2xlarge"})
    with pytest.raises(LaunchError, match=r"GPUs would sit idle at GPU prices"):
        trainer("cpu", accelerators=["H100:1"])
    with pytest.raises(LaunchError, match="trainer.device is cuda but"):
        trainer("cuda", accelerators=[])
    # The shipped example rents no GPU for its CPU trainer.
    assert trainer_resources(load_flow(CLOUD)) == ([], {"cpus": "8+"})


def test_multi_node_trainer_plan_task_and_dry_run(monkeypatch):
    pytest.importorskip("sky")
    for k, v in KEYS.items():
        monkeypatch.setenv(k, v)
    data = _with_device(_cloud_data(), "cuda", monkeypatch)
    data["launch"]["trainer"] = {"accelerators": ["H100:8", "A100-80GB:8"], "nodes": 2,
                                 "infra": ["aws", "gcp"]}
    [t] = plan(parse_flow(data), environ={}).trainers
    assert t.num_nodes == 2 and t.gpus and t.node_resources == ()
    assert t.topology().startswith("2 node(s) x 8 GPU(s) = 16 rank(s): torchrun on each node")
    task = build_sky_task(t)
    assert task.num_nodes == 2
    assert {(str(r.cloud), str(r.accelerators)) for r in task.resources} == {
        (c, f"{{'{a}': 8}}") for c in ("AWS", "GCP") for a in ("H100", "A100-80GB")}
    assert all(r.cpus is None and r.use_spot for r in task.resources)  # no CPU-VM default
    # A CPU trainer on 3 nodes: the file's CPU VM, one process per node.
    data = _with_device(data, "cpu", monkeypatch)
    data["launch"]["trainer"] = {"accelerators": [], "nodes": 3, "cpus": "16+"}
    [t] = plan(parse_flow(data), environ={}).trainers
    task = build_sky_task(t)
    assert task.num_nodes == 3 and [r.cpus for r in task.resources] == ["16+"]
    assert not any(r.accelerators for r in task.resources)
    assert t.topology().startswith("3 node(s) x 1 process (CPU) = 3 rank(s): torchrun")
    # The dry run shows nodes and GPUs and builds the 2-node task.
    data = _with_device(data, "cuda", monkeypatch)
    data["launch"]["trainer"] = {"accelerators": ["H100:8"], "nodes": 2}
    monkeypatch.setattr("astraflow.cli.cloud.parse_sets", lambda sets: {})
    monkeypatch.setattr("astraflow.config.loader.load_flow", lambda path, overrides=None: parse_flow(data))
    monkeypatch.setenv("ASTRAFLOW_SKY_CATALOG", str(FIX / "skycat_launch"))
    r = CliRunner().invoke(app, ["launch", str(CLOUD), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "nodes:     2 node(s) x 8 GPU(s) = 16 rank(s)" in r.output, r.output
    assert "resources: spot, any of: H100:8" in r.output
    # 2 nodes of p5.48xlarge (8 x H100) at the fixture's spot price.
    assert "price:     ~$62.92/h = 2 node(s) x $31.46/h (cheapest: aws us-east-1 " \
           "p5.48xlarge H100:8, spot)" in r.output, r.output


def test_dry_run_prices_from_a_fixture_catalog(monkeypatch):
    """The plan prices each job from SkyPilot's catalog (a fixture in its vms.csv form):
    the cheapest placement among its `any_of`, times its jobs; Modal is not in it."""
    pytest.importorskip("sky")
    for k, v in KEYS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("ASTRAFLOW_SKY_CATALOG", str(FIX / "skycat_launch"))
    r = CliRunner().invoke(app, ["launch", str(CLOUD), "--dry-run"])
    assert r.exit_code == 0, r.output
    lines = [ln.strip() for ln in r.output.splitlines()]
    # The CPU trainer: cheapest 8+ vCPU spot VM of any cloud (GCP n2-standard-8 here).
    assert "price:     ~$0.09/h = $0.0943/h (cheapest: gcp us-central1 n2-standard-8, spot)" \
        in lines, r.output
    # The sky pool: 4 workers on the cheapest of L4/A10G in us-east-1/us-west-2.
    assert "price:     ~$1.46/h = 4 job(s) x $0.3653/h (cheapest: aws us-east-1 g6.xlarge " \
           "L4:1, spot)" in lines, r.output
    [total] = [ln for ln in lines if ln.startswith("estimated:")]
    assert total.startswith("estimated: ~$1.56/h while everything runs")
    assert "not included: Modal calls (billed by Modal)" in total
    # On-demand, and a CSV given by hand; no catalog at all: said so, still a dry run.
    r = CliRunner().invoke(app, ["launch", str(CLOUD), "--dry-run", "--set",
                                 "launch.trainer.spot=false", "--prices",
                                 str(FIX / "skycat_launch" / "aws" / "vms.csv")])
    assert "price:     ~$0.38/h = $0.384/h (cheapest: aws us-east-1 m6i.2xlarge, on-demand)" \
        in r.output, r.output
    monkeypatch.setenv("ASTRAFLOW_SKY_CATALOG", str(FIX / "missing"))
    r = CliRunner().invoke(app, ["launch", str(CLOUD), "--dry-run"])
    assert r.exit_code == 0 and "estimated: no price estimate (no SkyPilot price catalog" \
        in r.output, r.output


_NO_SKY = """
import sys
sys.modules["sky"] = None  # `import sky` fails as if SkyPilot were not installed
from astraflow.cli.app import app
app(sys.argv[1:], prog_name="astraflow")
"""


def test_dry_run_without_skypilot_exits_2():
    """Nothing validated is not a pass: the plan is printed, then exit 2 and why."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _NO_SKY, "launch", str(CLOUD), "--dry-run"],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "launch plan for flow 'math-cloud'" in r.stdout
    assert "dry run incomplete: SkyPilot is not installed" in r.stderr
    assert "pip install -e '.[launch]'" in r.stderr and "Traceback" not in r.stderr


def test_stop_cancels_what_the_launch_started(s3_env, recorder):
    """`astraflow stop STORE` cancels the run's live managed jobs by the names the launch
    used and its Modal calls by id (the launch's and the autoscaler's), nothing else."""
    from astraflow.stores.objects import ObjectStore

    data = _cloud_data()
    data["store"] = {"uri": f"s3://{s3_env}/runs/math-cloud"}
    store = data["store"]["uri"]
    rec = recorder()
    launch(plan(parse_flow(data), launch_id="s1"), echo=lambda s: None)
    fc_ids = [f"fc-{i}" for i, c in enumerate(rec.calls, 1) if c[0] == "modal.spawn"]
    assert len(fc_ids) == 2
    # An autoscaler's Modal worker of the same run; another run's job is running too.
    ObjectStore(store).put_bytes("_scale/modal.json", json.dumps(
        {"serverless-x1": {"call": "fc-scaled", "pool": "serverless", "started": 0}}).encode())
    # The trainer still runs, the sky pool's jobs have finished.
    rec = recorder(running=("math-cloud-train-solver", "other-run-train-solver"))
    r = CliRunner().invoke(app, ["stop", store, "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "would cancel 1 SkyPilot managed job(s) of " + store in r.output
    assert "(1 recorded one(s) already finished): math-cloud-train-solver" in r.output
    assert f"would cancel 3 Modal call(s): {', '.join(fc_ids)}, fc-scaled" in r.output
    assert not [c for c in rec.calls if c[0] in ("sky.jobs.cancel", "modal.cancel")]
    r = CliRunner().invoke(app, ["stop", store])
    assert r.exit_code == 0, r.output
    assert rec.calls == [("sky.jobs.cancel", "math-cloud-train-solver"),
                         *[("modal.cancel", c) for c in (*fc_ids, "fc-scaled")]]
    assert "cancelled managed job math-cloud-train-solver" in r.output
    # A run nothing was launched for: nothing to cancel, no cloud call at all.
    rec = recorder()
    r = CliRunner().invoke(app, ["stop", f"s3://{s3_env}/runs/never-launched"])
    assert r.exit_code == 0 and "cancelling 0 SkyPilot" in r.output and rec.calls == []
    # Jobs to cancel but no SkyPilot to cancel them with: exit 2 and why, not a quiet 0.
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _NO_SKY, "stop", store], capture_output=True,
                       text=True, timeout=120, cwd=REPO)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "this run has SkyPilot jobs to cancel but sky is not installed" in r.stderr
