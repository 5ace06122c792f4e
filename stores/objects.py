"""Files under one root — a local directory or `s3://bucket/prefix` — with one API.

Weights, checkpoints and progress files are whole files that are written once
and read many times, so all they need from storage is: put a file so that it
is complete or invisible, get it, list a folder, delete a folder. pyarrow's
filesystems give exactly that for local disk and S3 without another client
library. Atomicity:

    local  write to a hidden temp name in the same folder, then rename
    S3     one PUT per object is already all-or-nothing

Every call retries transient failures within the store's retry budget
(`stores.retry`), and errors name the store with credentials redacted.
"""

from __future__ import annotations

import os
import shutil
import stat
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from astraflow.stores import retry
from astraflow.stores.uri import S3Settings, arrow_filesystem, is_remote

CHUNK = 8 << 20


def _replace(path: Path, fill: Callable[[Path], object]) -> None:
    """Write `path` atomically: `fill` a hidden temp file beside it, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        fill(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _local_sizes(base: Path) -> dict[str, int]:
    """Size of every regular file below `base`, keyed by '/'-path relative to it.

    Files come and go while we list: a staged temp file is renamed into place, an old
    version or checkpoint is pruned. A file (or folder) that vanishes between the
    listing and its stat was not there, so it is left out rather than raising (a
    trainer once crashed on exactly that). os.walk skips a folder it cannot list."""
    out: dict[str, int] = {}
    for folder, _, files in os.walk(base):
        for name in files:
            path = os.path.join(folder, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                out[Path(path).relative_to(base).as_posix()] = st.st_size
    return out


class ObjectStore:
    """Whole-file storage rooted at `uri` (paths below are '/'-separated, relative)."""

    def __init__(self, uri: str | Path, *, retry_budget_s: float = retry.DEFAULT_BUDGET_S,
                 settings: S3Settings | None = None):
        self.uri = str(uri).rstrip("/")
        self.remote = is_remote(uri)
        self.budget_s = retry_budget_s
        self.settings = settings
        self.fs, self.base = arrow_filesystem(uri, settings=settings)
        self._obs: Any = None  # an obstore client, made on the first bulk delete
        if not self.remote:
            Path(self.base).mkdir(parents=True, exist_ok=True)

    # -- paths ---------------------------------------------------------------
    def path(self, rel: str) -> str:
        return f"{self.base}/{rel}".rstrip("/") if rel else self.base

    def local(self, rel: str = "") -> Path | None:
        """The local path of `rel` when the store is a local directory, else None."""
        return None if self.remote else Path(self.path(rel))

    def _call(self, fn, what: str, **kw: Any):
        return retry.call(fn, what=f"{what} at {self.uri}", budget_s=self.budget_s, **kw)

    # -- writes --------------------------------------------------------------
    def put_bytes(self, rel: str, data: bytes) -> None:
        """Write `data` so that readers see the old object or the new one, never half."""
        target = self.path(rel)
        if not self.remote:
            def fill(tmp: Path) -> None:
                with tmp.open("wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())

            _replace(Path(target), fill)
            return

        def put() -> None:
            with self.fs.open_output_stream(target) as out:
                out.write(data)

        self._call(put, f"writing {rel}")

    def put_file(self, src: Path, rel: str) -> None:
        """Upload a local file (locally: copy it in under a temp name, then rename)."""
        target = self.path(rel)
        if not self.remote:
            _replace(Path(target), lambda tmp: shutil.copyfile(src, tmp))
            return

        def put() -> None:
            with Path(src).open("rb") as f, self.fs.open_output_stream(target) as out:
                for chunk in iter(lambda: f.read(CHUNK), b""):
                    out.write(chunk)

        self._call(put, f"uploading {rel}")

    # -- reads ---------------------------------------------------------------
    def get_bytes(self, rel: str) -> bytes:
        """The object's bytes; FileNotFoundError if it does not exist."""
        target = self.path(rel)
        if not self.remote:
            return Path(target).read_bytes()

        def get() -> bytes:
            with self.fs.open_input_stream(target) as f:
                return f.read()

        return self._call(get, f"reading {rel}")

    def get_many(self, rels: list[str]) -> dict[str, bytes]:
        """The bytes of every object in `rels` that exists (missing ones are left out).

        On S3: one GET each, all in flight together (obstore). pyarrow's input
        streams cost a HEAD before each GET, so a committer reading 64 markers paid
        128 round trips, 16 at a time."""
        if not self.remote:
            out = {}
            for rel in rels:
                try:
                    out[rel] = Path(self.path(rel)).read_bytes()
                except FileNotFoundError:
                    pass
            return out
        if not rels:
            return {}
        import asyncio

        import obstore
        from obstore.exceptions import NotFoundError

        store, keys = self._obstore(), self._keys(rels)

        async def one(key: str) -> bytes | None:
            try:
                return bytes(await (await obstore.get_async(store, key)).bytes_async())
            except (NotFoundError, FileNotFoundError):  # obstore raises the latter here
                return None

        async def every() -> list[bytes | None]:
            sem = asyncio.Semaphore(64)

            async def bounded(key: str) -> bytes | None:
                async with sem:
                    return await one(key)

            return await asyncio.gather(*(bounded(k) for k in keys))

        got = self._call(lambda: asyncio.run(every()), f"reading {len(rels)} objects")
        return {r: b for r, b in zip(rels, got, strict=True) if b is not None}

    def _keys(self, rels: list[str]) -> list[str]:
        """Object keys inside the bucket (obstore's paths) of `rels`."""
        prefix = self.path("").partition("/")[2]
        return [f"{prefix}/{r}" if prefix else r for r in rels]

    def get_file(self, rel: str, dst: Path) -> None:
        """Download to `dst` (written under a temp name, then renamed)."""
        def get(tmp: Path) -> None:
            with self.fs.open_input_stream(self.path(rel)) as f, tmp.open("wb") as out:
                for chunk in iter(lambda: f.read(CHUNK), b""):
                    out.write(chunk)

        _replace(dst, lambda tmp: self._call(lambda: get(tmp), f"downloading {rel}"))

    def exists(self, rel: str) -> bool:
        if not self.remote:
            return Path(self.path(rel)).exists()
        info = self._call(lambda: self.fs.get_file_info(self.path(rel)), f"checking {rel}")
        return info.type != pafs.FileType.NotFound

    def walk(self, rel: str = "") -> list[str]:
        """Every file below `rel`, as paths relative to `rel` (one listing on S3)."""
        return sorted(self.sizes(rel))

    def sizes(self, rel: str = "") -> dict[str, int]:
        """Size of every file below `rel`, keyed like `walk` (one listing on S3)."""
        root = self.path(rel)
        if not self.remote:
            return _local_sizes(Path(root))
        sel = pafs.FileSelector(root, recursive=True, allow_not_found=True)
        infos = self._call(lambda: self.fs.get_file_info(sel), f"listing {rel or '/'}")
        n = len(root) + 1
        return {i.path[n:]: i.size for i in infos if i.type == pafs.FileType.File}

    def numbered(self, rel: str, prefix: str, marker: str) -> list[int]:
        """N for every folder `<rel>/<prefix><N>/` that holds `marker`, ascending.

        How weight versions and checkpoints are listed: a folder counts only
        once its manifest (the marker, written last) exists. One listing on S3.
        """
        local = self.local(rel)
        if local is not None:
            names = ([d.name for d in local.iterdir() if (d / marker).is_file()]
                     if local.exists() else [])
        else:
            names = [d for d, _, f in (p.partition("/") for p in self.walk(rel)) if f == marker]
        n = len(prefix)
        return sorted({int(x[n:]) for x in names if x.startswith(prefix) and x[n:].isdigit()})

    # -- deletes -------------------------------------------------------------
    def delete(self, rel: str) -> None:
        target = self.path(rel)
        if not self.remote:
            Path(target).unlink(missing_ok=True)
            return

        def rm() -> None:
            try:
                self.fs.delete_file(target)
            except FileNotFoundError:
                pass

        self._call(rm, f"deleting {rel}")

    def delete_many(self, rels: list[str]) -> None:
        """Delete every object in `rels` (missing ones are fine).

        On S3: one DeleteObjects request per 1,000 keys (obstore, the Rust
        object_store client Lance itself uses). Why not pyarrow: its `delete_file`
        costs four requests per object (HEAD it, DELETE it, HEAD its folder, PUT an
        empty folder marker so the folder "still exists"), measured through the
        latency proxy; a committer settling 64 staged batches paid 256 round trips.
        """
        if not rels:
            return
        if not self.remote:
            for rel in rels:
                Path(self.path(rel)).unlink(missing_ok=True)
            return
        import obstore

        store, keys = self._obstore(), self._keys(rels)
        self._call(lambda: obstore.delete(store, keys), f"deleting {len(rels)} objects")

    def _obstore(self) -> Any:
        """An obstore S3 client on this store's bucket (made once: bulk reads and deletes)."""
        if self._obs is None:
            from obstore.store import S3Store

            s = self.settings or S3Settings.from_env()
            config: dict[str, Any] = {"region": s.region or "us-east-1"}
            if s.endpoint:
                config["endpoint"] = s.endpoint
            if s.access_key and s.secret_key:
                config.update(access_key_id=s.access_key, secret_access_key=s.secret_key)
                if s.session_token:
                    config["session_token"] = s.session_token
            client = {"allow_http": bool(s.endpoint and s.endpoint.startswith("http://")),
                      "connect_timeout": "2s", "timeout": "10s"}
            self._obs = S3Store(self.path("").partition("/")[0], config=config,
                                client_options=client,
                                retry_config={"max_retries": 1,
                                              "retry_timeout": timedelta(seconds=10)})
        return self._obs

    def delete_tree(self, rel: str) -> None:
        target = self.path(rel)
        if not self.remote:
            shutil.rmtree(target, ignore_errors=True)
            return

        def rm() -> None:
            try:
                self.fs.delete_dir(target)
            except FileNotFoundError:
                pass

        self._call(rm, f"deleting {rel}/")
