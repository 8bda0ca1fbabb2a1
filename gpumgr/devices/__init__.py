"""Device discovery: what GPUs a node has and how they are wired.

Two backends behind `Backend`: `NvmlBackend` (real, nvidia-ml-py) and `SimulatedBackend` (a node spec). Both also
offer `MigBackend` (MIG cards, instances, create/destroy): `mig_nvml.py` through nvidia-ml-py, `mig_sim.py` in memory.
`fake_nvml_node.py` writes the node file of the fake libnvidia-ml.so.1 the tests and the demo run on.
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
