"""Planning a cloud launch: what `astraflow launch FLOW` would start, pure and offline.

One SkyPilot managed job per policy's trainer, one job group per `backend: sky`
rollout pool, one Modal call per worker of a `backend: modal` pool, all given the
run's store URI and nothing else (the store holds `flow.resolved.yaml`):

    p = plan(load_flow("examples/cloud.yaml"))   # checks the flow, calls no cloud
    print(p.describe(catalog))                   # with hourly prices (prices.py)
    launch(p, dry_run=True)                      # launch.py: builds the SkyPilot tasks

Credentials never enter a plan: the task files declare them as SkyPilot secrets
(names only) and `launch` passes their values from the environment. Importing this
loads neither SkyPilot, Modal nor torch.
"""

from __future__ import annotations

import os
import secrets as _secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from astraflow.cloud.jobs import (
    MODAL_MAX_MINUTES,
    OPTIONAL_SECRETS,
    PASSTHROUGH_ENVS,
    REQUIRED_SECRETS,
    LaunchError,
    ModalCall,
    SkyJob,
    job_name,
)
from astraflow.cloud.modal_calls import deploy_hint
from astraflow.cloud.skypilot import (
    PACKAGE_ENV,
    ROLLOUT_TASK,
    TRAIN_TASK,
    checkout,
    package_spec,
    task_resources,
)
from astraflow.config.cloud import (
    DEFAULT_TRAINER_CPUS,
    DEFAULT_TRAINER_GPUS,
    RolloutPoolSpec,
    TrainerLaunchSpec,
)
from astraflow.config.flow import FlowSpec

if TYPE_CHECKING:
    from astraflow.policies.prices import Catalog


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
        (astraflow.cloud.prices); without one, `no_prices` says why there is none."""
        from astraflow.cloud.egress import egress_lines
        from astraflow.cloud.prices import price_jobs

        prices = price_jobs(self.sky_jobs, catalog) if catalog is not None else {}
        egress, egress_all, egress_usd = (egress_lines(self, catalog) if catalog is not None
                                          else ({}, [], 0.0))

        def price(j: SkyJob) -> list[str]:
            return ([f"    price:     {prices[j.name].detail}"] if j.name in prices else []) \
                + egress.get(j.name, [])

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
                         f"gpu: {gpu}; credentials: the app's Modal Secret; deployed by "
                         f"{deploy_hint()}")
            lines += [f"    {c.describe()}" for c in calls]
        if catalog is not None:
            known = [p.per_hour for p in prices.values() if p.per_hour is not None]
            left = [n for n, p in prices.items() if p.per_hour is None]
            extra = [f"{len(left)} job(s) with no catalog price"] if left else []
            extra += ["Modal calls (billed by Modal)"] if self.modal else []
            if not egress_all:
                extra += ["egress (set launch.store_region and launch.traffic)"]
            lines += egress_all
            gpus = sum(known)
            lines.append(f"estimated: ~${gpus + egress_usd:.2f}/h while everything runs, from "
                         f"{catalog.source}" + (f" (${gpus:.2f}/h machines + ${egress_usd:.2f}/h "
                                                f"egress)" if egress_all else "")
                         + (f"; not included: {', '.join(extra)}" if extra else ""))
        elif no_prices:
            lines.append(f"estimated: no price estimate ({no_prices})")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


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
    env = os.environ if environ is None else environ
    launch_id = launch_id or _secrets.token_hex(3)
    secret_names = REQUIRED_SECRETS + tuple(n for n in OPTIONAL_SECRETS if env.get(n))
    passthrough = {n: env[n] for n in PASSTHROUGH_ENVS if env.get(n)}
    notes: list[str] = []

    train_defaults = task_resources(TRAIN_TASK)
    t = spec.trainer
    accelerators, node_resources = trainer_resources(flow)
    trainers = []
    for pol in flow.policy_names():
        trainers.append(SkyJob(
            role="trainer", name=job_name(flow.name, "train", pol), task_file=TRAIN_TASK,
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

    rollout_defaults = task_resources(ROLLOUT_TASK)
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
    if checkout() is None and (trainers or pools):
        spec_ = (env[PACKAGE_ENV] if env.get(PACKAGE_ENV) else
                 f"{package_spec('trainer', env)} (rollout workers: with the vllm extra)")
        notes.append(f"no source checkout to upload: the VMs install {spec_}; set "
                     f"{PACKAGE_ENV} to a wheel or git URL for a build not on the index")
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


def _sky_pool(flow: FlowSpec, pool: RolloutPoolSpec, store: str, secret_names: tuple[str, ...],
              passthrough: dict[str, str], defaults: dict[str, Any]) -> SkyJob:
    region = pool.region or ""
    return SkyJob(
        role="rollout", name=job_name(flow.name, pool.name), task_file=ROLLOUT_TASK,
        num_jobs=pool.workers,
        envs={"ASTRAFLOW_STORE": store, "ASTRAFLOW_POOL": pool.name,
              "ASTRAFLOW_MINUTES": _number(pool.minutes), "ASTRAFLOW_REGION": region,
              **passthrough},
        secrets=secret_names, any_of=_any_of(pool.accelerators, pool.infra, defaults),
        use_spot=pool.spot, job_recovery=dict(defaults.get("job_recovery", {})),
        command=(f"astraflow rollout {store} --worker-id {pool.name}-<job id>-0 "
                 f"--minutes {_number(pool.minutes)} --region {region or '<region of its VM>'}"),
        pool=pool.name)


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


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _envs(envs: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in envs.items())


def _recovery(r: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in r.items()) or "none"


def _rel(path: Path) -> str:
    root = checkout()
    try:
        return str(path.relative_to(root)) if root else str(path)
    except ValueError:
        return str(path)
