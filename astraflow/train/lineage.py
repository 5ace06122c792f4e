"""Staleness by lineage: how many trained versions separate a row's weights from ours.

Version numbers are not a clock of training: after a rollback the trainer republishes
its restored model as a new version (v7 with parent v3), so v3's rows are fresh while
the lost v4..v6 sit on a dead branch. Every version therefore carries a *depth*
(`Manifest.lineage`, trained versions on its ancestry; a republish without new
updates keeps its source's depth), and a row's staleness is its distance in the
lineage tree to the trainer's version,
depth(current) − depth(fork) + depth(behaviour) − depth(fork),
which without rollbacks is `current − behaviour`. The trainer's own versions live in
its checkpoint; others are read from their manifests once. A version that cannot be
placed (manifest pruned, never recorded) gets staleness None, which the staleness
stage drops; a pre-lineage manifest counts its version number as its depth.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from astraflow.stores.weights import Manifest, WeightError


@dataclass(frozen=True)
class Node:
    parent: int | None
    depth: int


class Lineage:
    """The lineage tree of one policy's versions, resolved lazily from manifests."""

    def __init__(self, read_manifest: Callable[[int], Manifest],
                 nodes: dict[int, Node] | None = None):
        self._read = read_manifest
        self.nodes: dict[int, Node] = dict(nodes or {})
        self._missing: set[int] = set()
        self._chain_of: int | None = None
        self._chain: dict[int, int] = {}

    # -- persistence (checkpoint meta is JSON) -------------------------------------
    def to_json(self) -> dict[str, list[int | None]]:
        return {str(v): [n.parent, n.depth] for v, n in sorted(self.nodes.items())}

    @classmethod
    def from_json(cls, read_manifest: Callable[[int], Manifest],
                  data: dict[str, list[int | None]]) -> Lineage:
        nodes = {}
        for v, (parent, depth) in data.items():
            if depth is None:
                raise ValueError(f"lineage of v{v} in the checkpoint has no depth")
            nodes[int(v)] = Node(parent, int(depth))
        return cls(read_manifest, nodes)

    # -- resolution ----------------------------------------------------------------
    def add(self, version: int, parent: int | None, depth: int) -> None:
        """Record a version this trainer published (no manifest read needed)."""
        self.nodes[version] = Node(parent, depth)
        self._missing.discard(version)

    def node(self, version: int) -> Node | None:
        """The version's place in the tree, from memory or its manifest; None if its
        manifest is gone and it was never recorded."""
        known = self.nodes.get(version)
        if known is not None:
            return known
        if version in self._missing:
            return None
        try:
            man = self._read(version)
        except WeightError:
            self._missing.add(version)
            return None
        node = Node(man.parent, version if man.lineage is None else int(man.lineage))
        self.nodes[version] = node
        return node

    def depth(self, version: int) -> int:
        node = self.node(version)
        if node is None:
            raise WeightError(f"v{version}: no manifest and not in the trainer's lineage record, "
                              f"so its lineage depth is unknown")
        return node.depth

    def _ancestors(self, version: int) -> dict[int, int]:
        """version → depth for `version` and every ancestor that can be resolved."""
        if self._chain_of != version:
            chain: dict[int, int] = {}
            v: int | None = version
            while v is not None and v not in chain:
                node = self.node(v)
                if node is None:
                    break
                chain[v] = node.depth
                v = node.parent
            self._chain_of, self._chain = version, chain
        return self._chain

    def staleness(self, current: int, behavior: int) -> int | None:
        """Tree distance in trained versions from `behavior` to `current`; None when
        `behavior` cannot be placed in the tree."""
        chain = self._ancestors(current)
        if current not in chain:
            raise WeightError(f"v{current}, the trainer's own version, is not resolvable")
        seen: set[int] = set()
        v: int | None = behavior
        while v is not None and v not in seen:
            seen.add(v)
            if v in chain:
                fork = chain[v]
                return chain[current] - fork + self.nodes[behavior].depth - fork
            node = self.node(v)
            if node is None:
                return None
            v = node.parent
        return None

    def staleness_of(self, current: int, behaviors: Iterable[int]) -> dict[int, int | None]:
        """`staleness` for each distinct behaviour version."""
        return {b: self.staleness(current, b) for b in set(behaviors)}
