"""Launch a flow on the cloud: one SkyPilot managed job per policy's trainer, and
rollout worker pools on SkyPilot (spot, across clouds and regions) or Modal.

Every component is started with the run's store URI and nothing else; the store
holds `flow.resolved.yaml`, so `launch` publishes the flow first and then starts
the components, which never talk to each other or to this process again.

    p = plan(load_flow("examples/cloud.yaml"))   # pure and offline: what would start
    print(p.describe())
    launch(p, dry_run=True)                      # also builds and checks the SkyPilot tasks
    launch(p)                                    # publish the flow, start everything

SkyPilot and Modal are imported only inside the functions that call them, so
`import astraflow.cloud.launch` stays cheap and `plan()` works without either.
Credentials never enter a plan: the task files declare them as SkyPilot secrets
(names only) and `launch` passes their values from this process's environment.
"""

from __future__ import annotations

import json
import os
import re
import secrets as _secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from astraflow.config.cloud import (
    DEFAULT_TRAINER_CPUS,
    DEFAULT_TRAINER_GPUS,
    RolloutPoolSpec,
    TrainerLaunchSpec,
)
from astraflow.config.flow import FlowSpec

if TYPE_CHECKING:
    from astraflow.policies.prices import Catalog

#: The SkyPilot task files (a checkout's `sky/`; `workdir` uploads that checkout).
REPO = Path(__file__).resolve().parents[2]
SKY_DIR = REPO / "sky"
TRAIN_TASK = SKY_DIR / "train.sky.yaml"
ROLLOUT_TASK = SKY_DIR / "rollout.sky.yaml"

#: Passed to SkyPilot jobs as secrets (redacted by SkyPilot); values from the environment.
REQUIRED_SECRETS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
OPTIONAL_SECRETS = ("AWS_SESSION_TOKEN",)
#: Not secret, but the workers need the same bucket region/endpoint as this machine.
PASSTHROUGH_ENVS = ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                    "AWS_ALLOW_HTTP")

MODAL_CLASS = "Rollout"
MODAL_METHOD = "run"
#: apps/rollout.py's MAX_MINUTES: its function timeout refuses longer workers.
MODAL_MAX_MINUTES = 120.0


class LaunchError(ValueError):
    """A flow cannot be launched as it is; the message says how to fix it."""


@dataclass(frozen=True)
class SkyJob:
    """One `sky jobs launch` of a task file: a policy's trainer, or a sky pool's workers
    (`num_jobs` jobs, each on its own VM)."""

    role: str
    """`trainer` or `rollout`."""
    name: str
    """Managed job name (`sky jobs queue`, `sky jobs cancel -n NAME`)."""
    task_file: Path
    num_jobs: int
    envs: dict[str, str]
    """Task envs (no secrets among them)."""
    secrets: tuple[str, ...]
    """Names of the secrets the job gets; values come from the environment at launch."""
    any_of: tuple[dict[str, str], ...]
    """SkyPilot `any_of` entries: {accelerators, infra?}."""
    use_spot: bool
    job_recovery: dict[str, Any]
    command: str
    """The astraflow command each job runs (for display; the task file's `run:` runs it)."""
    pool: str | None = None
    num_nodes: int = 1
    """VMs of one job (SkyPilot `num_nodes`): a multi-node trainer."""
    node_resources: tuple[tuple[str, str], ...] = ()
    """SkyPilot resources set on every node besides `any_of` (`cpus`, `memory`,
    `instance_type`); a job with GPUs drops the task file's CPU default."""

    @property
    def gpus(self) -> bool:
        return any(e.get("accelerators") for e in self.any_of)

    def resources(self) -> str:
        spot = "spot" if self.use_spot else "on-demand"
        node = ", ".join(f"{k} {v}" for k, v in self.node_resources)
        if not self.gpus:
            where = " | ".join(e["infra"] for e in self.any_of) or "any cloud"
            return f"{spot}, CPU VM ({node or 'the task file default'}), {where}"
        alts = " | ".join(f"{e['infra']} {e['accelerators']}" if e.get("infra") else
                          e["accelerators"] for e in self.any_of)
        return f"{spot}, any of: {alts}" + (f"; {node}" if node else "")

    def topology(self) -> str:
        """How many trainer processes start and how (the task file's `run:` decides the
        same from SkyPilot's environment)."""
        counts = sorted({_gpu_count(e["accelerators"]) for e in self.any_of
                         if e.get("accelerators")}) or [1]
        per_node = "/".join(str(c) for c in counts)
        ranks = "/".join(str(c * self.num_nodes) for c in counts)
        how = ("astraflow train alone" if self.num_nodes == 1 and counts == [1] else
               f"torchrun on each node, rendezvous at node 0 (--nnodes {self.num_nodes} "
               f"--nproc-per-node {per_node})")
        unit = "GPU(s)" if self.gpus else "process (CPU)"
        return f"{self.num_nodes} node(s) x {per_node} {unit} = {ranks} rank(s): {how}"


