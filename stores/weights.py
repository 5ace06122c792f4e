"""Versioned weights: `<root>/<policy>/v<NNNNNNNN>/` + MANIFEST.json written last.

A version exists exactly when its manifest exists, parses, and (on load) every
file it lists verifies by size and sha256. Readers trust only the manifest, so
a trainer killed mid-publish leaves an invisible folder, never a half model.
Files are HF format (config.json, model.safetensors, tokenizer files) so that
transformers and vLLM load them as they are. Pickle-bearing formats are refused
on publish and on load: safetensors only.

The root is a local directory or `s3://bucket/prefix` (`stores.objects`). On
S3, `load` downloads a version into a local cache (verified on every load) so
that transformers and vLLM always read a local folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow.stores import retry
from astraflow.stores.objects import ObjectStore
from astraflow.stores.uri import S3Settings

MANIFEST = "MANIFEST.json"
#: Versions below the one just loaded that the local download cache keeps (S3 only).
CACHE_KEEP = 4
FORMAT = 1
#: Only formats that cannot execute code when loaded.
ALLOWED_SUFFIXES = (".safetensors", ".json", ".txt", ".jinja", ".md")
#: In an adapter version: the version (of the same policy) whose weights it applies to
#: (astraflow.models.lora.BASE_FILE). Version 0, which `prune` always keeps.
BASE_FILE = "base.json"


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
    lineage: int | None = None
    """Trained versions on this version's ancestry (its depth in the lineage tree: a
    republish of restored weights that carry no new update keeps its source's depth);
    staleness is measured in it (astraflow/train/lineage.py). None: written before
    the field existed."""

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


def cache_root() -> Path:
    return Path(os.environ.get("ASTRAFLOW_CACHE", Path.home() / ".cache" / "astraflow"))


class WeightStore:
    """Weight versions of every policy under one root (directory or s3:// URI)."""

    def __init__(self, root: str | Path, *, retry_budget_s: float = retry.DEFAULT_BUDGET_S,
                 settings: S3Settings | None = None):
        self.objects = ObjectStore(root, retry_budget_s=retry_budget_s, settings=settings)
        self.root = self.objects.local() or Path(self.objects.uri)
        #: Bases of adapter versions verified (and, on S3, fetched) by this store.
        self._bases: set[tuple[str, int]] = set()

    @staticmethod
    def _rel(policy: str, version: int, name: str = "") -> str:
        return f"{policy}/v{version:08d}" + (f"/{name}" if name else "")

    def dir(self, policy: str, version: int) -> Path:
        """Where a version's files are read from: in place locally, the cache for S3."""
        local = self.objects.local(self._rel(policy, version))
        if local is not None:
            return local
        endpoint = (self.objects.settings or S3Settings.from_env()).key
        key = hashlib.sha256(f"{endpoint} {self.objects.uri}".encode()).hexdigest()[:16]
        return cache_root() / "weights" / key / policy / f"v{version:08d}"

    def staging_dir(self, policy: str) -> Path:
        """A fresh local folder to save a model into before `publish`.

        Locally it sits beside the versions (same filesystem, so publish is a
        rename); for S3 it is a temp folder removed after upload.
        """
        local = self.objects.local(policy)
        base = local if local is not None else Path(tempfile.gettempdir()) / "astraflow-staging"
        path = base / f".staging-{uuid.uuid4().hex}"
        path.mkdir(parents=True)
        return path

    def versions(self, policy: str) -> list[int]:
        """Published versions (manifest present), ascending. One listing on S3."""
        return self.objects.numbered(policy, "v", MANIFEST)

    def has(self, policy: str, version: int) -> bool:
        """Whether `version` is published (its manifest exists): one request on S3."""
        return self.objects.exists(self._rel(policy, version, MANIFEST))

    def latest(self, policy: str) -> int | None:
        vs = self.versions(policy)
        return vs[-1] if vs else None

    def manifest(self, policy: str, version: int) -> Manifest:
        try:
            data = json.loads(self.objects.get_bytes(self._rel(policy, version, MANIFEST)))
        except FileNotFoundError as err:
            raise WeightError(f"{policy} v{version} does not exist (no {MANIFEST})") from err
        except json.JSONDecodeError as err:
            raise TamperedWeights(f"{policy} v{version}: {MANIFEST} is not valid JSON") from err
        if data.get("format") != FORMAT:
            raise WeightError(f"{policy} v{version}: manifest format {data.get('format')} unknown")
        return Manifest(
            policy=data["policy"], version=data["version"], step=data["step"],
            parent=data["parent"], time=data["time"], files=data["files"],
            lineage=data.get("lineage"),
        )

    def publish(self, policy: str, src: Path, *, step: int, version: int | None = None,
                parent: int | None = None, keep_src: bool = False,
                expect: Manifest | None = None, lineage: int | None = None) -> int:
        """Turn a staged folder into the next version; the manifest is written last.

        `src` is consumed (moved in locally, uploaded then deleted for S3)
        unless `keep_src` (a mirror publishes from a verified copy it keeps).
        `parent` defaults to the newest version; a trainer restored from a
        checkpoint names the version it really descends from. With `expect`
        (a mirror: the source's manifest) the files must hash to exactly that
        manifest, and the uploaded objects are checked by size before the
        manifest makes the version visible. `lineage`: the version's depth in
        the lineage tree (Manifest.lineage; a mirror copies the source's).
        """
        src = Path(src)
        files = sorted(p for p in src.iterdir() if p.is_file())
        if not files:
            raise WeightError(f"nothing to publish in {src}")
        for p in files:
            _check_allowed(p.name)
        if expect is not None:  # a mirror, which listed the replica: number and lineage as they are
            version, parent, lineage = expect.version, expect.parent, expect.lineage
        else:
            latest = self.latest(policy)
            parent = latest if parent is None else parent
            if version is None:  # the listing just said it is free: no second request
                version = 0 if latest is None else latest + 1
            elif self.has(policy, version):
                raise WeightError(f"{policy} v{version} already exists in {self.objects.uri}")
        entries = {p.name: {"size": p.stat().st_size, "sha256": _sha256(p)} for p in files}
        if expect is not None and entries != expect.files:
            raise TamperedWeights(f"{policy} v{version}: the files to mirror do not match the "
                                  f"source manifest")
        local = self.objects.local(self._rel(policy, version))
        if local is not None:
            if local.exists():  # a publish killed before its manifest: never visible, replace it
                shutil.rmtree(local)
            local.parent.mkdir(parents=True, exist_ok=True)
            if keep_src:
                shutil.copytree(src, local)
            else:
                os.replace(src, local)  # atomic on one filesystem; still invisible: no manifest
        else:
            for p in files:
                self.objects.put_file(p, self._rel(policy, version, p.name))
            if not keep_src:
                shutil.rmtree(src, ignore_errors=True)
        if expect is not None:
            self._check_arrived(policy, version, entries)
        manifest = {
            "format": FORMAT, "policy": policy, "version": version, "step": step,
            "parent": parent, "time": expect.time if expect else time.time(), "files": entries,
        }
        if lineage is not None:
            manifest["lineage"] = lineage
        self.objects.put_bytes(self._rel(policy, version, MANIFEST),
                               json.dumps(manifest, indent=1).encode())
        return version

    def _check_arrived(self, policy: str, version: int, entries: dict[str, dict[str, Any]]) -> None:
        """Every uploaded object is there with its size (one listing), before the manifest."""
        sizes = self.objects.sizes(self._rel(policy, version))
        for name, meta in entries.items():
            if sizes.get(name) != int(meta["size"]):
                raise TamperedWeights(f"{policy} v{version}: {name} arrived as {sizes.get(name)} "
                                      f"bytes at {self.objects.uri}, expected {meta['size']}")

    def load(self, policy: str, version: int, *, refresh: bool = False,
             manifest: Manifest | None = None) -> Path:
        """Verify every file of a version and return a local folder holding it.

        Raises TamperedWeights on any size/sha256 mismatch, missing or extra
        weight file; callers keep their previous version and say so. On S3 a
        cached copy that fails verification is fetched again before giving up
        (the cache, not the store, may be what is damaged); `refresh` skips
        the cache altogether (the audit verifies the objects in the store).
        `manifest`: one the caller just read (a mirror), to save reading it again.
        """
        man = manifest or self.manifest(policy, version)
        d = self.dir(policy, version)
        if not self.objects.remote:
            self._verify(policy, version, man, d)
            self._load_base(policy, version, man, d)
            return d
        self._download(policy, version, man, d, everything=refresh)
        try:
            self._verify(policy, version, man, d)
        except TamperedWeights:
            if refresh:
                raise
            self._download(policy, version, man, d, everything=True)
            self._verify(policy, version, man, d)
        self._load_base(policy, version, man, d)
        self._trim_cache(d.parent, version)
        return d

    def _load_base(self, policy: str, version: int, man: Manifest, d: Path) -> None:
        """An adapter version (astraflow.models.lora) is read with its base beside it:
        verify (on S3: fetch) that base once per store, so a worker swapping
        adapters pays for the base once, not per version."""
        if BASE_FILE not in man.files:
            return
        base = int(json.loads((d / BASE_FILE).read_text())["version"])
        if base == version:
            raise WeightError(f"{policy} v{version} names itself as its base")
        if (policy, base) not in self._bases:
            self.load(policy, base)
            self._bases.add((policy, base))

    @staticmethod
    def _trim_cache(policy_cache: Path, version: int) -> None:
        """Bound the download cache: a worker on a long cloud run loads hundreds of
        versions, and each is a whole model. Engines copy weights into memory on
        load, so only recent folders (and v0, every run's baseline) are kept."""
        for old in policy_cache.glob("v*"):
            v = old.name[1:]
            if v.isdigit() and 0 < int(v) <= version - CACHE_KEEP:
                shutil.rmtree(old, ignore_errors=True)

    @staticmethod
    def _verify(policy: str, version: int, man: Manifest, d: Path) -> None:
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

    def _download(self, policy: str, version: int, man: Manifest, d: Path, *,
                  everything: bool = False) -> None:
        """Fetch the files the cache lacks or holds with the wrong size (or all of them).

        A worker's load fetches what the manifest lists and nothing else (one
        GET per file, no listing): a stray object in the store is never
        downloaded, so it cannot reach the engine. `everything` (the audit)
        also lists the folder, fetches strays, and so refuses them in _verify.
        """
        names = set(man.files)
        if everything:
            remote = set(self.objects.walk(self._rel(policy, version))) - {MANIFEST}
            for name in sorted(remote - names):
                _check_allowed(name)
            names |= remote
        for name in sorted(names):
            p = d / name
            want = man.files.get(name, {}).get("size")
            fresh = p.is_file() and want is not None and p.stat().st_size == int(want)
            if everything or not fresh:
                try:
                    self.objects.get_file(self._rel(policy, version, name), p)
                except FileNotFoundError:
                    pass  # _verify names the missing file

    def prune(
        self, policy: str, *, keep_last: int, keep_every: int = 0, protect: set[int] | None = None
    ) -> list[int]:
        """Delete old versions, keeping the newest `keep_last`, every `keep_every`-th
        (milestones for curves) and any in `protect` (named by a checkpoint).
        Version 0 is always kept: it is every run's baseline, and the base that every
        adapter version of a LoRA policy applies to (BASE_FILE)."""
        vs = self.versions(policy)
        keep = set(vs[-keep_last:]) if keep_last > 0 else set(vs)
        keep |= protect or set()
        keep |= {0} & set(vs)  # version 0 is every run's baseline
        if keep_every > 0:
            keep |= {v for v in vs if v % keep_every == 0}
        removed = []
        for v in vs:
            if v not in keep:
                # Remove the manifest first so the version vanishes atomically.
                self.objects.delete(self._rel(policy, v, MANIFEST))
                self.objects.delete_tree(self._rel(policy, v))
                removed.append(v)
        return removed
