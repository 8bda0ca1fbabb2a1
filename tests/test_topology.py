"""The cost tree: exact on every hierarchy, rendered like gpu-manager's, pairwise costs for meshes."""

from __future__ import annotations

import itertools

import pytest

from gpumgr.allocator import Ledger
from gpumgr.devices.topo_text import parse_topo_text
from gpumgr.render import render_tree
from gpumgr.topology import Topology, TreeNode
from tests.helpers import TOPO_FILES, topo_path


def topology_of(path) -> Topology:
    return Topology(parse_topo_text(path.read_text()).levels)


def lca(tree: TreeNode, a: int, b: int) -> TreeNode:
    node = tree
    while True:
        nxt = [c for c in node.children if a in c.gpus and b in c.gpus]
        if not nxt:
            return node
        node = nxt[0]


def leaves(node: TreeNode) -> list[int]:
    return list(node.gpus) if not node.children else [g for c in node.children for g in leaves(c)]


@pytest.mark.parametrize("path", TOPO_FILES, ids=lambda p: p.name)
def test_tree_is_exact_where_the_levels_are_a_hierarchy(path):
    topo = topology_of(path)
    assert topo.tree.level == "ROOT"
    assert sorted(leaves(topo.tree)) == list(range(topo.n))
    pcie_only = not any(topo.levels[i][j].startswith("NV") for i in range(topo.n) for j in range(topo.n) if i != j)
    if pcie_only:
        assert topo.is_hierarchy(), "every real PCIe-only matrix is a hierarchy"
    if topo.is_hierarchy():
        for a, b in itertools.combinations(range(topo.n), 2):
            assert lca(topo.tree, a, b).level == topo.levels[a][b], (a, b)


def test_p40_tree_matches_the_real_hierarchy():
    """gpu-manager mis-grouped this node; the real one is two PIX switches under one PHB."""
    tree = topology_of(topo_path("p40")).tree
    (phb,) = tree.children
    assert phb.level == "PHB"
    assert [(c.level, c.gpus) for c in phb.children] == [("PIX", (0, 1, 2)), ("PIX", (3, 4, 5, 6))]


def test_nvlink_pairs_inside_pcie_sockets():
    tree = topology_of(topo_path("baobab")).tree
    (sys_,) = tree.children
    assert sys_.level == "SYS"
    assert [c.level for c in sys_.children] == ["NODE", "NODE"]
    assert [g.gpus for g in sys_.children[0].children] == [(0, 1), (2, 3)]
    assert sys_.children[0].children[0].level == "NV4"


def test_hybrid_cube_mesh_is_not_a_hierarchy_and_costs_stay_pairwise():
    topo = topology_of(topo_path("dgx1"))
    assert not topo.is_hierarchy()
    assert topo.levels[0][3] == "NV2" and topo.levels[0][1] == "NV1" and topo.levels[0][5] == "SYS"
    assert topo.costs[0][3] < topo.costs[0][1] < topo.costs[0][5]
    assert topo.graph.edges[0, 3]["level"] == "NV2"


def test_rendering_shows_root_groups_and_free_capacity():
    topo = topology_of(topo_path("p40"))
    ledger = Ledger([16384] * 7)
    text = render_tree(topo, ledger)
    lines = text.splitlines()
    assert lines[0].startswith("ROOT (free: 7/7 whole, 700 cores")
    assert lines[1].startswith("`-- PHB")
    assert any(line.strip().startswith("|-- PIX") for line in lines)
    assert "GPU3 (free, cores 100/100, memory 16384/16384 MiB)" in text


def test_bad_matrices_are_refused():
    with pytest.raises(ValueError, match="not symmetric"):
        Topology([["X", "PIX"], ["PHB", "X"]])
    with pytest.raises(ValueError, match="unknown link level"):
        Topology([["X", "FAST"], ["FAST", "X"]])
    with pytest.raises(ValueError, match="row 1 has 1 entries"):
        Topology([["X", "PIX"], ["PIX"]])
