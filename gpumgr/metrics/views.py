"""The JSON documents of `/graph` (the topology tree with free capacity) and `/usage` (cards, holders, usage).

Pure functions of the node's state; `gpumgr status` reads exactly these shapes (documented in docs/metrics.md).
"""

from __future__ import annotations

from typing import Any

from gpumgr.allocator import Ledger
from gpumgr.devices.types import Inventory
from gpumgr.metrics.usage import MIB, CardSnapshot, HolderSnapshot, NodeSnapshot
from gpumgr.topology.cost import Topology, TreeNode


def graph_json(node: str, topo: Topology, ledger: Ledger, inv: Inventory,
               cordoned: frozenset[int] | None = None) -> dict[str, Any]:
    def free(gpus: tuple[int, ...]) -> dict[str, int]:
        cards = [ledger.cards[g] for g in gpus]
        usable = [c for c in cards if c.healthy and c.mode != "exclusive"]
        return {
            "whole_cards": sum(1 for c in cards if c.healthy and c.mode == "free"),
            "cores": sum(c.free_cores for c in usable),
            "memory_mib": sum(c.free_memory_mib for c in usable),
        }

    def walk(n: TreeNode) -> dict[str, Any]:
        doc: dict[str, Any] = {"level": n.level, "gpus": list(n.gpus), "free": free(n.gpus)}
        if n.level == "GPU":
            c = ledger.cards[n.gpus[0]]
            g = inv.gpus[c.index]
            doc["card"] = {
                "index": c.index, "uuid": g.uuid, "model": g.name, "mode": c.mode, "healthy": c.healthy,
                "memory_mib": c.memory_mib, "free_cores": c.free_cores, "free_memory_mib": c.free_memory_mib,
                "holders": sorted(c.holders),
            }
            if cordoned is not None:  # only when the agent follows the node's cordon annotation
                doc["card"]["cordoned"] = c.index in cordoned
        doc["children"] = [walk(ch) for ch in n.children]
        return doc

    return {"node": node, "tree": walk(topo.tree)}


def usage_json(snap: NodeSnapshot) -> dict[str, Any]:
    return {
        "node": snap.node,
        "cards": [_card(c) for c in snap.cards],
        "holders": [_holder(h) for h in snap.holders],
        "cordon_error": snap.cordon_error or None,
    }


def _card(c: CardSnapshot) -> dict[str, Any]:
    s = c.status
    known = s is not None and not s.lost
    return {
        "index": c.index, "uuid": c.uuid, "model": c.model, "memory_mib": c.memory_mib,
        "healthy": c.healthy, "unhealthy_reasons": list(c.reasons), "mode": c.mode,
        "allocated_cores": c.allocated_cores, "allocated_memory_mib": c.allocated_memory_mib,
        "free_cores": c.free_cores, "free_memory_mib": c.free_memory_mib, "holders": list(c.holders),
        "used_memory_mib": round(s.used_memory_bytes / MIB, 1) if known and s else None,
        "utilization": s.utilization if known and s else None,
        "temperature_c": s.temperature_c if known and s else None,
        "lost": bool(s and s.lost),
        "status_error": c.error or None,
        "cordoned": c.cordoned,
    }


def _holder(h: HolderSnapshot) -> dict[str, Any]:
    return {
        "key": h.key, "pod": h.pod, "namespace": h.namespace, "container": h.container, "pod_uid": h.pod_uid,
        "cards": list(h.cards), "cores": h.cores, "memory_mib": h.memory_mib,
        "request_memory_mib": h.request_memory_mib, "verified": h.verified, "created": h.created,
        "container_id": h.container_id or None, "pids": list(h.pids), "pids_error": h.pids_error or None,
        "compute_modes": dict(sorted(h.compute_modes.items())),  # card UUID -> how the shim measures, if it said
        "compute_enforcement": dict(sorted(h.compute_enforcement.items())),  # device UUID -> process|gpm|none
        "usage": {
            "per_card": [
                {"gpu": i, "used_memory_mib": round(u.memory_bytes / MIB, 1), "utilization": u.sm_util}
                for i, u in sorted(h.use.items())
            ],
            "used_memory_mib": round(h.memory_bytes / MIB, 1),
            "utilization": h.sm_util,
        },
    }
