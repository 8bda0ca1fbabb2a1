"""The label that routes the scheduler's calls to the leader: `gpumgr.io/extender-leader: "true"` on its own pod.

The extender's Service selects it, so every replica can be Ready (synced, its election alive) while the Service
sends traffic to the leader alone, and pods of an older release (which never set it) drop out of rotation.
A leader that has made its view current takes the label from any other pod of its namespace still carrying it
(a previous leader that died or was cut off), then sets it on its own pod; it removes it from its own pod when
it stops leading. Which pod is its own comes from the downward API (POD_NAME, POD_NAMESPACE); without it (a
test, a process outside a cluster) nothing is written, which is logged once.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from gpumgr.extender.kubeaccess import ApiCallError

if TYPE_CHECKING:
    from gpumgr.extender.podcalls import PodCalls

log = logging.getLogger(__name__)

LEADER_LABEL = "gpumgr.io/extender-leader"


class LeaderLabel:
    def __init__(self, calls: PodCalls, pod_name: str | None = None, namespace: str | None = None):
        self.calls = calls
        self.pod_name = (os.environ.get("POD_NAME", "") if pod_name is None else pod_name).strip()
        self.namespace = (os.environ.get("POD_NAMESPACE", "") if namespace is None else namespace).strip()
        self._told = False

    @property
    def enabled(self) -> bool:
        if self.pod_name and self.namespace:
            return True
        if not self._told:
            self._told = True
            log.info("POD_NAME or POD_NAMESPACE is not set: the leader does not label its pod %s "
                     "(a Service selecting that label would route to no replica)", LEADER_LABEL)
        return False

    async def mark(self) -> None:
        """Take the label from other pods that still carry it, then set it on this pod (raises ApiCallError)."""
        if not self.enabled:
            return
        for pod in await self.calls.list_pods(self.namespace, f"{LEADER_LABEL}=true"):
            name = _name(pod)
            if name and name != self.pod_name:
                log.info("leader election: taking label %s from pod %s/%s (a previous leader)", LEADER_LABEL,
                         self.namespace, name)
                await self._set(name, None)
        await self._set(self.pod_name, "true")
        log.info("leader election: pod %s/%s labelled %s=true: the Service routes to it", self.namespace,
                 self.pod_name, LEADER_LABEL)

    async def unmark(self) -> None:
        """Remove the label from this pod (raises ApiCallError)."""
        if self.enabled:
            await self._set(self.pod_name, None)
            log.info("leader election: label %s removed from pod %s/%s", LEADER_LABEL, self.namespace, self.pod_name)

    async def _set(self, name: str, value: str | None) -> None:
        try:
            await self.calls.patch_pod(self.namespace, name, {"metadata": {"labels": {LEADER_LABEL: value}}})
        except ApiCallError as e:
            if e.status != 404 or value is not None:  # a pod that is gone carries no label
                raise


def _name(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else ""
