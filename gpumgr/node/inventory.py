"""The node annotation through which the agent tells the extender what the node has.

Key `gpumgr.io/gpu-inventory` on the Node; value JSON:
    {"version": 1, "memory_unit_mib": 256, "unhealthy": [3],
     "inventory": {"gpus": [...], "levels": [[...]], "driver_version": "...", "cuda_driver_version": "..."},
     "mig": {...}}
`mig` (only on a node with MIG-enabled cards; mig_inventory.py) lists their profiles, placements and instances: a
reader that knows no MIG ignores it, so the version stays 1.
Card numbers in `unhealthy` are NVML indices; pod annotations name cards by minor (`/dev/nvidiaN`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpumgr.devices.types import Inventory
from gpumgr.node.mig_inventory import MigSectionError, NodeMig

VERSION = 1


class InventoryAnnotationError(ValueError):
    pass


def encode(inv: Inventory, unhealthy: set[int] | frozenset[int], memory_unit_mib: int,
           mig: NodeMig | None = None) -> str:
    doc: dict[str, Any] = {"version": VERSION, "memory_unit_mib": memory_unit_mib, "unhealthy": sorted(unhealthy),
                           "inventory": inv.to_json()}
    if mig is not None and mig.cards:
        doc["mig"] = mig.to_json()
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def decode(text: str) -> NodeGPUs:
    try:
        doc: Any = json.loads(text)
        if not isinstance(doc, dict) or int(doc.get("version", 0)) != VERSION:
            raise InventoryAnnotationError(f"unsupported inventory annotation version {doc.get('version')!r}")
        inv = Inventory.from_json(doc["inventory"])
        unhealthy = frozenset(int(i) for i in doc.get("unhealthy", []))
        unit = int(doc.get("memory_unit_mib", 256))
        mig = NodeMig.from_json(doc["mig"]) if "mig" in doc else None
    except MigSectionError as e:
        raise InventoryAnnotationError(f"malformed inventory annotation: {e}") from None
    except InventoryAnnotationError:
        raise
    except Exception as e:  # noqa: BLE001 - any malformed document is one kind of error here
        raise InventoryAnnotationError(f"malformed inventory annotation: {e}") from None
    return NodeGPUs(inventory=inv, unhealthy=unhealthy, memory_unit_mib=unit, mig=mig)


@dataclass(frozen=True)
class NodeGPUs:
    inventory: Inventory
    unhealthy: frozenset[int]
    memory_unit_mib: int
    mig: NodeMig | None = None  # MIG-enabled cards: profiles, placements, instances

    def index_of_minor(self, minor: int) -> int | None:
        return next((g.index for g in self.inventory.gpus if g.minor == minor), None)
