"""The cost tree: exact on every hierarchy, rendered like gpu-manager's, pairwise costs for meshes."""

from __future__ import annotations

import itertools

import pytest

from gpumgr.allocator import Ledger
from gpumgr.devices.topo_text import parse_topo_text
from gpumgr.topology.cost import Topology, TreeNode
from gpumgr.topology.render import render_tree
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


# -- NUMA breaks ties between sets whose links are equal (all-NVLink 8-GPU boards) ------------------------------

def _numa_node(prefix: str) -> tuple[Topology, Ledger]:
    from gpumgr.devices.spec import inventory_from_topo_file

    inv = inventory_from_topo_file(topo_path(prefix), memory_mib=81920)
    assert len({g.numa_node for g in inv.gpus}) > 1, "the fixture must carry NUMA affinity"
    return Topology(inv.levels, numa=[g.numa_node for g in inv.gpus]), Ledger(g.memory_mib for g in inv.gpus)


def _hold(ledger: Ledger, *cards: int) -> None:
    from gpumgr.allocator import Allocation

    for c in cards:
        ledger.assign(Allocation(key=f"held-{c}", cards=(c,), cores=100, memory_mib=0))


@pytest.mark.parametrize("prefix, pair", [("princeton-della-pli", (4, 5)), ("dgx-a100", (4, 5))])
def test_a_pair_after_three_single_cards_stays_on_one_numa_node(prefix, pair):
    """All pairs are NV18/NV12; after 0-2 are taken, [3,4] would cross sockets while other free pairs share a node."""
    from gpumgr.allocator import Request, choose

    topo, ledger = _numa_node(prefix)
    _hold(ledger, 0, 1, 2)
    cards = choose(topo, ledger, Request(cores=200)).cards
    assert cards == pair
    assert len({topo.numa[c] for c in cards}) == 1


def test_a_single_card_is_taken_where_it_leaves_numa_groups_whole():
    """NUMA 0 = GPU0-3, NUMA 1 = GPU4-7. With 5, 6, 7 held, GPU4 is alone on its node: take it, keep 0-3 whole."""
    from gpumgr.allocator import Request, choose

    topo, ledger = _numa_node("princeton-della-pli")
    _hold(ledger, 5, 6, 7)
    assert choose(topo, ledger, Request(cores=100)).cards == (4,)
    assert choose(topo, ledger, Request(cores=30, memory_mib=1024)).cards == (4,)


def test_without_numa_nothing_changes():
    topo = Topology([["X", "NV18", "NV18"], ["NV18", "X", "NV18"], ["NV18", "NV18", "X"]])
    assert topo.numa == (None, None, None)
    assert topo.numa_span([0, 1, 2]) == 0
    with pytest.raises(ValueError, match="NUMA"):
        Topology([["X", "PIX"], ["PIX", "X"]], numa=[0])


def test_tree_text_comes_with_the_level_matrix():
    from gpumgr.topology.render import render_levels

    topo = topology_of(topo_path("p40"))
    lines = render_levels(topo).splitlines()
    assert lines[0].split() == ["GPU0", "GPU1", "GPU2", "GPU3", "GPU4", "GPU5", "GPU6"]
    assert lines[1].split() == ["GPU0", "X", "PIX", "PIX", "PHB", "PHB", "PHB", "PHB"]
    assert len(lines) == 1 + 7


def test_card_table_says_used_like_gpumgr_status():
    """`checkpoint show` and the demo print this table; `gpumgr status` counts what is USED: so does it."""
    from gpumgr.allocator import Allocation
    from gpumgr.topology.render import render_cards

    ledger = Ledger([16384, 16384])
    ledger.assign(Allocation("default/p/main", (1,), 30, 1024))
    lines = render_cards(ledger).splitlines()
    assert lines[0].split()[:8] == ["GPU", "MODEL", "MODE", "HEALTH", "CORES", "USED", "MEMORY", "ALLOCATED"]
    assert "0/100" in lines[1] and "0/16384 MiB" in lines[1]
    assert "30/100" in lines[2] and "1024/16384 MiB" in lines[2]
