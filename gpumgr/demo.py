"""`gpumgr demo`: the whole system on a simulated 8-GPU node, in one process, with no GPU and no cluster.

Kubernetes API test server, kubelet emulator (device plugins and DRA), the node agent in `both` mode (device
plugins and the DRA driver over one ledger, with /metric), the scheduler extender and kube-scheduler stand-ins;
then a scripted set of pods, the last one a DRA pod whose ResourceClaim takes a share of a card, printing the
cards, holders and the tree at each step.
The NVML flavour (`nvml_lib`) runs the agent on the real nvidia-ml-py over the fake libnvidia-ml.so.1 of
tests/fakes/libnvml, which simulates the same node; its faults are injected through that library.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from gpumgr.devices.spec import load_node_spec
from gpumgr.devices.types import Inventory
from gpumgr.dra.config import DRIVER_NAME
from gpumgr.requests import podspec
from gpumgr.sim.node import Container, SimNode
from gpumgr.sim.scheduler import SchedulerEmulator
from gpumgr.topology.render import render_cards, render_tree


class Demo:
    def __init__(self, out: TextIO = sys.stdout, metrics_port: int = 5678, keep: bool = False,
                 nvml_lib: Path | None = None, once: bool = False):
        self.out = out
        self.nvml_lib = nvml_lib
        self.once = once
        self.fake_nvml: Any = None  # FakeNvmlNode in the NVML flavour
        self.nvml_backend: Any = None
        self.metrics_port = metrics_port
        self.keep = keep
        self.workdir = Path(tempfile.mkdtemp(prefix="gpumgr-demo-", dir="/tmp"))
        self.node: SimNode | None = None
        self.extender: Any = None
        self.scheduler: SchedulerEmulator | None = None
        self.dra_kubelet: Any = None  # DraKubelet: the kubelet's DRA side (NodePrepareResources on dra.sock)
        self.dra_scheduler: Any = None  # DraScheduler: kube-scheduler's structured-parameters allocation
        self.step_no = 0

    # -- output ---------------------------------------------------------------------------------------------
    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def progress(self, text: str) -> None:
        self.say(f"  ... {text}")

    def step(self, title: str) -> None:
        self.step_no += 1
        self.say()
        self.say(f"== Step {self.step_no}: {title} " + "=" * max(0, 70 - len(title)))

    def show(self, tree: bool = False) -> None:
        assert self.node and self.node.agent and self.node.agent.state
        st = self.node.agent.state
        ledger = st.ledger
        self.say(render_cards(ledger, st.inventory))
        if tree:
            self.say()
            self.say(render_tree(st.topology, ledger, st.inventory))

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        from gpumgr.extender.server import ExtenderServer

        self.say("gpumgr demo: the whole system on a simulated node (no GPU, no cluster needed)")
        spec = resources.files("gpumgr") / "data" / "demo-node.yaml"
        with resources.as_file(spec) as spec_path:
            inventory = load_node_spec(spec_path)
        if self.nvml_lib is not None:
            inventory = self._start_nvml(inventory, self.nvml_lib)
        self.progress("starting the Kubernetes API test server and the kubelet emulator")
        if self.metrics_port and not _port_free(self.metrics_port):
            self.progress(f"port {self.metrics_port} is taken: serving /metric on a free port instead")
            self.metrics_port = 0
        addr = f"127.0.0.1:{self.metrics_port}"
        self.node = SimNode(self.workdir, inventory, node_name="demo-node", metrics_addr=addr, extra=self._dra_extra(),
                            backend=self.nvml_backend)  # None: the simulated backend; else NVML over the fake library
        await self.node.start(agent=False)
        self.progress("starting the node agent (device plugins vcore.sock / vmemory.sock, vDevice servers, /metric)")
        await self.node.start_agent()
        await self._start_dra()
        self.progress("starting the scheduler extender and a kube-scheduler stand-in")
        self.extender = ExtenderServer(str(self.node.kubeconfig), policy="binpack", insecure=True,
                                       scheduler_name="default-scheduler")
        port = await self.extender.start("127.0.0.1", 0)
        await self.extender.wait_ready(30)
        self.scheduler = SchedulerEmulator(f"http://127.0.0.1:{port}/gpumgr")
        await self._wait_extender_sees_node()
        self.progress(f"ready: node {self.node.node_name} with {inventory.count} x {inventory.gpus[0].name}")

    def _dra_extra(self) -> dict[str, str]:
        """The agent runs in `both` mode: device plugins and the DRA driver over one ledger (gpumgr run --mode both)."""
        return {"mode": "both", "cdi_dir": str(self.workdir / "cdi"),
                "dra_plugin_dir": str(self.workdir / "plugins" / DRIVER_NAME),
                "plugins_registry_dir": str(self.workdir / "plugins_registry")}

    async def _start_dra(self) -> None:
        from gpumgr.sim.dra_scheduler import DraScheduler
        from gpumgr.sim.kubelet.dra_kubelet import DraKubelet

        assert self.node
        extra = self.node.config.extra
        self.progress(f"the agent also serves DRA (mode both): driver {DRIVER_NAME}, ResourceSlice, dra.sock; "
                      "starting the kubelet's DRA side")
        store = self.node.api.store
        for dc in device_classes():
            if store.get_object("deviceclasses", dc["metadata"]["name"]) is None:
                store.create_object("deviceclasses", dc)
        self.dra_kubelet = DraKubelet(Path(extra["plugins_registry_dir"]), [Path(extra["cdi_dir"])], store,
                                      self.node.node_name)
        await self.dra_kubelet.start()
        await self.dra_kubelet.wait_driver(DRIVER_NAME, timeout=30)
        self.dra_scheduler = DraScheduler(store)

    def _start_nvml(self, inventory: Inventory, lib: Path) -> Inventory:
        """The fake library simulates the demo node; the agent's backend is the real NVML one over it."""
        from gpumgr.devices.fake_nvml_node import ENV, FakeNvmlNode
        from gpumgr.devices.nvml import NvmlBackend

        self.fake_nvml = FakeNvmlNode(self.workdir / "nvml", inventory).write()
        os.environ[ENV] = str(self.fake_nvml.spec)
        self.nvml_backend = NvmlBackend(library=str(lib))
        discovered: Inventory = self.nvml_backend.inventory()
        self.progress(f"agent on the real NVML binding (nvidia-ml-py) over the fake {lib}: "
                      f"{discovered.count} GPUs, driver {discovered.driver_version}")
        return discovered

    def _xid(self, index: int, xid: int) -> None:
        assert self.node
        if self.fake_nvml is not None:
            self.fake_nvml.xid(index, xid)
            if xid == 79:  # XID 79: the card fell off the bus
                self.fake_nvml.fall_off_bus(index)
        else:
            self.node.backend.inject_xid(index, xid)

    def _recover(self, index: int) -> None:
        assert self.node
        if self.fake_nvml is not None:
            self.fake_nvml.back_on_bus(index)  # reset: back on the bus, which NVML reports as recovered
        else:
            self.node.backend.recover(index)

    async def _wait_extender_sees_node(self) -> None:
        assert self.node
        for _ in range(200):
            if self.node.node_name in self.extender.view.nodes:
                return
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self.extender is not None:
            await self.extender.stop()
        if self.dra_kubelet is not None:
            await self.dra_kubelet.stop()
        if self.node is not None:
            await self.node.stop()
        if self.nvml_backend is not None:
            self.nvml_backend.close()
        if not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- pods -----------------------------------------------------------------------------------------------
    async def submit(self, name: str, containers: list[Container], annotations: dict[str, str] | None = None) -> bool:
        """Create the pod unbound, let the scheduler + extender place it, then the kubelet admits it."""
        assert self.node and self.scheduler
        pod = self.node.create_pod(name, containers, annotations=annotations, bind=False)
        asks = ", ".join(f"{c[0]}: vcuda-core {c[1]}" + (f", vcuda-memory {c[2]} ({c[2] * 256} MiB)" if c[2] else "")
                         for c in containers)
        self.say(f"pod {name} asks {asks}")
        decision = await self.scheduler.schedule(pod, [self.node.node_name])
        if decision.node is None:
            for node, why in decision.reasons.items():
                self.say(f"  -> not scheduled: {node}: {why}")
            self.node.api.store.delete_pod("default", name)
            return False
        bound = self.node.pod(name)
        assert bound is not None
        recorded = {k: v for k, v in podspec.pod_annotations(bound).items() if "predicate-gpu-idx" in k}
        self.say(f"  -> extender bound it to {decision.node}, cards (minors) {recorded}")
        admitted = await self.node.admit(bound)
        for c in admitted.containers:
            resp = c.responses.get(podspec.RESOURCE_CORE)
            if resp is not None:
                uuids = resp.envs["NVIDIA_VISIBLE_DEVICES"].split(",")
                cards = [self.node.inventory.by_uuid(u).index for u in uuids]  # type: ignore[union-attr]
                shim = "shim on (limits enforced in-process)" if "LD_PRELOAD" in resp.envs else "whole cards, no shim"
                self.say(f"  -> kubelet admitted container {c.name}: GPU{cards}, {shim}")
        return True

    async def run_script(self) -> None:
        assert self.node and self.node.agent and self.node.agent.state
        self.step("the node as discovered: cards and topology tree (NVLink pairs under two sockets)")
        self.show(tree=True)

        self.step("a 4-card training pod: link picks the best-connected free set")
        await self.submit("train", [("trainer", 400, 0)])
        self.show()

        self.step("a whole-card inference pod: fragment takes a card that breaks no good group")
        await self.submit("infer", [("server", 100, 0)])
        self.show()

        self.step("three fractional notebooks: share packs them onto one card (best fit)")
        await self.submit("nb-alice", [("jupyter", 30, 16)])
        await self.submit("nb-bob", [("jupyter", 50, 32)], annotations={podspec.ANN_CORE_LIMIT: "80"})
        await self.submit("nb-carol", [("jupyter", 20, 8)])
        self.show()

        self.step("a pod that cannot fit: 3 more whole cards on a node with 2 left")
        await self.submit("too-big", [("trainer", 300, 0)])

        self.step("GPU 7 reports XID 79 (fallen off the bus): it goes Unhealthy and takes no new pods")
        self._xid(7, 79)
        await self._wait(lambda: not self.node.agent.state.healthy(7))  # type: ignore[union-attr]
        self.show()
        await self.submit("after-xid", [("server", 100, 0)])
        self.show()

        self.step("GPU 7 recovers: back to Healthy")
        self._recover(7)
        await self._wait(lambda: self.node.agent.state.healthy(7))  # type: ignore[union-attr]
        self.show(tree=True)

        self.step("the training pod finishes: its cards come back")
        await self.node.delete_pod("train")
        await self._wait(lambda: not any(a.pod == "train"
                                         for a in self.node.agent.state.ledger.allocations.values()))  # type: ignore
        self.show()

        self.step("a DRA pod next to them: its ResourceClaim takes a share of a card from the same ledger")
        await self.submit_dra("dra-infer", memory="4Gi", cores=30)
        self.show()
        await self._print_metrics()

    async def submit_dra(self, name: str, memory: str, cores: int, namespace: str = "default") -> bool:
        """A pod with one ResourceClaim (from a template, one per pod, as fractional claims must be): the
        scheduler stand-in allocates it from the node's ResourceSlice, the kubelet's DRA side prepares it through
        the agent's dra.sock; then the claim's allocation and the limits file of its vDevice directory."""
        from gpumgr.node.claims import claim_keys, vdevice_key
        from gpumgr.requests import quantity
        from gpumgr.requests.claim_results import gpu_index
        from gpumgr.sim.dra_scheduler import Unschedulable
        from gpumgr.sim.kubelet.dra_kubelet import DraPrepareError
        from gpumgr.vdevice.limits import Limits

        assert self.node and self.node.agent and self.node.agent.state and self.node.agent.dra
        assert self.dra_scheduler and self.dra_kubelet
        store = self.node.api.store
        template = f"{name}-share"
        store.create_object("resourceclaimtemplates", {"metadata": {"name": template}, "spec": {"spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": SHARED_CLASS, "capacity": {"requests": {
                "memory": memory, "cores": str(cores)}}}}]}}}}, namespace)
        store.create_pod({"metadata": {"name": name, "namespace": namespace}, "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [{"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}]}})
        self.say(f"pod {name} asks a ResourceClaim (template {template}, DeviceClass {SHARED_CLASS}): "
                 f"memory: {memory}, cores: {cores}")
        await self._wait(self._slice_is_current)  # the slice shows what the device-plugin pods leave
        try:
            self.dra_scheduler.schedule_pod(namespace, name, [self.node.node_name])
        except Unschedulable as e:
            self.say(f"  -> not scheduled: {e}")
            return False
        pod = store.get_pod(namespace, name)
        assert pod is not None
        claim_name = self.dra_scheduler.claim_names(pod)["gpu"]
        claim = store.get_object("resourceclaims", claim_name, namespace)
        assert claim is not None
        uid = claim["metadata"]["uid"]
        try:
            running = await self.dra_kubelet.run_pod(namespace, name)
        except DraPrepareError as e:
            self.say(f"  -> the kubelet could not prepare claim {namespace}/{claim_name}: {e}")
            return False
        cdi_ids = [i for d in running.devices.get(uid, []) for i in d.cdi_device_ids]
        results = claim["status"]["allocation"]["devices"]["results"]
        for r in results:
            used = r.get("consumedCapacity") or {}
            self.say(f"  -> claim {namespace}/{claim_name} allocated: card {gpu_index(r['device'])} "
                     f"({r['device']}), consumed memory {used.get('memory', 'all')}, cores {used.get('cores', 'all')};"
                     f" CDI device {', '.join(cdi_ids)}")
        limits_file = self.node.agent.dra.preparer.layout.dir_for(vdevice_key(uid)) / "limits"
        limits = Limits.parse(limits_file.read_text())
        want_bytes = sum(quantity.parse_int((r.get("consumedCapacity") or {}).get("memory", 0)) for r in results)
        want_cores = max((quantity.parse_int((r.get("consumedCapacity") or {}).get("cores", 0)) for r in results),
                         default=0)
        got_bytes = sum(d.memory_limit_bytes for d in limits.devices)
        same = "= the claim's consumed capacity" if (got_bytes, limits.core_limit) == (want_bytes, want_cores) \
            else f"!= the claim's consumed capacity ({want_bytes} bytes, {want_cores} cores)"
        keys = ", ".join(claim_keys(self.node.agent.state.ledger, uid))
        self.say(f"  -> prepared through dra.sock, ledger {keys}; shim limits file {limits_file.parent.name}/limits: "
                 f"memory_limit {got_bytes} bytes ({got_bytes // 2**20} MiB), core_limit {limits.core_limit} {same}")
        return True

    def _slice_is_current(self) -> bool:
        """The node's ResourceSlice in the API shows what the ledger leaves to claims now."""
        assert self.node and self.node.agent and self.node.agent.dra
        wanted = self.node.agent.dra.publisher.wanted(0)["devices"]
        published = [d for s in self.node.api.store.list_resource("resourceslices")
                     if (s.get("spec") or {}).get("driver") == DRIVER_NAME for d in s["spec"].get("devices") or []]
        return bool(wanted) and published == wanted

    async def _wait(self, cond: Callable[[], bool], timeout: float = 10.0) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not cond() and loop.time() < end:
            await asyncio.sleep(0.05)

    async def _print_metrics(self) -> None:
        import aiohttp

        assert self.node and self.node.agent and self.node.agent.http
        base = self.node.agent.http.url
        url = f"{base}/metric"
        self.step("metrics")
        try:
            async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(total=10)) as r:
                text = await r.text()
        except Exception as e:  # noqa: BLE001
            self.say(f"(could not read {url}: {e})")
            return
        wanted = ("container_request_gpu_utilization", "container_request_gpu_memory", "gpumgr_gpu_allocated_cores")
        lines = [ln for ln in text.splitlines() if ln.startswith(wanted)]
        for ln in lines[:12]:
            self.say("  " + ln)
        if self.once:
            self.say(f"Prometheus metrics: {url}   (also /graph, /usage)")
        else:
            self.say(f"Prometheus metrics: {url}   (also /graph, /usage; try `gpumgr status --addr {base}`)")


