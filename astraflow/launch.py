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
`import astraflow.launch` stays cheap and `plan()` works without either.
Credentials never enter a plan: the task files declare them as SkyPilot secrets
(names only) and `launch` passes their values from this process's environment.
"""

from __future__ import annotations

import os
import re
import secrets as _secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from astraflow.cloud import RolloutPoolSpec
from astraflow.flow import FlowSpec

#: The SkyPilot task files (a checkout's `sky/`; `workdir` uploads that checkout).
REPO = Path(__file__).resolve().parents[1]
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

    def resources(self) -> str:
        spot = "spot" if self.use_spot else "on-demand"
        alts = " | ".join(f"{e['infra']} {e['accelerators']}" if e.get("infra") else
                          e["accelerators"] for e in self.any_of)
        return f"{spot}, any of: {alts}"


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

    def describe(self) -> str:
        lines = [f"launch plan for flow {self.flow.name!r} (launch id {self.launch_id})",
                 f"  store:   {self.store}",
                 f"  publish: {self.store}/flow.resolved.yaml"]
        lines.append(f"trainers: {len(self.trainers)} SkyPilot managed job(s), "
                     f"{_rel(TRAIN_TASK)}")
        for j in self.trainers:
            lines += [f"  {j.name}", f"    resources: {j.resources()}",
                      f"    recovery:  {_recovery(j.job_recovery)}",
                      f"    run:       {j.command}", f"    envs:      {_envs(j.envs)}",
                      f"    secrets:   {', '.join(j.secrets)} (from your environment)"]
        n_sky = sum(j.num_jobs for j in self.pools)
        lines.append(f"rollout: {n_sky + len(self.modal)} worker(s) in "
                     f"{len(self.flow.launch.rollout) if self.flow.launch else 0} pool(s)")
        for j in self.pools:
            lines += [f"  pool {j.pool} (sky): {j.num_jobs} managed job(s) {j.name}, "
                      f"{_rel(j.task_file)}",
                      f"    resources: {j.resources()}",
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
    trainers = []
    for pol in flow.policy_names():
        t = spec.trainer
        trainers.append(SkyJob(
            role="trainer", name=_job_name(flow.name, "train", pol), task_file=TRAIN_TASK,
            num_jobs=1, envs={"ASTRAFLOW_STORE": store, "POLICY": pol, **passthrough},
            secrets=secret_names, any_of=_any_of(t.accelerators, t.infra, train_defaults),
            use_spot=t.spot,
            job_recovery={**train_defaults.get("job_recovery", {}),
                          "max_restarts_on_errors": t.max_restarts_on_errors},
            command=f"astraflow train {store} --policy {pol}"))

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
    resources.update(use_spot=job.use_spot, any_of=[dict(e) for e in job.any_of],
                     job_recovery=dict(job.job_recovery))
    config["resources"] = resources
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

    from astraflow.run import publish_flow

    done = [Launched("publish", "flow.resolved.yaml",
                     (publish_flow(p.published_flow(), overwrite=overwrite),))]
    echo(f"published {done[0].ids[0]}")
    import sky

    for job, task in tasks:
        request = sky.jobs.launch(task, name=job.name,
                                  num_jobs=job.num_jobs if job.num_jobs > 1 else None)
        job_ids, _handle = sky.stream_and_get(request)
        ids = tuple(str(i) for i in (job_ids or []))
        done.append(Launched("trainer" if job.role == "trainer" else "sky-pool", job.name, ids))
        echo(f"launched {job.name}: managed job(s) {', '.join(ids) or '?'}")
    for call in p.modal:
        cls = modal_cls.with_options(gpu=call.gpu) if call.gpu else modal_cls
        fc = cls().run.spawn(**call.kwargs)
        done.append(Launched("modal", call.kwargs["worker_id"], (fc.object_id,)))
        echo(f"spawned {call.kwargs['worker_id']} on Modal: {fc.object_id}")
    return done


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
