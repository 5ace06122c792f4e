"""Test hooks: inert unless a test sets their environment variables.

Chaos tests kill a trainer at chosen steps; polling its progress for a kill window
races it. A trainer started with

    ASTRAFLOW_TEST_PAUSE_AT_STEP=6,25,45   ASTRAFLOW_TEST_GATE=/tmp/gate

stops after finishing each of those steps (ledger row and progress written,
checkpoint taken only if due), writes `<gate>/paused-<policy>-<step>` holding its
pid, and waits (an entry `verifier:5` pauses only that policy's trainer): the test kills it at exactly that step. Each step pauses once (the
file stays), so the restarted trainer redoes it and goes on. The wait ends when
`<gate>/release-<policy>-<step>` appears or after ASTRAFLOW_TEST_PAUSE_S seconds
(default 300), so a test that never kills cannot hang a run. With
ASTRAFLOW_TEST_KILL_BEFORE_MANIFEST=5 a trainer SIGKILLs itself once (a marker in the
gate) when version 5's files are in the weight store and its manifest is not.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

PAUSE_ENV = "ASTRAFLOW_TEST_PAUSE_AT_STEP"
GATE_ENV = "ASTRAFLOW_TEST_GATE"
TIMEOUT_ENV = "ASTRAFLOW_TEST_PAUSE_S"
KILL_ENV = "ASTRAFLOW_TEST_KILL_BEFORE_MANIFEST"


def pause_at(policy: str, step: int) -> None:
    """Called by the trainer after each step; returns at once unless PAUSE_ENV names it."""
    steps = os.environ.get(PAUSE_ENV)
    if not steps or not _names(steps, policy, step):
        return
    gate = Path(os.environ.get(GATE_ENV) or ".")
    gate.mkdir(parents=True, exist_ok=True)
    marker = gate / f"paused-{policy}-{step}"
    tmp = gate / f".paused-{policy}-{step}.{os.getpid()}"
    tmp.write_text(str(os.getpid()))
    try:  # a hard link appears whole and only once: a step pauses once, across restarts
        os.link(tmp, marker)
    except FileExistsError:
        return
    finally:
        tmp.unlink()
    release = gate / f"release-{policy}-{step}"
    deadline = time.monotonic() + float(os.environ.get(TIMEOUT_ENV, "300"))
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _names(entries: str, policy: str, step: int) -> bool:
    """Whether `entries` ("6,13" or "verifier:5,solver:9") names this policy's step."""
    for entry in (e.strip() for e in entries.split(",")):
        who, _, at = entry.rpartition(":")
        if entry and int(at) == step and who in ("", policy):
            return True
    return False


def kill_before_manifest(policy: str, version: int) -> None:
    """Called by the trainer's publish just before a manifest; inert unless KILL_ENV
    names the version. Dies once per version (a marker in the gate), across restarts."""
    versions = os.environ.get(KILL_ENV)
    if not versions or version not in {int(v) for v in versions.split(",") if v.strip()}:
        return
    gate = Path(os.environ.get(GATE_ENV) or ".")
    gate.mkdir(parents=True, exist_ok=True)
    try:
        (gate / f"killed-{policy}-v{version}").open("x").close()
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)
