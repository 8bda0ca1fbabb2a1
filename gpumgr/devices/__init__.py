"""Device discovery: what GPUs a node has and how they are wired.

Two backends behind `Backend`: `NvmlBackend` (real, nvidia-ml-py) and `SimulatedBackend` (a node spec).
"""

from gpumgr.devices.backend import Backend
from gpumgr.devices.simulated import SimulatedBackend
from gpumgr.devices.spec import inventory_from_topo_file, load_node_spec
from gpumgr.devices.topo_text import TopoMatrix, TopoParseError, parse_topo_text
from gpumgr.devices.types import GPU, DiscoveryError, GPUStatus, HealthEvent, Inventory, ProcessUsage

__all__ = [
    "GPU", "Backend", "DiscoveryError", "GPUStatus", "HealthEvent", "Inventory", "ProcessUsage",
    "SimulatedBackend", "TopoMatrix", "TopoParseError", "inventory_from_topo_file", "load_node_spec",
    "parse_topo_text",
]
