"""A weight version's manifest, the mark that it exists, and the rules its files obey.

The manifest lists every stored file by size and sha256; a delta version also names
its chain and the files it serves once rebuilt (`stores.deltas`). Only formats that
cannot run code when loaded are allowed.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow.stores import deltas

MANIFEST = "MANIFEST.json"
FORMAT = 1
#: Only formats that cannot execute code when loaded.
ALLOWED_SUFFIXES = (".safetensors", ".json", ".txt", ".jinja", ".md", deltas.SUFFIX)
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
    delta: dict[str, Any] | None = None
    """A delta version (stores.deltas.header): its parent, snapshot, depth, and the
    files it serves once rebuilt; None for a whole version."""

    @property
    def total_bytes(self) -> int:
        """Bytes stored (a delta version: its payload)."""
        return sum(int(f["size"]) for f in self.files.values())

    @property
    def served(self) -> dict[str, dict[str, Any]]:
        """The files a loaded version holds (name -> size, sha256)."""
        return self.delta["served"] if self.delta else self.files


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_allowed(name: str) -> None:
    if not name.endswith(ALLOWED_SUFFIXES):
        raise WeightError(
            f"refusing weight file {name!r}: only {', '.join(ALLOWED_SUFFIXES)} are allowed "
            f"(pickle-based formats such as .bin/.pt can run code when loaded; save with safetensors)"
        )


def cache_root() -> Path:
    return Path(os.environ.get("ASTRAFLOW_CACHE", Path.home() / ".cache" / "astraflow"))
