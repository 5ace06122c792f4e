"""Versioned weights: `<root>/<policy>/v<NNNNNNNN>/` + MANIFEST.json written last.

A version exists exactly when its manifest exists, parses, and (on load) every
file it lists verifies by size and sha256. Readers trust only the manifest, so
a trainer killed mid-publish leaves an invisible folder, never a half model.
Files are HF format (config.json, model.safetensors, tokenizer files) so that
transformers and vLLM load them as they are. Pickle-bearing formats are refused
on publish and on load: safetensors only.

The root is a local directory or `s3://bucket/prefix` (`stores.objects`). On
S3, `load` downloads a version into a local cache (verified on every load) so
that transformers and vLLM always read a local folder. A version may be stored
as a delta against its parent (`stores.deltas`); `load` rebuilds it in the cache
from the nearest version held there or the chain's full snapshot, and checks
every rebuilt file and the digest of them all against the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from astraflow.stores import deltas, retry
from astraflow.stores.chains import Chains
from astraflow.stores.manifest import (
    ALLOWED_SUFFIXES,
    BASE_FILE,
    FORMAT,
    MANIFEST,
    Manifest,
    TamperedWeights,
    WeightError,
    cache_root,
    check_allowed,
    sha256_file,
)
from astraflow.stores.objects import ObjectStore
from astraflow.stores.uri import S3Settings

#: Versions below the one just loaded that the local download cache keeps (S3 only).
CACHE_KEEP = 4
__all__ = ["ALLOWED_SUFFIXES", "BASE_FILE", "MANIFEST", "Manifest", "TamperedWeights",
           "WeightError", "WeightStore", "cache_root"]


class WeightStore(Chains):
    """Weight versions of every policy under one root (directory or s3:// URI)."""

    def __init__(self, root: str | Path, *, retry_budget_s: float = retry.DEFAULT_BUDGET_S,
                 settings: S3Settings | None = None):
        self.objects = ObjectStore(root, retry_budget_s=retry_budget_s, settings=settings)
        self.root = self.objects.local() or Path(self.objects.uri)
        #: Bases of adapter versions verified (and, on S3, fetched) by this store.
        self._bases: set[tuple[str, int]] = set()
        self._manifests: dict[tuple[str, int], Manifest] = {}
        #: Bytes of stored objects this store read to load versions (payloads, downloads).
        self.bytes_fetched = 0
        self._read: set[tuple[str, int]] = set()

    @staticmethod
    def _rel(policy: str, version: int, name: str = "") -> str:
        return f"{policy}/v{version:08d}" + (f"/{name}" if name else "")

    def dir(self, policy: str, version: int) -> Path:
        """Where a version's files are read from: in place locally, the cache for S3."""
        local = self.objects.local(self._rel(policy, version))
        return local if local is not None else self._cache_dir(policy, version)

    def _cache_dir(self, policy: str, version: int) -> Path:
        """A version's folder in the local cache: an S3 download or a rebuilt delta (for a
        local root, beside the versions under `.rebuilt/`, shared by a run's processes)."""
        if not self.objects.remote:
            return self.root / ".rebuilt" / policy / f"v{version:08d}"
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
        try:
            delta = deltas.read_header(data)
        except ValueError as err:
            raise WeightError(f"{policy} v{version}: {err}") from err
        man = Manifest(
            policy=data["policy"], version=data["version"], step=data["step"],
            parent=data["parent"], time=data["time"], files=data["files"],
            lineage=data.get("lineage"), delta=delta,
        )
        self._manifests[(policy, version)] = man
        return man

    def _known(self, policy: str, version: int) -> Manifest:
        """A manifest read before by this store (they never change), else read now."""
        return self._manifests.get((policy, version)) or self.manifest(policy, version)

    def publish(self, policy: str, src: Path, *, step: int, version: int | None = None,
                parent: int | None = None, keep_src: bool = False,
                expect: Manifest | None = None, lineage: int | None = None,
                delta_chain: int = 0, before_manifest: Callable[[int], None] | None = None
                ) -> int:
        """Turn a staged folder into the next version; the manifest is written last.

        `src` is consumed (moved in locally, uploaded then deleted for S3)
        unless `keep_src` (a mirror publishes from a verified copy it keeps).
        `parent` defaults to the newest version; a trainer restored from a
        checkpoint names the version it really descends from. With `expect`
        (a mirror: the source's manifest) the files must hash to exactly that
        manifest, and the uploaded objects are checked by size before the
        manifest makes the version visible. `lineage`: the version's depth in
        the lineage tree (Manifest.lineage; a mirror copies the source's).
        `delta_chain` > 0: store the version as a delta against `parent` unless
        that would make a chain of more than this many deltas since a snapshot
        (a mirror copies a delta version's payload as it is). `before_manifest(version)`
        runs when every file is in place, just before the manifest (a test kills there).
        """
        src = Path(src)
        files = sorted(p for p in src.iterdir() if p.is_file())
        if not files:
            raise WeightError(f"nothing to publish in {src}")
        for p in files:
            check_allowed(p.name)
        delta = None
        if expect is not None:  # a mirror, which listed the replica: number and lineage as they are
            version, parent, lineage, delta = (expect.version, expect.parent, expect.lineage,
                                               expect.delta)
        else:
            latest = self.latest(policy)
            parent = latest if parent is None else parent
            if version is None:  # the listing just said it is free: no second request
                version = 0 if latest is None else latest + 1
            elif self.has(policy, version):
                raise WeightError(f"{policy} v{version} already exists in {self.objects.uri}")
        entries = {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)} for p in files}
        if delta_chain > 0 and expect is None and BASE_FILE not in entries:
            encoded = None if parent is None else self._encode(
                policy, version, src, entries, parent, delta_chain, keep_src)
            if encoded is not None:
                src, delta, keep_src = encoded
                files = sorted(src.iterdir())
                entries = {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)} for p in files}
            else:  # a snapshot: the parent of the next delta
                self.keep_own(policy, version, src, move=False)
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
        if delta is not None:
            manifest["delta"] = delta
        if before_manifest is not None:
            before_manifest(version)
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
        A delta version is rebuilt (`_rebuild`); a missing or tampered delta
        raises TamperedWeights like a tampered file of a whole version.
        `manifest`: one the caller just read (a mirror), to save reading it again.
        """
        man = manifest or self.manifest(policy, version)
        if man.delta is not None:
            return self._rebuild(policy, man, refresh=refresh)
        d = self.dir(policy, version)
        if not self.objects.remote:
            if (policy, version) not in self._read:  # in place: it is read once, as a download
                self._read.add((policy, version))
                self.bytes_fetched += man.total_bytes
            self._verify(policy, version, man.files, d)
            self._load_base(policy, version, man, d)
            return d
        self._download(policy, version, man, d, everything=refresh)
        try:
            self._verify(policy, version, man.files, d)
        except TamperedWeights:
            if refresh:
                raise
            self._download(policy, version, man, d, everything=True)
            self._verify(policy, version, man.files, d)
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
    def _verify(policy: str, version: int, files: dict[str, dict[str, Any]], d: Path) -> None:
        for name, meta in files.items():
            check_allowed(name)
            p = d / name
            if not p.is_file():
                raise TamperedWeights(f"{policy} v{version}: {name} listed in manifest is missing")
            if p.stat().st_size != int(meta["size"]):
                raise TamperedWeights(
                    f"{policy} v{version}: {name} is {p.stat().st_size} bytes, manifest says {meta['size']}"
                )
            if sha256_file(p) != meta["sha256"]:
                raise TamperedWeights(f"{policy} v{version}: {name} sha256 does not match the manifest")
        for p in d.iterdir():
            if p.is_file() and p.name != MANIFEST and p.name not in files:
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
                check_allowed(name)
            names |= remote
        for name in sorted(names):
            p = d / name
            want = man.files.get(name, {}).get("size")
            fresh = p.is_file() and want is not None and p.stat().st_size == int(want)
            if everything or not fresh:
                try:
                    self.objects.get_file(self._rel(policy, version, name), p)
                    self.bytes_fetched += p.stat().st_size
                except FileNotFoundError:
                    pass  # _verify names the missing file

    def prune(
        self, policy: str, *, keep_last: int, keep_every: int = 0, protect: set[int] | None = None
    ) -> list[int]:
        """Delete old versions, keeping the newest `keep_last`, every `keep_every`-th
        (milestones for curves) and any in `protect` (named by a checkpoint), and
        every version a kept delta version is rebuilt from (its chain to the snapshot).
        Version 0 is always kept: it is every run's baseline, and the base that every
        adapter version of a LoRA policy applies to (BASE_FILE)."""
        vs = self.versions(policy)
        keep = set(vs[-keep_last:]) if keep_last > 0 else set(vs)
        keep |= protect or set()
        keep |= {0} & set(vs)  # version 0 is every run's baseline
        if keep_every > 0:
            keep |= {v for v in vs if v % keep_every == 0}
        for v in sorted(keep & set(vs), reverse=True):  # a kept delta keeps its chain
            m = self._known(policy, v)
            while m.delta is not None and m.delta["parent"] in vs:
                keep.add(m.delta["parent"])
                m = self._known(policy, m.delta["parent"])
        removed = []
        for v in vs:
            if v not in keep:
                # Remove the manifest first so the version vanishes atomically.
                self.objects.delete(self._rel(policy, v, MANIFEST))
                self.objects.delete_tree(self._rel(policy, v))
                removed.append(v)
        return removed
