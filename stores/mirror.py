"""Cross-region weight replicas: copy each published version to stores near the workers.

Workers in another region or cloud should not pull every version across an ocean
(slow, and egress is billed per byte per worker). A `Mirror` copies each new version
once into every replica, and workers there read the replica (`--region`). The copy
keeps the weight store's contract:

    source   `load` verifies every file against the source manifest (sha256)
    replica  files are uploaded first, then checked by size in one listing,
             then the manifest — identical to the source's — is written last

so a replica version exists exactly when all its bytes are there; a mirror killed
mid-copy leaves an invisible folder that the next pass overwrites. A delta version
is copied as stored (its payload), after the versions it is rebuilt from. Replicas
keep the newest `keep_last` versions (and version 0), with their chains.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from astraflow.stores.uri import redact
from astraflow.stores.weights import WeightError, WeightStore

log = logging.getLogger("astraflow.mirror")


def mirror_version(src: WeightStore, dst: WeightStore, policy: str, version: int) -> None:
    """Copy one verified version from `src` into `dst`, manifest last."""
    man = src.manifest(policy, version)
    path = src.payload(policy, version, man)  # TamperedWeights rather than copy bad bytes
    try:
        dst.publish(policy, path, step=man.step, keep_src=True, expect=man)
    finally:
        if man.delta is not None and src.objects.remote:
            shutil.rmtree(path, ignore_errors=True)  # a download of the payload


def _with_chains(src: WeightStore, policy: str, versions: list[int], have: set[int]) -> list[int]:
    """`versions` in the order to copy them: each after the chain it is rebuilt from
    (the missing part of it), newest first otherwise."""
    out: list[int] = []
    for v in versions:
        chain, m = [], src.manifest(policy, v)
        while m.delta is not None and m.delta["parent"] not in have | set(out) | set(chain):
            chain.append(m.delta["parent"])
            m = src.manifest(policy, m.delta["parent"])
        out += [c for c in reversed(chain) if c not in out] + ([v] if v not in out else [])
    return out


def sync_replica(src: WeightStore, dst: WeightStore, policy: str, *, keep_last: int) -> list[int]:
    """Bring `dst` up to date with the newest `keep_last` versions of `src` (and v0).

    Newest first: workers want the newest version soonest. Returns the versions
    copied. Another mirror racing on the same version is harmless: publish
    refuses a version whose manifest exists, and we skip it.
    """
    want = src.versions(policy)
    if not want:
        return []
    have = set(dst.versions(policy))
    todo = _with_chains(src, policy, [
        v for v in sorted({*want[-keep_last:], *({0} & set(want))}, reverse=True)
        if v not in have], have)
    copied = []
    for v in todo:
        try:
            mirror_version(src, dst, policy, v)
        except WeightError as err:
            if dst.has(policy, v):
                continue  # another mirror got there first
            if v not in src.versions(policy):
                continue  # pruned at the source while we copied
            raise RuntimeError(redact(f"mirroring {policy} v{v} to {dst.objects.uri}: {err}")) from err
        copied.append(v)
    if len(have) + len(copied) > keep_last + 1:
        dst.prune(policy, keep_last=keep_last)
    return copied


@dataclass
class Mirror:
    """A background thread that keeps every replica of one policy current.

    The trainer calls `kick()` after each publish and goes on training; a
    replica that is unreachable is retried on the next kick (within the store's
    retry budget per call) and never stops the trainer; `errors` counts the
    passes that failed.
    """

    src: WeightStore
    replicas: Sequence[tuple[str, WeightStore]]
    policy: str
    keep_last: int
    _wake: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    errors: int = 0

    def start(self) -> Mirror:
        if self.replicas and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"mirror-{self.policy}",
                                            daemon=True)
            self._thread.start()
            self.kick()  # catch up on whatever a previous trainer left unmirrored
        return self

    def kick(self) -> None:
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the pass in progress (so the newest version is out), then stop."""
        if self._thread is None:
            return
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)

    def sync_once(self) -> dict[str, list[int]]:
        out = {}
        for region, dst in self.replicas:
            t0 = time.time()
            try:
                out[region] = sync_replica(self.src, dst, self.policy, keep_last=self.keep_last)
            except Exception as err:  # an unreachable replica must not stop training
                self.errors += 1
                log.warning("mirror of %s to %s failed, retrying on the next publish: %s",
                            self.policy, region, redact(err))
                continue
            if out[region]:
                log.info("mirrored %s v%s to %s in %.1fs", self.policy,
                         ",".join(map(str, out[region])), region, time.time() - t0)
        return out

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            self.sync_once()
            if self._stop.is_set():
                return
