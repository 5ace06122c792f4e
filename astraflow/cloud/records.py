"""Launch records: what each launch started, kept in the run's store, and `stop`.

`<store>/_launch/<launch id>.json` names the SkyPilot jobs and Modal calls one launch
started (one file per launch, so launches never rewrite each other's), rewritten after
every start so a launch that fails halfway still leaves what it did start. `stop`
cancels from these and from the autoscaler's Modal state; its SkyPilot workers live
only in the job queue, and it retires them itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from astraflow.cloud.modal_calls import cancel_modal_call
from astraflow.cloud.skypilot import active_job_names, cancel_sky_job

LAUNCH_RECORDS = "_launch"
SCALE_MODAL = "_scale/modal.json"


class LaunchRecord:
    """`<store>/_launch/<launch id>.json` of one launch, rewritten after every start."""

    def __init__(self, store: str, launch_id: str, flow_name: str, *,
                 retry_budget_s: float = 120.0):
        from astraflow.stores.objects import ObjectStore

        self.objects = ObjectStore(store, retry_budget_s=retry_budget_s)
        self.rel = f"{LAUNCH_RECORDS}/{launch_id}.json"
        self.data: dict[str, Any] = {"launch_id": launch_id, "flow": flow_name,
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
    live = active_job_names() if rec.sky_jobs else set()
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
        cancel_sky_job(name)
        echo(f"cancelled managed job {name}")
    for call in todo.modal_calls:
        cancel_modal_call(call)
    if todo.modal_calls:
        echo(f"cancelled {len(todo.modal_calls)} Modal call(s)")
    return todo
