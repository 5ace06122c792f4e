"""Delta versions of the weight store: publish one against its parent, rebuild one.

A delta version is rebuilt in the local cache from the newest version of its chain
that the cache already holds verified (a worker's previous one: only the deltas
after it are fetched) or else from the chain's full snapshot. Every rebuilt file is
checked against the manifest's sha256 and all of them against the trainer's digest;
a missing or tampered delta raises TamperedWeights, as a bad file of a whole version
does. `WeightStore` (stores/weights.py) mixes this in.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from astraflow.stores import deltas
from astraflow.stores.manifest import Manifest, TamperedWeights, WeightError

log = logging.getLogger("astraflow.weights")


class Chains:
    """The delta half of WeightStore; it relies on the store's own methods."""

    def _encode(self, policy: str, version: int, src: Path, entries: dict[str, dict[str, Any]],
                parent: int, chain: int, keep_src: bool) -> tuple[Path, dict, bool] | None:
        """Write `src` as a delta against `parent` into a new folder; `src` itself becomes
        the publisher's own copy (`keep_own`). None: store it whole (chain full, parent
        gone, or no file to delta)."""
        try:
            pm = self.manifest(policy, parent)
            depth = pm.delta["depth"] + 1 if pm.delta else 1
            old = self._own(policy, pm) if depth <= chain else None
        except WeightError as err:  # pruned, or refused: a snapshot needs no parent
            log.info("%s v%d published whole: parent v%d unusable (%s)", policy, version,
                     parent, err)
            return None
        names = [n for n in entries if old is not None and deltas.deltable(n, src / n, old)]
        if not names:
            return None
        out = src.with_name(f"{src.name}.delta")
        out.mkdir()
        for p in src.iterdir():
            if p.name in names:
                deltas.encode(old / p.name, p, out / deltas.payload_name(p.name))
            else:
                shutil.copy2(p, out / p.name)
        base = pm.delta["base"] if pm.delta else parent
        self.keep_own(policy, version, src, move=not keep_src)
        return out, deltas.header(parent, base, depth, entries), False

    def _own_dir(self, policy: str, version: int) -> Path:
        return self._cache_dir(policy, version).with_name(f".published-v{version:08d}")

    def keep_own(self, policy: str, version: int, src: Path, *, move: bool) -> None:
        """Keep what the publisher published as the parent of its next delta, apart from
        readers' rebuilt copies (a reader on the same machine rebuilds, as elsewhere)."""
        own = self._own_dir(policy, version)
        own.parent.mkdir(parents=True, exist_ok=True)
        for old in own.parent.glob(".published-v*"):
            shutil.rmtree(old, ignore_errors=True)
        (shutil.move if move else shutil.copytree)(src, own)

    def _own(self, policy: str, pm: Manifest) -> Path:
        """The parent's files: the publisher's own copy if it verifies, else a load."""
        own = self._own_dir(policy, pm.version)
        return own if self._holds(policy, pm, own) else self.load(policy, pm.version, manifest=pm)

    def _rebuild(self, policy: str, man: Manifest, *, refresh: bool) -> Path:
        """A delta version's files, rebuilt in the cache: walk the chain back to the
        newest version whose verified copy the cache holds (a worker's last one) or to
        the snapshot, then apply each delta forward, verifying every rebuilt file."""
        chain, start = [man], None
        while start is None:
            m = chain[-1]
            d = self._cache_dir(policy, m.version)
            if not refresh and m.delta is not None and self._holds(policy, m, d):
                start = d
            elif m.delta is None:
                start = self.load(policy, m.version, refresh=refresh, manifest=m)
            else:
                chain.append(self._known(policy, m.delta["parent"]))
        for m in reversed(chain):
            if m.delta is None or start == self._cache_dir(policy, m.version):
                continue
            start = self._apply(policy, m, start, refresh=refresh)
        self._trim_cache(start.parent, man.version)
        return start

    def _holds(self, policy: str, m: Manifest, d: Path) -> bool:
        """Whether the cache holds a verified copy of a version (sizes first: cheap)."""
        if not all((d / n).is_file() and (d / n).stat().st_size == int(f["size"])
                   for n, f in m.served.items()):
            return False
        try:
            self._verify(policy, m.version, m.served, d)
        except TamperedWeights:
            return False
        return True

    def _apply(self, policy: str, m: Manifest, old: Path, *, refresh: bool) -> Path:
        """Rebuild version `m` from its parent's files in `old`; returns its folder."""
        assert m.delta is not None
        d = self._cache_dir(policy, m.version)
        payload = self._payload(policy, m, refresh=refresh)
        tmp = d.with_name(f".build-{d.name}-{uuid.uuid4().hex[:8]}")
        tmp.mkdir(parents=True)
        try:
            for name in m.files:
                if name.endswith(deltas.SUFFIX):
                    deltas.decode(old / deltas.served_name(name), payload / name,
                                  tmp / deltas.served_name(name))
                else:
                    shutil.copy2(payload / name, tmp / name)
            self._verify(policy, m.version, m.served, tmp)
            if deltas.digest(m.served) != m.delta["digest"]:
                raise TamperedWeights(f"{policy} v{m.version}: the rebuilt tensors' digest "
                                      f"does not match the trainer's")
            shutil.rmtree(d, ignore_errors=True)
            os.replace(tmp, d)
        except (ValueError, OSError) as err:  # zstd, or a parent file of the wrong length
            raise TamperedWeights(f"{policy} v{m.version}: its delta does not apply: {err}") from err
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            if self.objects.remote:
                shutil.rmtree(payload, ignore_errors=True)
        return d

    def payload(self, policy: str, version: int, manifest: Manifest | None = None) -> Path:
        """A version's stored objects as they are (a delta version: its payload), verified
        against the manifest, in a local folder (on S3 a download the caller removes)."""
        m = manifest or self.manifest(policy, version)
        return self._payload(policy, m, refresh=False) if m.delta else self.load(
            policy, version, manifest=m)

    def _payload(self, policy: str, m: Manifest, *, refresh: bool) -> Path:
        local = self.objects.local(self._rel(policy, m.version))
        d = local if local is not None else self._cache_dir(policy, m.version).with_name(
            f".payload-v{m.version:08d}")
        if local is None:
            self._download(policy, m.version, m, d, everything=refresh)
        else:
            self.bytes_fetched += m.total_bytes
        self._verify(policy, m.version, m.files, d)
        return d

