"""SkyPilot side: the task files, the `sky.Task` of a planned job, the managed-job queue.

The task files (`train.sky.yaml`, `rollout.sky.yaml`) live in the repository's `sky/`
and ship in the wheel as package data (`astraflow/cloud/tasks/`), so an installed
astraflow launches too. From a checkout, a job's `workdir` is that checkout (SkyPilot
uploads it, .gitignore'd files stay behind) and the task's setup installs it with
`pip install -e .`. From an installed wheel there is no checkout to upload: the task
has no `workdir`, and its setup installs `ASTRAFLOW_PACKAGE` instead, by default this
very version from the package index (`astraflow==X.Y.Z`, `astraflow[vllm]==X.Y.Z`
for rollout workers); set ASTRAFLOW_PACKAGE to a wheel URL or a git URL for a build
that is not on the index. SkyPilot is imported only inside the functions that call it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import yaml

from astraflow.cloud.jobs import LaunchError, SkyJob

#: Environment variable naming what the VMs install when there is no checkout to upload.
PACKAGE_ENV = "ASTRAFLOW_PACKAGE"


def checkout() -> Path | None:
    """The source checkout astraflow runs from (pyproject.toml and sky/ beside the
    package, as in an editable install), or None for an installed wheel."""
    root = Path(__file__).resolve().parents[2]
    ok = (root / "pyproject.toml").is_file() and (root / "sky" / "train.sky.yaml").is_file()
    return root if ok else None


def task_file(name: str) -> Path:
    """A SkyPilot task file: the checkout's `sky/NAME`, else the installed package data."""
    root = checkout()
    path = root / "sky" / name if root else Path(str(resources.files("astraflow.cloud")
                                                     .joinpath("tasks", name)))
    if not path.is_file():
        raise LaunchError(f"{path} is missing: this astraflow has no SkyPilot task files "
                          f"(reinstall it, or launch from a checkout of the repository)")
    return path


TRAIN_TASK = task_file("train.sky.yaml")
ROLLOUT_TASK = task_file("rollout.sky.yaml")


def package_spec(role: str, environ: Mapping[str, str] | None = None) -> str:
    """What a VM installs when no checkout is uploaded: $ASTRAFLOW_PACKAGE, else this
    version of astraflow (with the vllm extra for rollout workers)."""
    env = os.environ if environ is None else environ
    if env.get(PACKAGE_ENV):
        return env[PACKAGE_ENV]
    extra = "[vllm]" if role == "rollout" else ""
    return f"astraflow{extra}=={metadata.version('astraflow')}"


def task_resources(path: Path) -> dict[str, Any]:
    """The `resources:` section of a task file (the defaults a plan starts from)."""
    config = yaml.safe_load(path.read_text()) or {}
    return dict(config.get("resources") or {})


def build_sky_task(job: SkyJob, *, secrets: Mapping[str, str] | None = None,
                   environ: Mapping[str, str] | None = None):
    """The `sky.Task` for `job`: its task file with the plan's name, resources and envs,
    validated by SkyPilot (offline). `secrets` are values for `job.secrets`; without them
    the secrets stay unresolved references (fine for checking, refused by a launch).
    The workdir is the checkout, or none (then the setup installs `package_spec`)."""
    import sky

    config = yaml.safe_load(job.task_file.read_text())
    config["name"] = job.name
    envs = dict(job.envs)
    root = checkout()
    if root is not None:
        config["workdir"] = str(root)
    else:
        config.pop("workdir", None)
        envs[PACKAGE_ENV] = package_spec(job.role, environ)
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
    return sky.Task.from_yaml_config(config, env_overrides=list(envs.items()),
                                     secrets_overrides=values or None)


def active_job_names() -> set[str]:
    """Names of managed jobs that have not finished (empty before the first launch)."""
    import sky
    from sky import exceptions

    try:
        result = sky.get(sky.jobs.queue_v2(refresh=False, skip_finished=True))
    except exceptions.ClusterNotUpError:  # no jobs controller yet: nothing runs
        return set()
    records = result[0] if isinstance(result, tuple) else result
    return {r.get("job_name") for r in records if r.get("job_name")}


def cancel_sky_job(name: str) -> None:
    """Cancel one managed job by name (`sky jobs cancel -n NAME`)."""
    import sky

    sky.get(sky.jobs.cancel(name=name))
