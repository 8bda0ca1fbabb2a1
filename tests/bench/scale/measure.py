"""What one path of the scale bench measures: when each pod was created and first seen bound (a raw watch, parsed
without the client's models so the watcher keeps up), a process's CPU seconds and peak RSS from /proc, and the API
server's request count from its /metrics."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

CREATORS = 8


class BindWatch:
    """Records the monotonic time at which each pod of a namespace is first seen with spec.nodeName."""

    def __init__(self, make_client: Callable[[], Any], namespace: str,
                 on_bound: Callable[[dict[str, Any]], None] | None = None):
        self.make_client = make_client
        self.on_bound = on_bound
        self.namespace = namespace
        self.bound: dict[str, float] = {}
        self.nodes: dict[str, str] = {}
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"bindwatch-{namespace}", daemon=True)

    def start(self) -> BindWatch:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the pod watch did not start")
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def _run(self) -> None:
        from kubernetes import client as k

        core: Any = k.CoreV1Api(self.make_client())
        listed = json.loads(core.list_namespaced_pod(self.namespace, _preload_content=False).data)
        version = listed["metadata"]["resourceVersion"]
        self._ready.set()
        while not self._stop.is_set():
            resp = core.list_namespaced_pod(self.namespace, watch=True, resource_version=version,
                                            allow_watch_bookmarks=True, timeout_seconds=5, _preload_content=False)
            pending = b""
            for chunk in resp.stream(65536):
                now = time.monotonic()
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    version = (obj.get("metadata") or {}).get("resourceVersion", version)
                    name = (obj.get("metadata") or {}).get("name")
                    node = (obj.get("spec") or {}).get("nodeName")
                    if name and node and name not in self.bound:
                        self.bound[name] = now
                        self.nodes[name] = node
                        if self.on_bound is not None:
                            self.on_bound(obj)
            resp.release_conn()


def create_all(make_client: Callable[[], Any], items: list[tuple[dict[str, Any] | None, dict[str, Any]]],
               rate: float = 0.0) -> dict[str, float]:
    """Create the pods (each after its own ResourceClaim, if it has one) on CREATORS connections, as fast as the
    API takes them (rate 0) or pod i not before start + i / rate (paced arrivals); returns pod name -> time its
    first request was sent."""
    sent: dict[str, float] = {}
    chunks = [items[i::CREATORS] for i in range(CREATORS)]
    start = time.monotonic() + 0.2

    def one(first: int, chunk: list[tuple[dict[str, Any] | None, dict[str, Any]]]) -> None:
        from kubernetes import client as k

        api_client = make_client()
        core: Any = k.CoreV1Api(api_client)
        custom: Any = k.CustomObjectsApi(api_client)
        for j, (claim, pod) in enumerate(chunk):
            if rate > 0:
                time.sleep(max(0.0, start + (first + j * CREATORS) / rate - time.monotonic()))
            namespace = pod["metadata"]["namespace"]
            sent[pod["metadata"]["name"]] = time.monotonic()
            if claim is not None:
                custom.create_namespaced_custom_object("resource.k8s.io", "v1", namespace, "resourceclaims", claim,
                                                       _preload_content=False)
            core.create_namespaced_pod(namespace, pod, _preload_content=False)

    with ThreadPoolExecutor(CREATORS) as pool:
        for future in [pool.submit(one, i, c) for i, c in enumerate(chunks) if c]:
            future.result()
    return sent


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def reset_peak_rss(pid: int) -> None:
    """Start VmHWM again from the current RSS (clear_refs 5), so each path shows its own peak."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def request_count(metrics_text: str) -> int:
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("apiserver_request_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)
