"""The scrape-time collector: turns one `NodeSnapshot` into metric families.

- gpu-manager's four container metrics, names and labels unchanged (`pod_name`, `namespace`, `node`,
  `container_name`, plus `gpu`/`gpu_memory` = `gpu<index>` per card and `total`, or `req_of_gpu`/
  `req_of_gpu_memory` = `total`);
- per card (`gpu` = `gpu<index>`, `uuid`, `model`): allocation, usage, temperature, health, XID errors, holders;
- the node state's checkpoint counters, and how long the snapshot took.

`collect()` blocks (it takes the snapshot): the HTTP handler runs it in a thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpumgr.metrics.mig import mig_families
from gpumgr.metrics.usage import MIB, CardSnapshot, HolderSnapshot, NodeSnapshot, UsageReader

CONTAINER_LABELS = ["pod_name", "namespace", "node", "container_name"]
CARD_LABELS = ["gpu", "uuid", "model"]


class EventCounts(Protocol):
    """What the collector reads from the agent's event counters (`events.AgentMetrics`, which registers it)."""

    def xid_counts(self) -> dict[int, int]: ...
    def checkpoint_extra(self) -> tuple[int, int]: ...


class NodeCollector(Collector):
    def __init__(self, reader: UsageReader, metrics: EventCounts):
        self.reader = reader
        self.metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return []  # names vary with the node; nothing to take at registration

    def collect(self) -> Iterable[Metric]:
        snap = self.reader.snapshot()
        yield from container_families(snap)
        yield from card_families(snap, self.metrics.xid_counts())
        yield from agent_families(snap, self.metrics.checkpoint_extra())
        yield from mig_families(self.reader.state.ledger, self.reader.state.inventory)


def container_families(snap: NodeSnapshot) -> Iterator[Metric]:
    util = GaugeMetricFamily("container_gpu_utilization", "GPU utilisation of the container's processes, percent "
                             "of a card (per card, and total over its cards).", labels=[*CONTAINER_LABELS, "gpu"])
    mem = GaugeMetricFamily("container_gpu_memory_total", "GPU memory used by the container's processes, MiB "
                            "(per card, and total).", labels=[*CONTAINER_LABELS, "gpu_memory"])
    req_util = GaugeMetricFamily("container_request_gpu_utilization", "vcuda-core request / 100 (1 = one whole "
                                 "card).", labels=[*CONTAINER_LABELS, "req_of_gpu"])
    req_mem = GaugeMetricFamily("container_request_gpu_memory", "GPU memory the container may use, MiB (its "
                                "vcuda-memory request; for whole cards, the cards' memory).",
                                labels=[*CONTAINER_LABELS, "req_of_gpu_memory"])
    modes = GaugeMetricFamily("gpumgr_container_compute_limit_mode", "1 for how the container's vCUDA shim "
                              "measures its compute limit on a card, when it said: process (normal), device (card "
                              "utilisation), unthrottled (limit not enforced).", labels=[*CONTAINER_LABELS, "uuid",
                                                                                        "mode"])
    enforced = GaugeMetricFamily("gpumgr_container_compute_limit_enforced", "Whether the container's compute limit "
                                 "on a device is enforced (1) or not (0), and how (`enforced_by`): process (NVML "
                                 "per-process utilisation), gpm (a share inside a MIG instance, from GPM per-instance "
                                 "samples), none (a share inside a MIG instance on a card without GPM: not "
                                 "enforced). Containers with a compute limit only.",
                                 labels=[*CONTAINER_LABELS, "uuid", "enforced_by"])
    procs = GaugeMetricFamily("gpumgr_container_processes", "Host PIDs found in the container's cgroup (0: not "
                              "found, see /usage for why).", labels=CONTAINER_LABELS)
    seen: set[tuple[str, ...]] = set()
    # a pod recreated under the same name (StatefulSet) while the old one still holds cards: one series set, the
    # newest holder's; the old one stays visible in /usage
    for h in sorted(snap.holders, key=lambda h: (h.created or 0.0, h.key), reverse=True):
        base = _container_labels(snap.node, h)
        if tuple(base) in seen:
            continue
        seen.add(tuple(base))
        for i, u in sorted(h.use.items()):
            util.add_metric([*base, f"gpu{i}"], u.sm_util)
            mem.add_metric([*base, f"gpu{i}"], u.memory_bytes / MIB)
        util.add_metric([*base, "total"], h.sm_util)
        mem.add_metric([*base, "total"], h.memory_bytes / MIB)
        req_util.add_metric([*base, "total"], h.cores / 100)
        req_mem.add_metric([*base, "total"], h.request_memory_mib)
        procs.add_metric(base, len(h.pids))
        for uuid, mode in sorted(h.compute_modes.items()):
            modes.add_metric([*base, uuid, mode], 1)
        for uuid, how in sorted(h.compute_enforcement.items()):
            enforced.add_metric([*base, uuid, how], 0 if how == "none" else 1)
    yield from (util, mem, req_util, req_mem, procs, modes, enforced)


