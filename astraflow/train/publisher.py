"""Publishing a saved version, off the trainer's critical path when deltas are on.

    step ─► copy the weights ─► Publisher.publish ─► [thread] save_policy(staging), hash,
        delta against the parent, rename or upload, manifest last; prune; kick the mirror

In async mode the save and all after it run in one background thread while the
trainer goes on: it saves a copy of the weights taken at hand-over (docs/weights.md). The version number is fixed when the
version is handed over, after the previous publish has finished, so numbers and
chains stay in order. A checkpoint waits for the pending publish first, so it never
names a version that is not out; a SIGKILL mid-publish leaves a payload without a
manifest (invisible), as a synchronous one does. An error in the thread is raised by
the trainer's next call. In sync mode (the worker reads the version at once) it
publishes in the caller.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import torch

from astraflow import testing
from astraflow.config.store import StoreSpec
from astraflow.stores.mirror import Mirror
from astraflow.stores.weights import WeightStore


def frozen_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of `model`'s state dict that later updates do not touch, for a background
    write. Tensors that share storage (a head tied to the embeddings) stay shared, so the
    saved version ties them as the model does."""
    copies: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], torch.Tensor] = {}
    out = {}
    with torch.no_grad():
        for name, t in model.state_dict().items():
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
                   tuple(t.stride()))
            if key not in copies:
                copies[key] = t.detach().clone()
            out[name] = copies[key]
    return out


class Publisher:
    def __init__(self, weights: WeightStore, policy: str, store: StoreSpec, mirror: Mirror,
                 *, background: bool):
        self.weights, self.policy, self.store, self.mirror = weights, policy, store, mirror
        self.background = background
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def publish(self, staging: Path, *, step: int, parent: int | None, lineage: int,
                write: Callable[[], None] | None = None) -> int:
        """Publish `staging` as the next version; returns its number (in the background:
        before its manifest is written). `write`: what fills `staging` (the version's
        files), run first, in the background too: it must not read weights the caller
        goes on changing."""
        self.wait()
        if not self.background:
            if write is not None:
                write()
            return self._publish(staging, step, parent, lineage, None)
        latest = self.weights.latest(self.policy)
        version = 0 if latest is None else latest + 1
        self._thread = threading.Thread(target=self._run, name=f"publish-{self.policy}",
                                        args=(write, staging, step, parent, lineage, version),
                                        daemon=True)
        self._thread.start()
        return version

    def wait(self) -> None:
        """Until the pending publish is out; raises what it raised."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"publishing {self.policy} failed") from err

    def _run(self, write: Callable[[], None] | None, *args) -> None:
        try:
            if write is not None:
                write()
            self._publish(*args)
        except BaseException as err:  # raised again in the trainer by wait()
            self._error = err

    def _publish(self, staging: Path, step: int, parent: int | None, lineage: int,
                 version: int | None) -> int:
        version = self.weights.publish(
            self.policy, staging, step=step, parent=parent, lineage=lineage, version=version,
            delta_chain=self.store.delta_chain,
            before_manifest=lambda v: testing.kill_before_manifest(self.policy, v))
        self.weights.prune(self.policy, keep_last=self.store.keep_last,
                           keep_every=self.store.keep_every)
        self.mirror.kick()
        return version
