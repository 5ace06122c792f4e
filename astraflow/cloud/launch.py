"""`launch`: start what a plan describes, in the one order that is safe.

Every SkyPilot task is built and validated first and the Modal class looked up, so a
mistake refuses the launch before anything costs money; then the flow is published to
the store, and only then the trainers, the sky pools and the Modal calls start. Each
start is written to the launch record (records.py) as it happens. The components never
talk to each other or to this process again: the store is the whole run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from astraflow.cloud.jobs import REQUIRED_SECRETS, Launched, LaunchError
from astraflow.cloud.modal_calls import modal_class
from astraflow.cloud.plan import LaunchPlan
from astraflow.cloud.records import LaunchRecord
from astraflow.cloud.skypilot import active_job_names, build_sky_task


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
        tasks = [(job, build_sky_task(job, secrets=values, environ=env)) for job in p.sky_jobs]
    else:
        tasks = []
    if dry_run:
        echo(f"dry run: {len(tasks)} SkyPilot task(s) built and validated; nothing launched")
        return [Launched("trainer" if j.role == "trainer" else "sky-pool", j.name)
                for j, _ in tasks]

    modal_cls = modal_class(p.modal[0].app) if p.modal else None
    running = active_job_names() if p.trainers else set()
    twice = [j.name for j in p.trainers if j.name in running]
    if twice:
        raise LaunchError(f"trainer job(s) {twice} are already running: two trainers of one "
                          f"policy must never share a store. Cancel first (sky jobs cancel -n "
                          f"{twice[0]}) or launch only pools")

    from astraflow.context import publish_flow

    done = [Launched("publish", "flow.resolved.yaml",
                     (publish_flow(p.published_flow(), overwrite=overwrite),))]
    record = LaunchRecord(p.store, p.launch_id, p.flow.name,
                          retry_budget_s=p.flow.store.retry_budget_s)
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
