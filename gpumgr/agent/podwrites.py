"""What the device-plugin front end writes on pods: the annotations of a verified container (`predicate-gpu-idx-<i>`,
`gpu-assigned`), warning events, and failing a pod that can never fit (an event, then the Failed status; its
unverified holdings freed, its later PreStarts refused). All of it runs in the background, a few calls at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from gpumgr.agent.release import Releasing
from gpumgr.node.claims import is_claim
from gpumgr.requests import podspec

log = logging.getLogger("gpumgr.agent")

FAIL_ATTEMPTS, FAIL_RETRY_S = 4, 0.5  # marking a pod Failed: attempts, and the first pause between them
FAILING_KEPT = 1024  # pods decided to fail at PreStart that are remembered (their later PreStarts are refused)
FAIL_REASON = "GPUAllocationUnfit"  # pod condition and event reason when a pod is failed at PreStart


class PodWrites(Releasing):
    def schedule_annotations(self, uid: str) -> None:
        if self.annotator is not None:
            self._background(self._annotate(uid))

    async def _warn(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        if self.annotator is not None:
            async with self._api_slots:
                await self.annotator.record_event(pod, reason, message)

    async def _annotate(self, uid: str) -> None:
        pod = self.pods.get(uid)
        if pod is None or self.annotator is None:
            return
        mine = [(h.container_index, a) for a in self.state.ledger.allocations.values()
                if (h := a.container_holder) is not None and h.pod_uid == uid and a.verified and not h.init]
        inv = self.state.inventory
        ann: dict[str, str | None] = {
            f"{podspec.ANN_PREDICATE_IDX}{index}": ",".join(str(inv.gpus[c].minor) for c in a.cards)
            for index, a in mine
        }
        wanted = {(ask.index) for ask in podspec.gpu_containers(pod)}
        done = {index for index, _ in mine}
        if wanted <= done:
            ann[podspec.ANN_ASSIGNED] = "true"
        meta = pod["metadata"]
        for attempt in range(5):
            try:
                async with self._api_slots:
                    await self.annotator.patch_pod_annotations(meta.get("namespace", "default"), meta["name"], ann)
                return
            except Exception as e:  # noqa: BLE001 - retried, then logged
                log.warning("annotating pod %s/%s failed (attempt %d): %s", meta.get("namespace"), meta.get("name"),
                            attempt + 1, e)
                await asyncio.sleep(0.2 * 2 ** attempt)

    async def drain(self) -> None:
        """Wait for pending annotation patches (tests, shutdown)."""
        if self._annotate_tasks:
            await asyncio.gather(*list(self._annotate_tasks), return_exceptions=True)

    async def _fail_pod(self, pod: Mapping[str, Any], container: str, key: str, why: str) -> None:
        """A container that can never be given what it asks: the pod is marked Failed with a condition and an event
        that say why and what to do (in the background), its later PreStarts are refused, and what it holds that
        no started container uses is freed: `key` and the pod's other unverified allocations. Verified ones belong
        to containers that are running; reconcile frees them once the pod is really terminal."""
        self.prestart_failures += 1
        meta = pod["metadata"]
        uid = str(meta["uid"])
        message = (f"container {container}: {why}. The GPU share it was admitted with cannot hold it; delete the pod "
                   "(its controller recreates it) so that it is admitted again where it fits")
        log.error("prestart: failing pod %s/%s: %s (failures so far: %d)", meta.get("namespace"), meta.get("name"),
                  message, self.prestart_failures)
        self._failing[uid] = message
        while len(self._failing) > FAILING_KEPT:
            self._failing.popitem(last=False)
        mine = [a.key for a in self.state.ledger.allocations.values()
                if (a.pod_uid == uid or a.key == key) and not is_claim(a) and not a.verified]
        await self.release(mine, "its pod was failed at PreStartContainer", unverified_only=True)
        if self.annotator is not None:
            self._background(self._mark_failed(pod, message))

    async def _mark_failed(self, pod: Mapping[str, Any], message: str) -> None:
        """The event, then the Failed status (retried a few times: until it is written, the pod's containers that
        were started keep running and their shares stay held)."""
        meta = pod["metadata"]
        if self.annotator is None:
            return
        try:
            async with self._api_slots:
                await self.annotator.record_event(pod, FAIL_REASON, message)
        except Exception as e:  # noqa: BLE001 - the refusal still tells the kubelet
            log.warning("could not record the event of failing pod %s/%s: %s", meta.get("namespace"),
                        meta.get("name"), e)
        for attempt in range(FAIL_ATTEMPTS):
            try:
                async with self._api_slots:
                    await self.annotator.fail_pod(str(meta.get("namespace", "default")), str(meta["name"]),
                                                  FAIL_REASON, message)
                return
            except Exception as e:  # noqa: BLE001 - its PreStarts are refused all the same
                log.warning("could not mark pod %s/%s Failed (attempt %d of %d): %s", meta.get("namespace"),
                            meta.get("name"), attempt + 1, FAIL_ATTEMPTS, e)
            await asyncio.sleep(FAIL_RETRY_S * 2 ** attempt)
