"""apps/rollout.py, offline: the deployed shape of the Modal app, and its rollout body
run for real through Modal's own `.local()` against a local run folder.

What a deploy would send is read from what modal 1.6 exposes before any network
call: `Function.info()` (public) holds the GPU list, timeouts, retry count, secret
names and container settings of the class. The image's Dockerfile commands and
the files its COPY layers upload are not public before a build: they are read
from the image's private layer closures (`image_layers` below). If a modal
upgrade moves them, that test fails loudly rather than passing on constants
alone. Building the image, pulling a GPU and deploying need a Modal token and
its cloud, which tests do not have.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
import zipfile
from pathlib import Path

import modal
import pytest

from astraflow.config.loader import parse_flow
from astraflow.context import RESOLVED, RunContext

REPO = Path(__file__).resolve().parents[1]
APP_FILE = REPO / "apps" / "rollout.py"


def load_app():
    """Import apps/rollout.py by path (apps/ is deploy files, not a package)."""
    spec = importlib.util.spec_from_file_location("astraflow_modal_rollout", APP_FILE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # modal resolves the class's module through sys.modules
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def app_mod():
    return load_app()


@pytest.fixture(scope="module")
def info(app_mod):
    # Function.info() answers from the local definition without a network call
    # while the function is not hydrated (no `modal run`/`deploy` in tests).
    return app_mod.Rollout().run.info()


# -- the deployed shape ----------------------------------------------------------

def test_names_the_launcher_looks_up(app_mod, info):
    # modal.Cls.from_name("astraflow-rollout", "Rollout")().run.spawn(...)
    assert app_mod.APP_NAME == app_mod.app.name == "astraflow-rollout"
    assert isinstance(app_mod.Rollout, modal.Cls) and app_mod.CLASS_NAME == "Rollout"
    assert info.method_names == ["run"]
    # Importing the app for `modal deploy` must not need torch on the launcher.
    code = (f"import importlib.util, sys; s = importlib.util.spec_from_file_location('a', "
            f"{str(APP_FILE)!r}); m = importlib.util.module_from_spec(s); sys.modules['a'] = m; "
            f"s.loader.exec_module(m); assert 'torch' not in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_gpu_fallbacks_retries_timeouts_secret(app_mod, info):
    assert info.gpus == [("L40S", 1), ("A100-40GB", 1), ("A10G", 1), ("L4", 1)]
    assert [g for g, _ in info.gpus] == app_mod.GPU_FALLBACKS
    assert info.max_retries == 3
    r = app_mod.RETRIES  # backoff is not in FunctionInfo: the Retries object given to app.cls
    assert r.backoff_coefficient > 1 and r.initial_delay.total_seconds() >= 1
    # The function timeout covers the longest bounded run plus a margin for the
    # batch in flight at the deadline; startup has its own limit.
    assert info.timeout == app_mod.TIMEOUT_S >= app_mod.MAX_MINUTES * 60 + 5 * 60
    assert info.timeout <= 24 * 3600  # Modal's ceiling
    assert info.startup_timeout == app_mod.STARTUP_TIMEOUT_S
    assert info.secrets == ["modal.Secret.from_name('astraflow-store')"]
    assert info.single_use_containers and not info.nonpreemptible


def image_layers(image: modal.Image) -> list[tuple[list[str], list[str]]]:
    """(Dockerfile commands, remote paths of the files it COPYs) per layer, base first.

    Private modal 1.6 internals: every Image method returns a lazy `_Image` whose
    loader closes over `base_images`, `dockerfile_function` and
    `context_mount_function`; nothing public lists them before a build.
    """
    from modal._utils.async_utils import synchronizer

    def walk(raw) -> list[tuple[list[str], list[str]]]:
        cells = dict(zip(raw._load.__code__.co_freevars,
                         (c.cell_contents for c in raw._load.__closure__ or ()), strict=True))
        out = []
        for base in cells["base_images"].values():
            out += walk(base)
        version = "2026.10"
        commands = cells["dockerfile_function"](version).commands if cells["dockerfile_function"] else []
        files = []
        if cells["context_mount_function"]:
            for entry in cells["context_mount_function"](version)._entries:
                files += [str(remote) for _, remote in entry.get_files_to_upload()]
        out.append((commands, files))
        return out

    return walk(synchronizer._translate_in(image))


def test_image_pins_vllm_and_installs_the_project(app_mod):
    layers = image_layers(app_mod.image)
    runs = [c for cmds, _ in layers for c in cmds if c.startswith("RUN ")]
    # Pinned dependencies first (uv), vllm and the torch it was built against.
    uv = next(c for c in runs if "/uv pip install" in c)
    assert f"vllm=={app_mod.VLLM_VERSION}" in uv and f"torch=={app_mod.TORCH_VERSION}" in uv
    assert all(p in uv for p in app_mod.PINNED)
    assert all("==" in p for p in app_mod.PINNED)
    assert any(f"uv:{app_mod.UV_VERSION} " in c for cmds, _ in layers for c in cmds)
    # Then the source is copied in and installed with the vllm extra, after the
    # dependency layer (so a source edit does not rebuild it).
    copied = [f for _, files in layers for f in files]
    install = next(i for i, (cmds, _) in enumerate(layers)
                   if any("pip install" in c and "/opt/astraflow[vllm]" in c for c in cmds))
    last_copy = max(i for i, (_, files) in enumerate(layers) if files)
    uv_layer = next(i for i, (cmds, _) in enumerate(layers) if uv in cmds)
    assert uv_layer < last_copy < install
    for pin in app_mod.PINNED:  # the project install holds the same pins
        assert f"'{pin}'" in layers[install][0][-1]
    assert "/opt/astraflow/pyproject.toml" in copied
    assert "/opt/astraflow/astraflow/rollout/worker.py" in copied
    assert "/opt/astraflow/stores/weights.py" in copied
    assert not [f for f in copied if "__pycache__" in f or f.endswith(".pyc")]
    assert not [f for f in copied if "/tests/" in f or "/runs/" in f or "/.venv" in f]


def test_image_source_is_what_pyproject_installs(app_mod, tmp_path):
    """Every top-level folder pyproject.toml packages is copied, and the copied files
    alone build a wheel holding astraflow, astraflow.stores and astraflow.policies."""
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {cfg["package-dir"].get(p, p.replace(".", "/")).split("/")[0]
               for p in cfg["packages"]}
    assert folders == set(app_mod.SOURCE_DIRS)
    assert cfg.get("readme", "README.md") and "README.md" in app_mod.SOURCE_FILES

    src = tmp_path / "src"
    for _, files in image_layers(app_mod.image):
        for remote in files:
            rel = Path(remote).relative_to(app_mod.REMOTE_SOURCE)
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / rel, src / rel)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-q", "-w", str(tmp_path / "dist"), str(src)],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = (tmp_path / "dist").glob("astraflow-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for mod in ("astraflow/rollout/worker.py", "astraflow/stores/__init__.py",
                "astraflow/policies/__init__.py", "astraflow/cli/app.py"):
        assert mod in names, mod


def test_smoke_entrypoint_options():
    """`modal run apps/rollout.py --target s3://... --minutes 2` parses offline."""
    r = subprocess.run([sys.executable, "-m", "modal", "run", str(APP_FILE), "--help"],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "--target" in r.stdout and "--minutes FLOAT" in r.stdout
    assert "--worker-id" in r.stdout and "--region" in r.stdout


# -- the rollout body, through Modal's .local() ------------------------------------

def make_run(tmp_path: Path, policy_dir: Path, backlog_batches: int) -> Path:
    """A local run folder: resolved flow, weights v0 published (as test_worker does)."""
    flow = parse_flow({
        "name": "modal", "policies": [{"name": "solver", "model": {
            "hidden_size": 64, "layers": 2, "heads": 2, "intermediate_size": 128}}],
        "env": {"digits": 2, "eval_size": 20},
        "rollout": {"prompts_per_batch": 3, "samples_per_prompt": 2,
                    "max_backlog_batches": backlog_batches},
    })
    run = tmp_path / "run"
    run.mkdir()
    (run / RESOLVED).write_text(flow.dump())
    ws = RunContext(flow, run).weights()
    st = ws.staging_dir("solver")
    for f in policy_dir.iterdir():
        shutil.copy(f, st)
    assert ws.publish("solver", st, step=0) == 0
    return run


def rows_by(run: Path, worker: str) -> list[dict]:
    table = RunContext.open(run).trajectories().read_range("solver", 0, 10**9)
    return [r for r in table.to_pylist() if r["worker"] == worker]


def test_local_run_writes_rows(app_mod, tmp_path, tiny_policy_dir):
    run = make_run(tmp_path, tiny_policy_dir, backlog_batches=10)
    t0 = time.time()
    # The launcher's positional form (target, worker_id, minutes, region), plus the
    # CPU engine (no vllm here) and a batch bound to keep the test short.
    summary = app_mod.Rollout().run.local(str(run), "modal-w0", 0.5, None,
                                           engine="hf", max_batches=2)
    assert time.time() - t0 < 30
    assert summary["worker_id"] == "modal-w0" and summary["engine"] == "hf"
    assert summary["batches"] == 2 and summary["rows"] == 12  # 2 × 3 prompts × 2 samples
    assert summary["weight_versions"] == {"solver": [0]}
    assert summary["stopped_by"] == "max_batches" and summary["gpu"] is None
    rows = rows_by(run, "modal-w0")
    assert len(rows) == 12 and {r["behavior_version"] for r in rows} == {0}
    assert {r["region"] for r in rows} == {summary["region"]}


def test_deadline_bounds_a_worker_blocked_by_backpressure(app_mod, tmp_path, tiny_policy_dir,
                                                           monkeypatch):
    """With no trainer the backlog fills after one batch; the worker then waits for
    room, and `minutes` must end that wait too."""
    monkeypatch.setenv("MODAL_REGION", "us-east-1")  # what a Modal container has
    monkeypatch.delenv("ASTRAFLOW_REGION", raising=False)
    run = make_run(tmp_path, tiny_policy_dir, backlog_batches=1)
    t0 = time.time()
    summary = app_mod.run_worker(str(run), "modal-w1", 0.05, engine="hf")  # 3 s
    assert 3 <= time.time() - t0 < 20
    assert summary["stopped_by"] == "deadline" and summary["batches"] == 1
    assert summary["rows"] == 6 and summary["region"] == "us-east-1"
    assert len(rows_by(run, "modal-w1")) == 6


def test_sigterm_stops_cleanly_and_restores_handlers(app_mod, tmp_path, tiny_policy_dir):
    run = make_run(tmp_path, tiny_policy_dir, backlog_batches=1)
    before = signal.getsignal(signal.SIGTERM)

    def preempt():  # signal once the worker's handler is in place, as Modal would
        for _ in range(600):
            if signal.getsignal(signal.SIGTERM) is not before:
                time.sleep(0.5)
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.05)

    threading.Thread(target=preempt, daemon=True).start()
    t0 = time.time()
    summary = app_mod.Rollout().run.local(str(run), "modal-w2", 1.0, engine="hf")
    assert time.time() - t0 < 40  # well before the 60 s bound
    assert summary["stopped_by"] == "signal" and summary["rows"] == len(rows_by(run, "modal-w2"))
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("minutes", [0, -1, 10_000])
def test_minutes_outside_the_timeout_are_refused(app_mod, minutes):
    with pytest.raises(ValueError, match="minutes"):
        app_mod.run_worker("/nonexistent", "w", minutes)
