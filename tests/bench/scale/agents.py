"""A stand-in for the agents of all nodes in `both` mode, as far as the scheduler can see them: when a
device-plugin pod (vcuda annotations) is bound to a node, that node's ResourceSlice is published again with the
cards' capacity minus what the node's device-plugin pods hold (gpumgr.dra.slices.build_spec's `held_elsewhere`,
as gpumgr/dra/publisher.py does), generation + 1. The real agent does so once the kubelet admitted the pod, a
little later than here; the node's own check of every claim (which settles the race, docs/dra.md) has no
stand-in, so the audit shows what the scheduler over-committed before the node would refuse it."""

from __future__ import annotations

import queue
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from gpumgr.requests import podspec
from tests.bench.scale.fleet import UNIT_MIB, FakeNode, slice_body


class SliceFollower:
    def __init__(self, make_client: Callable[[], Any], nodes: dict[str, FakeNode]):
        self.make_client = make_client
        self.nodes = nodes
        self.held: dict[str, dict[int, tuple[int, int]]] = defaultdict(dict)
        self.generation: dict[str, int] = defaultdict(lambda: 1)
        self.updates = 0
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="slice-follower", daemon=True)

    def start(self) -> SliceFollower:
        self._thread.start()
        return self

    def pod_bound(self, pod: dict[str, Any]) -> None:
        self._queue.put(pod)

    def stop(self, restore: bool = True) -> None:
        """Stop following; with `restore`, publish every touched node's slice without holdings again."""
        self._queue.put(None)
        self._thread.join(timeout=60)
        if restore:
            custom = self._custom()
            for name in list(self.held):
                self.held[name] = {}
                self._publish(custom, name)

    def _custom(self) -> Any:
        from kubernetes import client as k

        return k.CustomObjectsApi(self.make_client())

    def _run(self) -> None:
        custom = self._custom()
        while (pod := self._queue.get()) is not None:
            node = self.nodes.get(pod["spec"].get("nodeName") or "")
            if node is None:
                continue
            changed = False
            ann = pod["metadata"].get("annotations") or {}
            for i, c in enumerate(pod["spec"]["containers"]):
                text = ann.get(f"{podspec.ANN_PREDICATE_IDX}{i}")
                if not text:
                    continue
                limits = (c.get("resources") or {}).get("limits") or {}
                cores = int(limits.get(podspec.RESOURCE_CORE, 0))
                for m in (int(x) for x in text.split(",") if x):
                    card = next(g for g in node.inventory.gpus if g.minor == m)
                    held_cores, held_mib = self.held[node.name].get(card.index, (0, 0))
                    if cores >= 100:
                        held_cores, held_mib = 100, card.memory_mib
                    else:
                        held_cores += cores
                        held_mib += int(limits.get(podspec.RESOURCE_MEMORY, 0)) * UNIT_MIB
                    self.held[node.name][card.index] = (held_cores, held_mib)
                    changed = True
            if changed:
                self._publish(custom, node.name)

    def _publish(self, custom: Any, name: str) -> None:
        self.generation[name] += 1
        body = slice_body(self.nodes[name], self.generation[name], dict(self.held[name]))
        current = custom.get_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", body["metadata"]["name"])
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        custom.replace_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", body["metadata"]["name"],
                                             body, _preload_content=False)
        self.updates += 1
