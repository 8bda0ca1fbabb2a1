"""Cost matrix and cost tree of a node's GPUs.

The tree groups GPUs by the link that joins them (single-linkage over the level order). Where the pairwise
levels form a hierarchy (every PCIe-only topology, and NVLink pairs inside a PCIe hierarchy), the lowest common
ancestor of any two GPUs carries exactly their pairwise level. An NVLink mesh such as the DGX-1 hybrid cube mesh is
not a hierarchy: there a group is labelled with the worst link inside it, and the allocator uses the pairwise
costs, never the tree alone.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from gpumgr.topology import levels as lv

if TYPE_CHECKING:
    import networkx as nx

    from gpumgr.devices.types import Inventory


class Topology:
    """Pairwise levels of N GPUs, with derived keys, costs, graph and tree, and each GPU's NUMA node when known.

    The NUMA node only breaks ties between choices whose links are equal (on an all-NVLink board every pair is
    NV#, yet the cards hang off two sockets); where it is unknown (None) it changes nothing."""

    def __init__(self, levels: Sequence[Sequence[str]], numa: Sequence[int | None] | None = None):
        n = len(levels)
        if numa is not None and len(numa) != n:
            raise ValueError(f"{len(numa)} NUMA nodes given for {n} GPUs")
        self.numa: tuple[int | None, ...] = tuple(numa) if numa is not None else (None,) * n
        rows: list[tuple[str, ...]] = []
        for i, row in enumerate(levels):
            if len(row) != n:
                raise ValueError(f"level matrix row {i} has {len(row)} entries, expected {n}")
            rows.append(tuple("X" if i == j else lv.normalize(row[j]) for j in range(n)))
        for i, j in itertools.combinations(range(n), 2):
            if rows[i][j] != rows[j][i]:
                raise ValueError(f"level matrix is not symmetric at GPU{i}-GPU{j}: {rows[i][j]} vs {rows[j][i]}")
        self.levels: tuple[tuple[str, ...], ...] = tuple(rows)
        self.n = n
        self.keys: tuple[tuple[lv.LevelKey, ...], ...] = tuple(
            tuple((-1, 0) if i == j else lv.key(rows[i][j]) for j in range(n)) for i in range(n)
        )
        self.costs: tuple[tuple[float, ...], ...] = tuple(
            tuple(0.0 if i == j else lv.cost(rows[i][j]) for j in range(n)) for i in range(n)
        )

    @classmethod
    def of(cls, inv: Inventory) -> Topology:
        """The topology of a node's inventory: its level matrix and each GPU's NUMA node."""
        return cls(inv.levels, numa=[g.numa_node for g in inv.gpus])

    # -- pairwise -------------------------------------------------------------------------------------------
    def worst(self, gpus: Iterable[int]) -> lv.LevelKey:
        """Worst link key among a set (a single card has no link: (-1, 0))."""
        g = list(gpus)
        return max((self.keys[a][b] for a, b in itertools.combinations(g, 2)), default=(-1, 0))

    def total_cost(self, gpus: Iterable[int]) -> float:
        g = list(gpus)
        return sum(self.costs[a][b] for a, b in itertools.combinations(g, 2))

    def numa_span(self, gpus: Iterable[int]) -> int:
        """NUMA nodes a set of GPUs spans (those known): 1 is one socket, 0 when unknown."""
        return len({self.numa[g] for g in gpus if self.numa[g] is not None})

    def numa_peers(self, gpu: int, others: Iterable[int]) -> int:
        """Of `others`, the GPUs on the same (known) NUMA node as `gpu`."""
        mine = self.numa[gpu]
        return 0 if mine is None else sum(1 for o in others if o != gpu and self.numa[o] == mine)

    def distinct_keys(self) -> list[lv.LevelKey]:
        return sorted({self.keys[i][j] for i in range(self.n) for j in range(self.n) if i != j})

    @cached_property
    def graph(self) -> nx.Graph:
        """Complete graph of the GPUs, edges weighted by cost and labelled with level and key."""
        import networkx as nx  # on demand: ~0.1 s and ~12 MiB the node agent does not otherwise need

        g = nx.Graph()
        g.add_nodes_from(range(self.n))
        for a, b in itertools.combinations(range(self.n), 2):
            g.add_edge(a, b, level=self.levels[a][b], key=self.keys[a][b], weight=self.costs[a][b])
        return g

    def is_hierarchy(self) -> bool:
        """True when the levels are an ultrametric: the tree then reproduces every pair exactly."""
        k = self.keys
        return all(
            k[a][c] <= max(k[a][b], k[b][c]) for a, b, c in itertools.permutations(range(self.n), 3)
        )

    # -- tree -----------------------------------------------------------------------------------------------
    @cached_property
    def tree(self) -> TreeNode:
        root = TreeNode(level="ROOT", gpus=tuple(range(self.n)))
        if self.n == 1:
            root.children.append(TreeNode(level="GPU", gpus=(0,)))
        elif self.n > 1:
            root.children.append(self._group(frozenset(range(self.n))))
        return root

    def _group(self, members: frozenset[int]) -> TreeNode:
        if len(members) == 1:
            (g,) = members
            return TreeNode(level="GPU", gpus=(g,))
        ordered = sorted(members)
        worst = self.worst(ordered)
        # single linkage: the smallest threshold that connects the members, then split below it
        threshold = self._bottleneck(ordered)
        parts = self._components(ordered, below=threshold)
        node = TreeNode(level=lv.name(worst), gpus=tuple(ordered))
        for part in sorted(parts, key=min):
            node.children.append(self._group(part))
        return node

    def _bottleneck(self, members: list[int]) -> lv.LevelKey:
        for t in self.distinct_keys():
            if len(self._components(members, below=t, inclusive=True)) == 1:
                return t
        raise AssertionError("complete graph is always connected")

    def _components(self, members: list[int], below: lv.LevelKey, inclusive: bool = False) -> list[frozenset[int]]:
        """The groups of `members` joined by links better than `below` (union-find over the pairs)."""
        parent = {m: m for m in members}

        def root(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for a, b in itertools.combinations(members, 2):
            k = self.keys[a][b]
            if k < below or (inclusive and k == below):
                parent[root(a)] = root(b)
        groups: dict[int, set[int]] = {}
        for m in members:
            groups.setdefault(root(m), set()).add(m)
        return [frozenset(g) for g in groups.values()]

    def group_of(self, gpus: Iterable[int]) -> TreeNode:
        """Smallest tree group containing all the given GPUs."""
        want = set(gpus)
        node = self.tree
        while True:
            nxt = [c for c in node.children if want <= set(c.gpus)]
            if not nxt:
                return node
            node = nxt[0]


@dataclass
class TreeNode:
    level: str  # ROOT, GPU, or the level joining the group's members
    gpus: tuple[int, ...]
    children: list[TreeNode] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {"level": self.level, "gpus": list(self.gpus), "children": [c.to_json() for c in self.children]}
