"""Versioned weights: `<root>/<policy>/v<NNNNNNNN>/` + MANIFEST.json written last.

A version exists exactly when its manifest exists, parses, and (on load) every
file it lists verifies by size and sha256. Readers trust only the manifest, so
a trainer killed mid-publish leaves an invisible folder, never a half model.
Files are HF format (config.json, model.safetensors, tokenizer files) so that
transformers and vLLM load them as they are. Pickle-bearing formats are refused
on publish and on load: safetensors only.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST = "MANIFEST.json"
FORMAT = 1
#: Only formats that cannot execute code when loaded.
ALLOWED_SUFFIXES = (".safetensors", ".json", ".txt", ".jinja", ".md")


class WeightError(RuntimeError):
    """A weight version is missing, tampered with, or not allowed."""


class TamperedWeights(WeightError):
    """A file does not match its manifest (size or sha256)."""


@dataclass(frozen=True)
class Manifest:
    policy: str
    version: int
    step: int
    parent: int | None
    time: float
    files: dict[str, dict[str, Any]]

    @property
    def total_bytes(self) -> int:
        return sum(int(f["size"]) for f in self.files.values())


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _check_allowed(name: str) -> None:
    if not name.endswith(ALLOWED_SUFFIXES):
        raise WeightError(
            f"refusing weight file {name!r}: only {', '.join(ALLOWED_SUFFIXES)} are allowed "
            f"(pickle-based formats such as .bin/.pt can run code when loaded; save with safetensors)"
        )


class WeightStore:
    """Weight versions of every policy under one root directory."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def dir(self, policy: str, version: int) -> Path:
        return self.root / policy / f"v{version:08d}"

    def staging_dir(self, policy: str) -> Path:
        """A fresh folder to save a model into before `publish` (same filesystem)."""
        path = self.root / policy / f".staging-{uuid.uuid4().hex}"
        path.mkdir(parents=True)
        return path

    def versions(self, policy: str) -> list[int]:
        """Published versions (manifest present), ascending."""
        base = self.root / policy
        if not base.exists():
            return []
        out = []
        for d in base.iterdir():
            if d.name.startswith("v") and d.name[1:].isdigit() and (d / MANIFEST).is_file():
                out.append(int(d.name[1:]))
        return sorted(out)

    def latest(self, policy: str) -> int | None:
        vs = self.versions(policy)
        return vs[-1] if vs else None

    def manifest(self, policy: str, version: int) -> Manifest:
        path = self.dir(policy, version) / MANIFEST
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as err:
            raise WeightError(f"{policy} v{version} does not exist (no {MANIFEST})") from err
        except json.JSONDecodeError as err:
            raise TamperedWeights(f"{policy} v{version}: {MANIFEST} is not valid JSON") from err
        if data.get("format") != FORMAT:
            raise WeightError(f"{policy} v{version}: manifest format {data.get('format')} unknown")
        return Manifest(
            policy=data["policy"], version=data["version"], step=data["step"],
            parent=data["parent"], time=data["time"], files=data["files"],
        )

    def publish(self, policy: str, src: Path, *, step: int, version: int | None = None) -> int:
        """Turn a staged folder into the next version; the manifest is written last."""
        src = Path(src)
        files = sorted(p for p in src.iterdir() if p.is_file())
        if not files:
            raise WeightError(f"nothing to publish in {src}")
        for p in files:
            _check_allowed(p.name)
        parent = self.latest(policy)
        if version is None:
            version = 0 if parent is None else parent + 1
        target = self.dir(policy, version)
        if target.exists():
            raise WeightError(f"{policy} v{version} already exists at {target}")
        entries = {p.name: {"size": p.stat().st_size, "sha256": _sha256(p)} for p in files}
        os.replace(src, target)  # atomic on one filesystem; still invisible: no manifest
        manifest = {
            "format": FORMAT, "policy": policy, "version": version, "step": step,
            "parent": parent, "time": time.time(), "files": entries,
        }
        tmp = target / f".{MANIFEST}.tmp"
        tmp.write_text(json.dumps(manifest, indent=1))
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target / MANIFEST)
        return version

    def load(self, policy: str, version: int) -> Path:
        """Verify every file of a version and return its folder.

        Raises TamperedWeights on any size/sha256 mismatch, missing or extra
        weight file; callers keep their previous version and say so.
        """
        man = self.manifest(policy, version)
        d = self.dir(policy, version)
        for name, meta in man.files.items():
            _check_allowed(name)
            p = d / name
            if not p.is_file():
                raise TamperedWeights(f"{policy} v{version}: {name} listed in manifest is missing")
            if p.stat().st_size != int(meta["size"]):
                raise TamperedWeights(
                    f"{policy} v{version}: {name} is {p.stat().st_size} bytes, manifest says {meta['size']}"
                )
            if _sha256(p) != meta["sha256"]:
                raise TamperedWeights(f"{policy} v{version}: {name} sha256 does not match the manifest")
        for p in d.iterdir():
            if p.is_file() and p.name != MANIFEST and p.name not in man.files:
                raise TamperedWeights(f"{policy} v{version}: unexpected file {p.name} not in manifest")
        return d

    def prune(
        self, policy: str, *, keep_last: int, keep_every: int = 0, protect: set[int] | None = None
    ) -> list[int]:
        """Delete old versions, keeping the newest `keep_last`, every `keep_every`-th
        (milestones for curves) and any in `protect` (named by a checkpoint)."""
        vs = self.versions(policy)
        keep = set(vs[-keep_last:]) if keep_last > 0 else set(vs)
        keep |= protect or set()
        keep |= {0} & set(vs)  # version 0 is every run's baseline
        if keep_every > 0:
            keep |= {v for v in vs if v % keep_every == 0}
        removed = []
        for v in vs:
            if v not in keep:
                d = self.dir(policy, v)
                # Remove the manifest first so the version vanishes atomically.
                (d / MANIFEST).unlink(missing_ok=True)
                shutil.rmtree(d, ignore_errors=True)
                removed.append(v)
        return removed
