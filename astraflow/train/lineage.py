"""Staleness by lineage: how many trained versions separate a row's weights from ours.

Version numbers are not a clock of training. After a rollback the trainer
republishes its restored model as a new version (v7 with parent v3, say):
rows sampled by v3, or by v7, come from exactly the weights the trainer holds,
yet `7 − 3` would call the v3 rows four versions stale. And the versions lost
with the rolled-back steps (v4..v6) sit on a dead branch: by number they look
*fresher* than v3, by lineage they are as far from us as their distance
through the fork point.

So every version carries a *depth* (`Manifest.lineage`): the number of trained
versions on its ancestry. A trainer's publish after new updates has depth
parent + 1; a republish of restored weights carrying no update since the
version they were published as keeps that version's depth (+1 if the
checkpoint holds updates that version lacks). The staleness of a row is its
distance in the lineage tree to the trainer's current version:

    depth(current) − depth(fork) + depth(behaviour) − depth(fork)

where fork is the nearest ancestor of the behaviour version that is also an
ancestor of (or is) the current one. Without rollbacks this is exactly
`current − behaviour`, the old definition.

Resolution: the trainer knows the versions it published (kept in its
checkpoint, so they survive restarts); any other version is read from its
manifest once and cached. A version whose manifest was pruned and which the
trainer never recorded cannot be placed: its rows get staleness None, which
the staleness stage drops as stale (we cannot bound how far such weights are;
in practice these are dead-branch versions pruned before a restart). A
manifest written before lineage existed counts its version number as its
depth, which reproduces the old definition for old runs.
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
