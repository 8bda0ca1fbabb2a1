"""A small Kubernetes API server for tests and the demo, spoken to by the real `kubernetes` client.

    with ThreadedKubeApiServer() as api:            # or: async with KubeApiServer() as api
        api.write_kubeconfig(tmp_path / "kubeconfig")
        api.store.create_node({"metadata": {"name": "node-1"}})

Supports core/v1 pods, nodes and events (get, list with label and field selectors and paging, watch with
resume and 410, create, replace, merge / strategic-merge / JSON patch, delete, status subresource), pod
bindings, discovery, and 409 conflicts on stale resourceVersions; and resource.k8s.io/v1 ResourceSlices,
ResourceClaims (status subresource), ResourceClaimTemplates and DeviceClasses with the same verbs.
"""

from gpumgr.sim.kubeapi.errors import ApiError
from gpumgr.sim.kubeapi.kubeconfig import write_kubeconfig
from gpumgr.sim.kubeapi.server import KubeApiServer, ThreadedKubeApiServer
from gpumgr.sim.kubeapi.store import KubeStore, WatchEvent

__all__ = ["ApiError", "KubeApiServer", "KubeStore", "ThreadedKubeApiServer", "WatchEvent",
           "write_kubeconfig"]