def card_families(snap: NodeSnapshot, xid: dict[int, int]) -> Iterator[Metric]:
    def gauge(name: str, doc: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=CARD_LABELS)

    memory = gauge("gpumgr_gpu_memory_bytes", "Memory of the card.")
    cores = gauge("gpumgr_gpu_allocated_cores", "vcuda-core units allocated on the card (100 = all of it).")
    alloc_mem = gauge("gpumgr_gpu_allocated_memory_bytes", "Memory of the card allocated to holders.")
    used_mem = gauge("gpumgr_gpu_used_memory_bytes", "Memory in use on the card (NVML).")
    util = gauge("gpumgr_gpu_utilization_percent", "Utilisation of the card over NVML's last sample period.")
    temp = gauge("gpumgr_gpu_temperature_celsius", "Temperature of the card.")
    healthy = gauge("gpumgr_gpu_healthy", "1 when the card takes new allocations, 0 when it is unhealthy.")
    holders = gauge("gpumgr_gpu_holders", "Containers holding a share or all of the card.")
    cordoned = gauge("gpumgr_gpu_cordoned", "1 when the card takes no new pods (node annotation "
                     "gpumgr.io/cordoned-gpus); pods already on it keep running.")
    up = gauge("gpumgr_gpu_status_up", "1 when the card's status could be read at this scrape.")
    xids = CounterMetricFamily("gpumgr_gpu_xid_errors", "XID errors reported on the card.", labels=CARD_LABELS)
    for c in snap.cards:
        lab = _card_labels(c)
        memory.add_metric(lab, c.memory_mib * MIB)
        cores.add_metric(lab, c.allocated_cores)
        alloc_mem.add_metric(lab, c.allocated_memory_mib * MIB)
        healthy.add_metric(lab, 1 if c.healthy else 0)
        holders.add_metric(lab, len(c.holders))
        if c.cordoned is not None:  # only when the agent follows the node's cordon annotation
            cordoned.add_metric(lab, 1 if c.cordoned else 0)
        xids.add_metric(lab, xid.get(c.index, 0))
        s = c.status
        up.add_metric(lab, 1 if s is not None and not s.lost else 0)
        if s is not None and not s.lost:
            used_mem.add_metric(lab, s.used_memory_bytes)
            util.add_metric(lab, s.utilization)
            if s.temperature_c is not None:
                temp.add_metric(lab, s.temperature_c)
    yield from (memory, cores, alloc_mem, used_mem, util, temp, healthy, holders, cordoned, up, xids)


def agent_families(snap: NodeSnapshot, checkpoint_extra: tuple[int, int]) -> Iterator[Metric]:
    yield CounterMetricFamily("gpumgr_checkpoint_writes", "Checkpoint writes that succeeded.",
                              value=snap.checkpoint_writes + checkpoint_extra[0])
    yield CounterMetricFamily("gpumgr_checkpoint_write_failures", "Checkpoint writes that failed (the change "
                              "was refused).", value=snap.checkpoint_failures + checkpoint_extra[1])
    yield GaugeMetricFamily("gpumgr_scrape_collect_seconds", "Time this scrape took to read the node (NVML, "
                            "cgroups, pods).", value=snap.seconds)


def _container_labels(node: str, h: HolderSnapshot) -> list[str]:
    return [h.pod, h.namespace, node, h.container]


def _card_labels(c: CardSnapshot) -> list[str]:
    return [f"gpu{c.index}", c.uuid, c.model]
