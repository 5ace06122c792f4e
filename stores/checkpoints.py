"""Trainer checkpoints: `<root>/<policy>/c<STEP>/` + CHECKPOINT.json written last.

A checkpoint holds everything a trainer needs to continue as if it had never
stopped: model and optimizer tensors (safetensors — never pickle), RNG states,
step, cursor and weight version (JSON). Like weight versions, a checkpoint
exists exactly when its manifest exists, and loading verifies every file's
size and sha256, so a trainer killed mid-save leaves an invisible folder and
its successor resumes from the previous complete checkpoint. The root is a
local directory or `s3://bucket/prefix` (`stores.objects`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow.stores import retry
from astraflow.stores.objects import ObjectStore

log = logging.getLogger("astraflow.stores")

MANIFEST = "CHECKPOINT.json"
FORMAT = 1
ALLOWED_SUFFIXES = (".safetensors", ".json")


class CheckpointError(RuntimeError):
    """A checkpoint is incomplete, tampered with, or not allowed."""


@dataclass(frozen=True)
class Checkpoint:
    policy: str
    step: int
    """The last step the checkpointed state includes."""
    meta: dict[str, Any]
    files: dict[str, bytes]


class CheckpointStore:
    def __init__(self, root: str | Path, *, retry_budget_s: float = retry.DEFAULT_BUDGET_S):
        self.objects = ObjectStore(root, retry_budget_s=retry_budget_s)

    @staticmethod
    def _rel(policy: str, step: int, name: str = "") -> str:
        return f"{policy}/c{step:08d}" + (f"/{name}" if name else "")

    def save(self, policy: str, step: int, files: dict[str, bytes], meta: dict[str, Any]) -> None:
        """Write the files, then the manifest that makes the checkpoint exist."""
        self.prepare(policy, step)
        self.commit(policy, step, self.put_files(policy, step, files), meta)

    # A sharded trainer writes in three phases: rank 0 prepares, every rank puts its own
    # files (distinct names), rank 0 commits the manifest listing all of them, last.
    def prepare(self, policy: str, step: int) -> None:
        """Make room for checkpoint `step`: refuse to overwrite a complete one, clear a
        damaged one (the one a resumed trainer skipped and is now reaching again)."""
        if self.objects.exists(self._rel(policy, step, MANIFEST)):
            try:
                self.load(policy, step)
            except CheckpointError as err:  # the damaged one we resumed past: replace it
                log.warning("replacing damaged checkpoint: %s", err)
                self.objects.delete(self._rel(policy, step, MANIFEST))
                self.objects.delete_tree(self._rel(policy, step))
            else:
                raise CheckpointError(f"checkpoint {policy} step {step} already exists")

    def put_files(self, policy: str, step: int, files: dict[str, bytes]) -> dict[str, dict[str, Any]]:
        """Write checkpoint files (not yet visible); returns their size and sha256 for
        `commit`."""
        for name in files:
            if not name.endswith(ALLOWED_SUFFIXES) or "/" in name:
                raise CheckpointError(f"refusing checkpoint file {name!r}: only "
                                      f"{', '.join(ALLOWED_SUFFIXES)} files are allowed")
        for name, data in files.items():
            self.objects.put_bytes(self._rel(policy, step, name), data)
        return {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                for n, d in files.items()}

    def commit(self, policy: str, step: int, files: dict[str, dict[str, Any]],
               meta: dict[str, Any]) -> None:
        """Write the manifest of files already put: from now on the checkpoint exists."""
        manifest = {"format": FORMAT, "policy": policy, "step": step, "time": time.time(),
                    "meta": meta, "files": files}
        self.objects.put_bytes(self._rel(policy, step, MANIFEST),
                               json.dumps(manifest, indent=1).encode())

    def steps(self, policy: str) -> list[int]:
        """Steps with a manifest (complete checkpoints), ascending."""
        return self.objects.numbered(policy, "c", MANIFEST)

    def load(self, policy: str, step: int) -> Checkpoint:
        try:
            man = json.loads(self.objects.get_bytes(self._rel(policy, step, MANIFEST)))
        except FileNotFoundError as err:
            raise CheckpointError(f"checkpoint {policy} step {step} does not exist") from err
        except json.JSONDecodeError as err:
            raise CheckpointError(f"checkpoint {policy} step {step}: {MANIFEST} is not JSON") from err
        if man.get("format") != FORMAT:
            raise CheckpointError(f"checkpoint {policy} step {step}: format {man.get('format')} unknown")
        files: dict[str, bytes] = {}
        for name, want in man["files"].items():
            if not name.endswith(ALLOWED_SUFFIXES):
                raise CheckpointError(f"checkpoint {policy} step {step}: refusing {name!r}")
            try:
                data = self.objects.get_bytes(self._rel(policy, step, name))
            except FileNotFoundError as err:
                raise CheckpointError(f"checkpoint {policy} step {step}: {name} is missing") from err
            if len(data) != want["size"] or hashlib.sha256(data).hexdigest() != want["sha256"]:
                raise CheckpointError(
                    f"checkpoint {policy} step {step}: {name} does not match its manifest "
                    f"({len(data)} bytes, manifest says {want['size']})")
            files[name] = data
        return Checkpoint(policy=policy, step=step, meta=man["meta"], files=files)

    def meta(self, policy: str, step: int) -> dict[str, Any] | None:
        """A complete checkpoint's meta (step, cursor, ...) from its manifest alone, without
        reading or verifying its files; None when it is gone or unreadable."""
        try:
            return json.loads(self.objects.get_bytes(self._rel(policy, step, MANIFEST)))["meta"]
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            return None

    def oldest_cursor(self, policy: str) -> int:
        """The lowest table cursor any complete checkpoint of `policy` would resume from:
        rows at or before it are behind every restart (0 when there is no checkpoint:
        a trainer without one starts from the beginning)."""
        cursors = [m.get("cursor", 0) for s in self.steps(policy)
                   if (m := self.meta(policy, s)) is not None]
        return int(min(cursors)) if cursors else 0

    def latest(self, policy: str) -> Checkpoint | None:
        """The newest checkpoint that verifies; damaged ones are reported and skipped."""
        for step in reversed(self.steps(policy)):
            try:
                return self.load(policy, step)
            except CheckpointError as err:
                log.error("skipping damaged checkpoint: %s", err)
        return None

    def prune(self, policy: str, keep_last: int) -> list[int]:
        """Keep the newest `keep_last` checkpoints; also clear saves that never finished."""
        steps = self.steps(policy)
        removed = steps[:-keep_last] if keep_last > 0 else []
        for step in removed:
            self.objects.delete(self._rel(policy, step, MANIFEST))  # invisible first
            self.objects.delete_tree(self._rel(policy, step))
        newest = steps[-1] if steps else -1
        unfinished = {f.partition("/")[0] for f in self.objects.walk(policy)} - {
            f"c{s:08d}" for s in steps}
        for d in sorted(unfinished):
            if d.startswith("c") and d[1:].isdigit() and int(d[1:]) < newest:
                self.objects.delete_tree(f"{policy}/{d}")
        return removed