SHARED_CLASS = "vgpu.gpumgr.io"  # shares: claims ask capacity memory / cores
WHOLE_CLASS = "gpu.gpumgr.io"  # whole cards: claims ask no capacity and take the defaults (all of it)


def device_classes() -> list[dict[str, Any]]:
    """The two DeviceClasses the chart installs when DRA is enabled (docs/dra.md)."""
    selector = [{"cel": {"expression": f'device.driver == "{DRIVER_NAME}"'}}]
    return [{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": cls},
             "spec": {"selectors": selector}} for cls in (SHARED_CLASS, WHOLE_CLASS)]


def _port_free(port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def run_demo(once: bool, metrics_port: int, out: TextIO = sys.stdout, nvml_lib: Path | None = None) -> int:
    demo = Demo(out=out, metrics_port=metrics_port, nvml_lib=nvml_lib, once=once)
    try:
        await demo.start()
        await demo.run_script()
        if not once:
            demo.say()
            demo.say("The node keeps running; press Ctrl-C to stop.")
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError):
                    loop.add_signal_handler(sig, stop.set)
            await stop.wait()
    finally:
        await demo.stop()
    if once:
        demo.say("The node, the agent and /metric stopped with the demo; run `gpumgr demo` without --once to keep "
                 "them up and query them with `gpumgr status`.")
    demo.say("demo finished")
    return 0
