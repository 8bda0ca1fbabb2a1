"""The device plugins' MIG holdings (whole instances of `<prefix><profile>`, shares of `<prefix><profile>.shared`)
brought to what the kubelet holds, as for the vcuda allocations (gpumgr/agent/reconcile.py), from the kubelet
checkpoint and the node's pods:

- a holding the kubelet records for a live pod is kept, and named after that pod and container (so /metric and
  `gpumgr status` name the pod, not the ledger key); a share's vDevice server runs with its limits;
- a holding whose pod is finished or gone, or that the kubelet never recorded within the grace (an admission that
  failed, a pod deleted before it ran), is released (a share's vDevice server stops).

The kubelet checkpoint unreadable: nothing is released on its account."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gpumgr.agent.gone import gone
from gpumgr.agent.round_pods import RoundPods
from gpumgr.allocator import Allocation, Ledger
from gpumgr.deviceplugin.mig_shared import holder_of, is_share, start_share_server
from gpumgr.node import binding
from gpumgr.node.claims import is_claim
from gpumgr.node.kubelet_checkpoint import KubeletCheckpointError
from gpumgr.vdevice.layout import allocation_key

if TYPE_CHECKING:
    from gpumgr.agent.release import Releasing as ServiceBase

log = logging.getLogger("gpumgr.mig")


@dataclass
class Report:
    named: int = 0
    released: int = 0
    servers: int = 0


def recorded_keys(entries: list[tuple[str, str, str, tuple[str, ...]]], resources: Mapping[str, str]) \
        -> dict[str, tuple[str, str]]:
    """{ledger key: (pod UID, container)} of the kubelet's entries for the MIG resources. A whole instance is held
    under its own key (one per instance); a share's key is that of the container's replica IDs."""
    out: dict[str, tuple[str, str]] = {}
    for uid, container, resource, ids in entries:
        if resource not in resources:
            continue
        if resource.endswith(".shared"):
            out[allocation_key(ids)] = (uid, container)
        else:
            for i in ids:
                out[allocation_key([i])] = (uid, container)
    return out


async def reconcile_holdings(service: ServiceBase, resources: Mapping[str, str], grace_s: float, why: str,
                             full: bool = True, round_pods: RoundPods | None = None) -> Report:
    """`resources`: the MIG resources the agent serves ({resource: profile}); `round_pods`: the round's pods, as
    the vcuda reconcile saw them (listed here when not given)."""
    state = service.state
    report = Report()
    mine = {k: a for k, a in state.ledger.allocations.items() if a.mig is not None and not is_claim(a)}
    if not mine:
        return report
    try:
        ckpt = await service.kubelet_checkpoint()
    except KubeletCheckpointError as e:
        log.error("MIG holdings (%s): kubelet checkpoint unreadable, nothing freed on its account: %s", why, e)
        return report
    entries = [(e.pod_uid, e.container_name, e.resource_name, tuple(e.device_ids)) for e in ckpt.entries]
    recorded = recorded_keys(entries, resources)
    view = round_pods if round_pods is not None else RoundPods(service.pods)
    pods = view.by_uid
    now = time.time()
    release: list[str] = []
    maybe_gone: list[tuple[str, str]] = []
    rename: dict[str, Allocation] = {}
    for key, a in mine.items():
        owner = recorded.get(key)
        if owner is not None:
            pod = pods.get(owner[0])
            if pod is None:
                maybe_gone.append((key, owner[0]))
            elif not binding.is_live(pod):
                release.append(key)
            elif a.pod_uid != str(pod["metadata"]["uid"]) or a.container != owner[1] or not a.verified:
                rename[key] = replace(a, holder=holder_of(pod, owner[1]), verified=True)
            continue
        if a.pod_uid:  # named before, no longer recorded: freed when its pod is gone or finished
            pod = pods.get(a.pod_uid)
            if pod is not None and not binding.is_live(pod):
                release.append(key)
            elif pod is None:
                maybe_gone.append((key, a.pod_uid))
        elif full and now - (a.created or 0) > grace_s:
            release.append(key)  # never recorded by the kubelet: its admission failed or was never completed
    release += await gone(view, [(k, uid) for k, uid in maybe_gone if view.predates(mine[k])])  # others: next round
    if release:
        freed = await service.release(release, f"MIG holdings ({why}): no live pod holds it", expect=mine)
        report.released = len(freed)
    if rename:
        def name(led: Ledger) -> int:
            n = 0
            for key, want in rename.items():
                if led.held_by(key) == mine[key]:
                    led.release(key)
                    led.assign(want, check_health=False)
                    n += 1
            return n

        report.named = await state.commit(name)
    for a in list(state.ledger.allocations.values()):
        if is_share(a) and a.verified and binding.is_live(pods.get(a.pod_uid) or {"status": {"phase": "Failed"}}):
            before = service.vdevices.running().get(a.key)
            try:
                limits = await start_share_server(service, a)
            except (OSError, ValueError, RuntimeError) as e:
                log.error("MIG share %s: vDevice server not started: %s", a.key, e)
                continue
            report.servers += int(limits is not None and limits != before)
    if report.released or report.named or report.servers:
        log.info("MIG holdings (%s): released %d, named %d, vDevice servers started %d", why, report.released,
                 report.named, report.servers)
    return report