@dataclass(frozen=True)
class ModalCall:
    """One `Rollout().run.spawn(...)` of the deployed Modal app: one bounded worker."""

    pool: str
    app: str
    gpu: str | None
    """Replaces the app's GPU list for this call (None: the app's own list)."""
    kwargs: dict[str, Any]
    """target (store URI), worker_id, minutes, region."""

    def describe(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"{self.app}.{MODAL_CLASS}().{MODAL_METHOD}.spawn({args})"


@dataclass(frozen=True)
class LaunchPlan:
    """What `launch` would start for a flow; builds nothing and calls no cloud."""

    flow: FlowSpec
    store: str
    launch_id: str
    trainers: tuple[SkyJob, ...]
    pools: tuple[SkyJob, ...]
    modal: tuple[ModalCall, ...]
    notes: tuple[str, ...] = ()

    @property
    def sky_jobs(self) -> tuple[SkyJob, ...]:
        return self.trainers + self.pools

    def published_flow(self) -> FlowSpec:
        """The flow the components read: the launch section is placement, not part of the
        run, so changing pools between launches does not make it a different run."""
        return self.flow.model_copy(update={"launch": None})

    def describe(self, catalog: Catalog | None = None, *, no_prices: str = "") -> str:
        """The plan as text; with a price `catalog`, an hourly estimate per job and in all
        (astraflow.cloud.costs); without one, `no_prices` says why there is none."""
        from astraflow.cloud.costs import price_plan

        prices = price_plan(self, catalog) if catalog is not None else {}

        def price(j: SkyJob) -> list[str]:
            return [f"    price:     {prices[j.name].detail}"] if j.name in prices else []

        lines = [f"launch plan for flow {self.flow.name!r} (launch id {self.launch_id})",
                 f"  store:   {self.store}",
                 f"  publish: {self.store}/flow.resolved.yaml"]
        lines.append(f"trainers: {len(self.trainers)} SkyPilot managed job(s), "
                     f"{_rel(TRAIN_TASK)}")
        for j in self.trainers:
            lines += [f"  {j.name}", f"    resources: {j.resources()}",
                      f"    nodes:     {j.topology()}", *price(j),
                      f"    recovery:  {_recovery(j.job_recovery)}",
                      f"    run:       {j.command}", f"    envs:      {_envs(j.envs)}",
                      f"    secrets:   {', '.join(j.secrets)} (from your environment)"]
        n_sky = sum(j.num_jobs for j in self.pools)
        lines.append(f"rollout: {n_sky + len(self.modal)} worker(s) in "
                     f"{len(self.flow.launch.rollout) if self.flow.launch else 0} pool(s)")
        for j in self.pools:
            lines += [f"  pool {j.pool} (sky): {j.num_jobs} managed job(s) {j.name}, "
                      f"{_rel(j.task_file)}",
                      f"    resources: {j.resources()}", *price(j),
                      f"    recovery:  {_recovery(j.job_recovery)}",
                      f"    run:       {j.command}", f"    envs:      {_envs(j.envs)}",
                      f"    secrets:   {', '.join(j.secrets)} (from your environment)"]
        by_pool: dict[str, list[ModalCall]] = {}
        for c in self.modal:
            by_pool.setdefault(c.pool, []).append(c)
        for pool, calls in by_pool.items():
            gpu = calls[0].gpu or "the app's GPU list"
            lines.append(f"  pool {pool} (modal): {len(calls)} call(s) of app {calls[0].app!r}, "
                         f"gpu: {gpu}; credentials: the app's Modal Secret")
            lines += [f"    {c.describe()}" for c in calls]
        if catalog is not None:
            known = [p.per_hour for p in prices.values() if p.per_hour is not None]
            left = [n for n, p in prices.items() if p.per_hour is None]
            extra = [f"{len(left)} job(s) with no catalog price"] if left else []
            extra += ["Modal calls (billed by Modal)"] if self.modal else []
            lines.append(f"estimated: ~${sum(known):.2f}/h while everything runs, from "
                         f"{catalog.source}" + (f"; not included: {', '.join(extra)}"
                                                if extra else ""))
        elif no_prices:
            lines.append(f"estimated: no price estimate ({no_prices})")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


@dataclass(frozen=True)
class Launched:
    """What `launch` started (or, in a dry run, checked)."""

    kind: str
    """`publish`, `trainer`, `sky-pool` or `modal`."""
    name: str
    ids: tuple[str, ...] = ()
    """Managed job ids, Modal function call ids, or the published flow's location."""


def plan(flow: FlowSpec, *, launch_id: str | None = None,
         environ: Mapping[str, str] | None = None) -> LaunchPlan:
    """The jobs and calls that launch `flow`: pure and offline (reads the task files and
    the *names* of the credential variables set in `environ`, never their values)."""
    spec = flow.launch
    if spec is None:
        raise LaunchError(f"flow {flow.name!r} has no `launch:` section: add one naming the "
                          f"trainer's accelerators and the rollout pools (see examples/cloud.yaml)")
    store = flow.store.uri
    if not store or not store.startswith("s3://"):
        where = f"its store is {store!r}" if store else "it has no store.uri (a local default)"
        raise LaunchError(
            f"flow {flow.name!r} cannot be launched: {where}. Cloud components share the run "
            f"only through a bucket: set store.uri: s3://bucket/prefix (e.g. --set "
            f"store.uri=s3://my-bucket/runs/{flow.name}); for GCS, R2 or MinIO also set "
            f"AWS_ENDPOINT_URL")
    for key in ("weights", "checkpoints"):
        value = getattr(flow.store, key)
        if value and not value.startswith("s3://"):
            raise LaunchError(f"store.{key} is a local path ({value!r}), which cloud components "
                              f"cannot reach: drop it (default: {store}/{key}) or use s3://")
    replicas = {r.region: r for r in flow.store.replicas}
    for r in replicas.values():
        if not r.weights.startswith("s3://"):
            raise LaunchError(f"store.replicas: the {r.region!r} replica is a local path "
                              f"({r.weights!r}), which cloud workers cannot reach; use s3://")
    for pool in spec.rollout:
        if pool.backend == "modal" and pool.minutes > MODAL_MAX_MINUTES:
            raise LaunchError(f"launch.rollout pool {pool.name!r}: a Modal worker runs at most "
                              f"{MODAL_MAX_MINUTES:g} minutes (the app's timeout); use more "
                              f"launches or a sky pool for longer")
        if pool.region is not None and pool.region not in replicas:
            known = sorted(replicas) or "none declared"
            raise LaunchError(f"launch.rollout pool {pool.name!r}: region {pool.region!r} names no "
                              f"weight replica (store.replicas regions: {known}); drop `region` "
                              f"to read the primary store, or add a replica for it")
    for task in (TRAIN_TASK, ROLLOUT_TASK):
        if not task.exists():
            raise LaunchError(f"{task} is missing: launch from a checkout of the repository "
                              f"(SkyPilot uploads it as the jobs' workdir)")
    env = os.environ if environ is None else environ
    launch_id = launch_id or _secrets.token_hex(3)
    secret_names = REQUIRED_SECRETS + tuple(n for n in OPTIONAL_SECRETS if env.get(n))
    passthrough = {n: env[n] for n in PASSTHROUGH_ENVS if env.get(n)}
    notes: list[str] = []

    train_defaults = _task_resources(TRAIN_TASK)
    t = spec.trainer
    accelerators, node_resources = trainer_resources(flow)
    trainers = []
    for pol in flow.policy_names():
        trainers.append(SkyJob(
            role="trainer", name=_job_name(flow.name, "train", pol), task_file=TRAIN_TASK,
            num_jobs=1, envs={"ASTRAFLOW_STORE": store, "POLICY": pol, **passthrough},
            secrets=secret_names,
            any_of=tuple({"infra": i, "accelerators": a} if i else {"accelerators": a}
                         for i in (t.infra or [None]) for a in accelerators)
            if accelerators else tuple({"infra": i} for i in t.infra),
            use_spot=t.spot,
            job_recovery={**train_defaults.get("job_recovery", {}),
                          "max_restarts_on_errors": t.max_restarts_on_errors},
            command=f"astraflow train {store} --policy {pol}",
            num_nodes=t.nodes, node_resources=tuple(node_resources.items())))
    device = trainer_device(flow)
    if not accelerators:
        notes.append(f"the trainer runs on a CPU VM (trainer.device: {device}); GPUs are rented "
                     f"only when asked for: trainer.device: cuda, or launch.trainer.accelerators")

    rollout_defaults = _task_resources(ROLLOUT_TASK)
    pools: list[SkyJob] = []
    modal: list[ModalCall] = []
    for pool in spec.rollout:
        if pool.backend == "sky":
            pools.append(_sky_pool(flow, pool, store, secret_names, passthrough,
                                   rollout_defaults))
        else:
            modal += [ModalCall(pool=pool.name, app=spec.modal_app,
                                gpu=pool.accelerators[0] if pool.accelerators else None,
                                kwargs={"target": store,
                                        "worker_id": f"{pool.name}-{launch_id}-{i}",
                                        "minutes": pool.minutes, "region": pool.region})
                      for i in range(pool.workers)]
    if not spec.rollout:
        notes.append(f"no rollout pools: the trainers wait for trajectories until you start "
                     f"workers yourself (astraflow rollout {store} --worker-id ID)")
    if any(j.use_spot for j in trainers):
        notes.append("spot trainers resume from their newest checkpoint in the bucket after a "
                     "preemption; steps since that checkpoint are redone")
    return LaunchPlan(flow=flow, store=store, launch_id=launch_id, trainers=tuple(trainers),
                      pools=tuple(pools), modal=tuple(modal), notes=tuple(notes))


def trainer_device(flow: FlowSpec) -> str:
    """The device the flow's trainer trains on: its `trainer.device` (auto, cpu, cuda), or
    `cpu` where the trainer has no such field (a trainer that always trains on CPU)."""
    return str(getattr(flow.trainer, "device", "cpu"))


def trainer_resources(flow: FlowSpec) -> tuple[list[str], dict[str, str]]:
    """The trainer's GPUs (any one of them per node; empty: a CPU VM) and its other
    per-node resources, following what the trainer can use: GPUs only when the launch
    section names them or `trainer.device` is `cuda`, and never for a `cpu` trainer,
    which would leave them idle at GPU prices."""
    t = flow.launch.trainer if flow.launch else TrainerLaunchSpec()
    device = trainer_device(flow)
    if t.accelerators is not None:
        accelerators = list(t.accelerators)
    else:
        accelerators = list(DEFAULT_TRAINER_GPUS) if device == "cuda" else []
    if accelerators and device == "cpu":
        raise LaunchError(f"launch.trainer.accelerators asks for {', '.join(accelerators)} but "
                          f"the trainer trains on CPU (trainer.device: cpu): the GPUs would sit "
                          f"idle at GPU prices. Set trainer.device: cuda (or auto), or drop "
                          f"launch.trainer.accelerators for a CPU VM")
    if not accelerators and device == "cuda":
        raise LaunchError("trainer.device is cuda but launch.trainer.accelerators is empty: name "
                          "the GPUs (e.g. [H100:1]) or leave accelerators out for the default list")
    node: dict[str, str] = {}
    if t.instance_type:
        node["instance_type"] = t.instance_type
    if t.cpus:
        node["cpus"] = t.cpus
    elif not accelerators and not t.instance_type:
        node["cpus"] = DEFAULT_TRAINER_CPUS
    if t.memory:
        node["memory"] = t.memory
    return accelerators, node


def _gpu_count(accelerator: str) -> int:
    _, _, n = accelerator.partition(":")
    return max(1, int(float(n))) if n else 1


def _sky_pool(flow: FlowSpec, pool: RolloutPoolSpec, store: str, secret_names: tuple[str, ...],
              passthrough: dict[str, str], defaults: dict[str, Any]) -> SkyJob:
    region = pool.region or ""
    return SkyJob(
        role="rollout", name=_job_name(flow.name, pool.name), task_file=ROLLOUT_TASK,
        num_jobs=pool.workers,
        envs={"ASTRAFLOW_STORE": store, "ASTRAFLOW_POOL": pool.name,
              "ASTRAFLOW_MINUTES": _number(pool.minutes), "ASTRAFLOW_REGION": region,
              **passthrough},
        secrets=secret_names, any_of=_any_of(pool.accelerators, pool.infra, defaults),
        use_spot=pool.spot, job_recovery=dict(defaults.get("job_recovery", {})),
        command=(f"astraflow rollout {store} --worker-id {pool.name}-<job id>-0 "
                 f"--minutes {_number(pool.minutes)} --region {region or '<region of its VM>'}"),
        pool=pool.name)


def build_sky_task(job: SkyJob, *, secrets: Mapping[str, str] | None = None):
    """The `sky.Task` for `job`: its task file with the plan's name, resources and envs,
    validated by SkyPilot (offline). `secrets` are values for `job.secrets`; without them
    the secrets stay unresolved references (fine for checking, refused by a launch)."""
    import sky

    config = yaml.safe_load(job.task_file.read_text())
    config["name"] = job.name
    config["workdir"] = str(REPO)
    resources = dict(config.get("resources") or {})
    if job.gpus:  # the file's CPU VM (cpus: 8+) is for CPU trainers; GPUs bring their host
        resources.pop("cpus", None)
    resources.update(job.node_resources)
    resources.update(use_spot=job.use_spot, job_recovery=dict(job.job_recovery))
    if job.any_of or "any_of" in resources:
        resources["any_of"] = [dict(e) for e in job.any_of]
    if not resources.get("any_of"):
        resources.pop("any_of", None)
    config["resources"] = resources
    if job.num_nodes > 1 or "num_nodes" in config:
        config["num_nodes"] = job.num_nodes
    values = [(k, secrets[k]) for k in job.secrets if secrets and secrets.get(k)]
    return sky.Task.from_yaml_config(config, env_overrides=list(job.envs.items()),
                                     secrets_overrides=values or None)


def launch(p: LaunchPlan, *, dry_run: bool = False, overwrite: bool = False,
           environ: Mapping[str, str] | None = None,
           echo: Callable[[str], None] = print) -> list[Launched]:
    """Start what `p` describes: publish the flow to the store, then one managed job per
    trainer, the sky pools' jobs and the Modal calls. Every SkyPilot task is built and
    validated before anything starts. `dry_run`: build and validate only."""
    env = os.environ if environ is None else environ
    if p.sky_jobs:
        missing = [n for n in REQUIRED_SECRETS if not env.get(n)]
        if missing and not dry_run:
            raise LaunchError(f"set {' and '.join(missing)} in your environment: the cloud jobs "
                              f"read the bucket with them (passed as SkyPilot secrets, never "
                              f"written to a file)")
        names = {n for j in p.sky_jobs for n in j.secrets}
        values = None if dry_run else {n: env[n] for n in names if env.get(n)}
        tasks = [(job, build_sky_task(job, secrets=values)) for job in p.sky_jobs]
    else:
        tasks = []
    if dry_run:
        echo(f"dry run: {len(tasks)} SkyPilot task(s) built and validated; nothing launched")
        return [Launched("trainer" if j.role == "trainer" else "sky-pool", j.name)
                for j, _ in tasks]

    modal_cls = _modal_class(p) if p.modal else None
    running = _active_job_names() if p.trainers else set()
    twice = [j.name for j in p.trainers if j.name in running]
    if twice:
        raise LaunchError(f"trainer job(s) {twice} are already running: two trainers of one "
                          f"policy must never share a store. Cancel first (sky jobs cancel -n "
                          f"{twice[0]}) or launch only pools")

    from astraflow.context import publish_flow

    done = [Launched("publish", "flow.resolved.yaml",
                     (publish_flow(p.published_flow(), overwrite=overwrite),))]
    record = _LaunchRecord(p)
    echo(f"published {done[0].ids[0]}")
    import sky

    for job, task in tasks:
        request = sky.jobs.launch(task, name=job.name,
                                  num_jobs=job.num_jobs if job.num_jobs > 1 else None)
        job_ids, _handle = sky.stream_and_get(request)
        ids = tuple(str(i) for i in (job_ids or []))
        done.append(Launched("trainer" if job.role == "trainer" else "sky-pool", job.name, ids))
        record.add(sky_job=job.name)
        echo(f"launched {job.name}: managed job(s) {', '.join(ids) or '?'}")
    for call in p.modal:
        cls = modal_cls.with_options(gpu=call.gpu) if call.gpu else modal_cls
        fc = cls().run.spawn(**call.kwargs)
        done.append(Launched("modal", call.kwargs["worker_id"], (fc.object_id,)))
        record.add(modal_call=fc.object_id)
        echo(f"spawned {call.kwargs['worker_id']} on Modal: {fc.object_id}")
    return done


#: What each launch started, one file per launch id (launches never rewrite each
#: other's): `astraflow stop` cancels from these, and from the autoscaler's Modal
#: state (its SkyPilot workers live only in the job queue: it retires them itself).
LAUNCH_RECORDS = "_launch"
SCALE_MODAL = "_scale/modal.json"


class _LaunchRecord:
    """`<store>/_launch/<launch id>.json`, rewritten after every start, so a launch that
    fails halfway still leaves the names of what it did start."""

    def __init__(self, p: LaunchPlan):
        from astraflow.stores.objects import ObjectStore

        self.objects = ObjectStore(p.store, retry_budget_s=p.flow.store.retry_budget_s)
        self.rel = f"{LAUNCH_RECORDS}/{p.launch_id}.json"
        self.data: dict[str, Any] = {"launch_id": p.launch_id, "flow": p.flow.name,
                                     "sky_jobs": [], "modal_calls": []}

    def add(self, *, sky_job: str | None = None, modal_call: str | None = None) -> None:
        if sky_job:
            self.data["sky_jobs"].append(sky_job)
        if modal_call:
            self.data["modal_calls"].append(modal_call)
        self.objects.put_bytes(self.rel, json.dumps(self.data, indent=1).encode())


@dataclass(frozen=True)
class Started:
    """The cloud jobs and calls a run's store says were started for it."""

    sky_jobs: tuple[str, ...]
    """Managed job names `launch` used."""
    modal_calls: tuple[str, ...]
    """Modal function call ids (by `launch` and by the autoscaler's modal backend)."""


def started(store: str) -> Started:
    """Every SkyPilot job name and Modal call id recorded in `store` (reads only)."""
    from astraflow.stores.objects import ObjectStore

    objects = ObjectStore(store)
    sky_jobs: list[str] = []
    calls: list[str] = []
    for rel in objects.walk(LAUNCH_RECORDS):
        if rel.endswith(".json"):
            data = json.loads(objects.get_bytes(f"{LAUNCH_RECORDS}/{rel}"))
            sky_jobs += data.get("sky_jobs", [])
            calls += data.get("modal_calls", [])
    try:
        calls += [e["call"] for e in json.loads(objects.get_bytes(SCALE_MODAL)).values()
                  if e.get("call")]
    except FileNotFoundError:
        pass
    return Started(tuple(dict.fromkeys(sky_jobs)), tuple(dict.fromkeys(calls)))


def stop(store: str, *, dry_run: bool = False,
         echo: Callable[[str], None] = print) -> Started:
    """Cancel what runs for the run at `store`: its SkyPilot managed jobs that have not
    finished (by the names the launcher and the autoscaler used; `sky jobs cancel -n`)
    and its Modal calls (by call id: the deployed app is shared by every run, so it
    stays up and other runs' workers keep going). Returns what was (or, with
    `dry_run`, would be) cancelled. The store itself is left as it is: the run can be
    launched again and resumes from its checkpoints."""
    rec = started(store)
    live = _active_job_names() if rec.sky_jobs else set()
    todo = Started(tuple(n for n in rec.sky_jobs if n in live), rec.modal_calls)
    finished = len(rec.sky_jobs) - len(todo.sky_jobs)
    verb = "would cancel" if dry_run else "cancelling"
    echo(f"{verb} {len(todo.sky_jobs)} SkyPilot managed job(s) of {store}"
         + (f" ({finished} recorded one(s) already finished)" if finished else "")
         + (f": {', '.join(todo.sky_jobs)}" if todo.sky_jobs else ""))
    echo(f"{verb} {len(todo.modal_calls)} Modal call(s)"
         + (f": {', '.join(todo.modal_calls)}" if todo.modal_calls else ""))
    if dry_run:
        return todo
    for name in todo.sky_jobs:
        _cancel_sky_job(name)
        echo(f"cancelled managed job {name}")
    for call in todo.modal_calls:
        _cancel_modal_call(call)
    if todo.modal_calls:
        echo(f"cancelled {len(todo.modal_calls)} Modal call(s)")
    return todo


def _cancel_sky_job(name: str) -> None:
    import sky

    sky.get(sky.jobs.cancel(name=name))


def _cancel_modal_call(call_id: str) -> None:
    """Cancel one call; one that already ended is fine (nothing to stop)."""
    import modal

    modal.FunctionCall.from_id(call_id).cancel()


def _modal_class(p: LaunchPlan):
    """The deployed app's Rollout class, looked up before anything starts."""
    import modal

    app = p.modal[0].app
    cls = modal.Cls.from_name(app, MODAL_CLASS)
    try:
        cls.hydrate()
    except modal.exception.NotFoundError as err:
        raise LaunchError(f"Modal app {app!r} has no class {MODAL_CLASS!r}: deploy it first "
                          f"(modal deploy apps/rollout.py) ({err})") from None
    except modal.exception.Error as err:  # no token, wrong workspace, ...
        raise LaunchError(f"Modal refused the lookup of {app}.{MODAL_CLASS}: {err} (modal token "
                          f"new / MODAL_TOKEN_ID sets the account)") from None
    return cls


def _active_job_names() -> set[str]:
    """Names of managed jobs that have not finished (empty before the first launch)."""
    import sky
    from sky import exceptions

    try:
        result = sky.get(sky.jobs.queue_v2(refresh=False, skip_finished=True))
    except exceptions.ClusterNotUpError:  # no jobs controller yet: nothing runs
        return set()
    records = result[0] if isinstance(result, tuple) else result
    return {r.get("job_name") for r in records if r.get("job_name")}


def _task_resources(path: Path) -> dict[str, Any]:
    config = yaml.safe_load(path.read_text()) or {}
    return dict(config.get("resources") or {})


def _any_of(accelerators: list[str], infra: list[str],
            defaults: dict[str, Any]) -> tuple[dict[str, str], ...]:
    """SkyPilot `any_of` entries: every `infra` × every accelerator; what is not given
    comes from the task file's own list."""
    file_entries = [{k: str(v) for k, v in e.items()} for e in defaults.get("any_of") or []]
    if not accelerators and not infra:
        return tuple(file_entries)
    accs = accelerators or list(dict.fromkeys(e["accelerators"] for e in file_entries))
    return tuple({"infra": i, "accelerators": a} if i else {"accelerators": a}
                 for i in (infra or [None]) for a in accs)


def _job_name(*parts: str) -> str:
    """A valid SkyPilot job/cluster name: letters, digits and dashes, starting with a letter."""
    name = re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")
    return name if name[:1].isalpha() else f"af-{name}"


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _envs(envs: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in envs.items())


def _recovery(r: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in r.items()) or "none"


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)
