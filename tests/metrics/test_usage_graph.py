"""`/usage`, `/graph`, `/healthz`, `/readyz` over real HTTP."""

from __future__ import annotations

import json
import socket

import pytest

from gpumgr.metrics import build_app, parse_addr, start_http
from gpumgr.topology.render import render_tree
from tests.metrics.node import GIB, MIB, MODEL, SimNode
from tests.metrics.scrape import get, serving


@pytest.fixture
def node(tmp_path):
    return SimNode(tmp_path)


async def test_usage_lists_cards_holders_requests_and_usage(node):
    key = await node.place("train", "main", (0,), cores=30, memory_mib=4096, pids=[101, 102])
    await node.place("big", "worker", (2, 3), cores=200, memory_mib=0, pids=[300], verified=False,
                     qos="guaranteed")
    node.sim.set_process(0, 101, used_memory_bytes=GIB, sm_util=20)
    node.sim.set_process(0, 102, used_memory_bytes=512 * MIB, sm_util=5)
    node.sim.set_process(3, 300, used_memory_bytes=3 * GIB, sm_util=60)
    node.sim.set_temperature(3, 71)
    await node.state.set_reason(1, "temperature", True)

    async with serving(node) as server:
        status, ctype, text = await get(server.url + "/usage")
    assert status == 200 and ctype.startswith("application/json")
    doc = json.loads(text)

    assert doc["node"] == "node-a"
    cards = {c["index"]: c for c in doc["cards"]}
    assert (cards[0]["model"], cards[0]["mode"], cards[0]["allocated_cores"], cards[0]["free_cores"]) == \
        (MODEL, "shared", 30, 70)
    assert (cards[0]["allocated_memory_mib"], cards[0]["free_memory_mib"]) == (4096, 16384 - 4096)
    assert cards[0]["used_memory_mib"] == 1536 and cards[0]["utilization"] == 25
    assert cards[0]["holders"] == [key]
    assert cards[1]["healthy"] is False and cards[1]["unhealthy_reasons"] == ["temperature"]
    assert cards[3]["mode"] == "exclusive" and cards[3]["temperature_c"] == 71
    assert cards[3]["free_cores"] == 0 and cards[3]["free_memory_mib"] == 0

    holders = {h["pod"]: h for h in doc["holders"]}
    t = holders["train"]
    assert (t["namespace"], t["container"], t["cards"], t["cores"], t["memory_mib"], t["verified"]) == \
        ("ml", "main", [0], 30, 4096, True)
    assert t["pids"] == [101, 102] and t["pids_error"] is None
    assert t["usage"]["used_memory_mib"] == 1536 and t["usage"]["utilization"] == 25
    assert t["usage"]["per_card"] == [{"gpu": 0, "used_memory_mib": 1536, "utilization": 25}]
    assert t["created"] == 1700000000 and t["container_id"].startswith("containerd://")
    b = holders["big"]
    assert b["verified"] is False and b["request_memory_mib"] == 2 * 16384 and b["cores"] == 200
    assert b["usage"]["per_card"] == [{"gpu": 2, "used_memory_mib": 0, "utilization": 0},
                                      {"gpu": 3, "used_memory_mib": 3072, "utilization": 60}]


async def test_usage_says_why_a_container_has_no_pids(node):
    await node.place("pending", "main", (1,), cores=20, memory_mib=512, pids=[], running=False)
    await node.place("gone", "main", (1,), cores=20, memory_mib=512, pids=[9])
    node.pods.pop(node.uids["gone"])
    async with serving(node) as server:
        _, _, text = await get(server.url + "/usage")
    holders = {h["pod"]: h for h in json.loads(text)["holders"]}
    assert "no ID" in holders["pending"]["pids_error"]
    assert holders["gone"]["pids_error"] == "pod not found"
    assert holders["gone"]["pids"] == []


async def test_graph_has_the_tree_with_free_capacity(node):
    await node.place("train", "main", (0,), cores=30, memory_mib=4096, pids=[1])
    await node.place("big", "main", (2,), cores=100, memory_mib=0, pids=[2])
    await node.state.set_reason(3, "ecc", True)
    async with serving(node) as server:
        status, _, text = await get(server.url + "/graph")
        tstatus, tctype, tree_text = await get(server.url + "/graph?format=text")
        bstatus, bctype, bad = await get(server.url + "/graph?format=xml")

    assert status == 200
    tree = json.loads(text)["tree"]
    assert tree["level"] == "ROOT" and tree["gpus"] == [0, 1, 2, 3]
    # card 0 shared (70 cores, 12288 MiB), card 1 free, card 2 held whole, card 3 unhealthy
    assert tree["free"] == {"whole_cards": 1, "cores": 170, "memory_mib": 12288 + 16384}

    def find(n, gpus):
        if n["gpus"] == gpus:
            return n
        return next((f for c in n["children"] if (f := find(c, gpus))), None)

    pair = find(tree, [0, 1])
    assert pair["level"] == "PIX" and pair["free"]["cores"] == 170
    leaf = find(tree, [2])
    assert leaf["level"] == "GPU" and leaf["card"]["mode"] == "exclusive" and leaf["free"]["whole_cards"] == 0
    assert find(tree, [3])["card"]["healthy"] is False
    assert find(tree, [2, 3])["free"] == {"whole_cards": 0, "cores": 0, "memory_mib": 0}

    assert tstatus == 200 and tctype.startswith("text/plain")
    assert tree_text == render_tree(node.state.topology, node.state.ledger, node.inv) + "\n"
    assert bstatus == 400 and bctype.startswith("application/json") and "xml" in json.loads(bad)["error"]


async def test_healthz_and_readyz_follow_the_agent(node):
    ready = {"now": False}
    async with serving(node, ready=lambda: ready["now"]) as server:
        assert (await get(server.url + "/healthz"))[0] == 200
        assert (await get(server.url + "/readyz"))[0] == 503
        ready["now"] = True
        status, _, text = await get(server.url + "/readyz")
    assert status == 200 and json.loads(text) == {"ready": True}


async def test_a_taken_port_is_a_clear_error(node):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            await start_http(build_app(node.metrics, node.reader()), "127.0.0.1", port)


def test_parse_addr():
    assert parse_addr("0.0.0.0:5678") == ("0.0.0.0", 5678)
    assert parse_addr(":9400") == ("0.0.0.0", 9400)
    assert parse_addr("127.0.0.1") == ("127.0.0.1", 5678)
    assert parse_addr("[::1]:80") == ("::1", 80)
    for bad in ("host:port", "h:70000", "[::1", "h:\u0668\u0660", "h:\uff18\uff10", "h:\u00b2"):  # no Unicode digits
        with pytest.raises(ValueError, match="metrics address"):
            parse_addr(bad)
