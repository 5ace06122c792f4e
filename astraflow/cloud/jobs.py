"""What a cloud launch starts, as plain data: SkyPilot managed jobs, Modal calls, and
what was started. Shared by planning (`plan.py`), pricing (`prices.py`), the side
effects (`skypilot.py`, `modal_calls.py`, `launch.py`) and the autoscaler's backends,
so none of them needs another's internals. No cloud SDK is imported here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Passed to SkyPilot jobs as secrets (redacted by SkyPilot); values from the environment.
REQUIRED_SECRETS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
OPTIONAL_SECRETS = ("AWS_SESSION_TOKEN",)
#: Not secret, but the workers need the same bucket region/endpoint as this machine.
PASSTHROUGH_ENVS = ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                    "AWS_ALLOW_HTTP")

#: The deployed Modal app's class and method (apps/rollout.py's CLASS_NAME and `run`).
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
        counts = sorted({gpu_count(e["accelerators"]) for e in self.any_of
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
class Launched:
    """What `launch` started (or, in a dry run, checked)."""

    kind: str
    """`publish`, `trainer`, `sky-pool` or `modal`."""
    name: str
    ids: tuple[str, ...] = ()
    """Managed job ids, Modal function call ids, or the published flow's location."""


def job_name(*parts: str) -> str:
    """A valid SkyPilot job/cluster name: letters, digits and dashes, starting with a letter."""
    name = re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")
    return name if name[:1].isalpha() else f"af-{name}"


def gpu_count(accelerator: str) -> int:
    """GPUs per node of a SkyPilot accelerator string (`H100:8` -> 8, `L4` -> 1)."""
    _, _, n = accelerator.partition(":")
    return max(1, int(float(n))) if n else 1
