"""The kubelet emulator, driven by a minimal fake device plugin over real unix-socket gRPC."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import stat
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import grpc
import pytest

from gpumgr.node.kubelet_checkpoint import read_kubelet_checkpoint
from gpumgr.pb import deviceplugin_pb2 as pb
from gpumgr.pb import deviceplugin_pb2_grpc as pb_grpc
from gpumgr.sim.kubelet import (
    AdmissionError,
    ContainerRequest,
    KubeletEmulator,
    is_extended_resource_name,
)

CORE = "tencent.com/vcuda-core"
MEM = "tencent.com/vcuda-memory"
WAIT = 30.0

pytestmark = pytest.mark.timeout(60)


def device(device_id: str, *numa: int, health: str = "Healthy") -> pb.Device:
    topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in numa]) if numa else None
    return pb.Device(ID=device_id, health=health, topology=topology)


class FakePlugin(pb_grpc.DevicePluginServicer):
    """A device plugin that records every call it gets into `calls` (shared between plugins)."""

    def __init__(
        self,
        name: str,
        devices: list[pb.Device],
        calls: list[tuple[str, str, list[str]]],
        *,
        pre_start: bool = True,
        preferred: bool = True,
    ) -> None:
        self.name = name
        self.devices = devices
        self.calls = calls
        self.options = pb.DevicePluginOptions(
            pre_start_required=pre_start, get_preferred_allocation_available=preferred
        )
        self.prefer: Callable[[pb.ContainerPreferredAllocationRequest], list[str]] | None = None
        self.preferred_requests: list[pb.ContainerPreferredAllocationRequest] = []
        self.allocate_error: tuple[grpc.StatusCode, str] | None = None
        self.pre_start_error: tuple[grpc.StatusCode, str] | None = None
        self.before_allocate: Callable[[], Awaitable[None]] | None = None
        self._streams: list[asyncio.Queue[list[pb.Device] | None]] = []

    def set_devices(self, devices: list[pb.Device]) -> None:
        self.devices = devices
        for queue in self._streams:
            queue.put_nowait(devices)

    async def GetDevicePluginOptions(self, request, context):
        self.calls.append((self.name, "GetDevicePluginOptions", []))
        return self.options

    async def ListAndWatch(self, request, context):
        self.calls.append((self.name, "ListAndWatch", []))
        queue: asyncio.Queue[list[pb.Device] | None] = asyncio.Queue()
        self._streams.append(queue)
        try:
            yield pb.ListAndWatchResponse(devices=self.devices)
            while (devices := await queue.get()) is not None:
                yield pb.ListAndWatchResponse(devices=devices)
        finally:
            self.calls.append((self.name, "ListAndWatchClosed", []))

    async def GetPreferredAllocation(self, request, context):
        self.calls.append((self.name, "GetPreferredAllocation", []))
        answers = []
        for req in request.container_requests:
            self.preferred_requests.append(req)
            ids = self.prefer(req) if self.prefer else list(req.available_deviceIDs)[: req.allocation_size]
            answers.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=answers)

    async def Allocate(self, request, context):
        for req in request.container_requests:
            self.calls.append((self.name, "Allocate", list(req.devices_ids)))
        if self.before_allocate is not None:
            await self.before_allocate()
        if self.allocate_error is not None:
            await context.abort(*self.allocate_error)
        return pb.AllocateResponse(
            container_responses=[
                pb.ContainerAllocateResponse(
                    envs={"PLUGIN": self.name, "IDS": ",".join(req.devices_ids)},
                    mounts=[pb.Mount(container_path="/etc/vcuda", host_path="/tmp/x", read_only=True)],
                    devices=[
                        pb.DeviceSpec(
                            container_path="/dev/nvidia0", host_path="/dev/nvidia0", permissions="rwm"
                        )
                    ],
                    annotations={"plugin": self.name},
                    cdi_devices=[pb.CDIDevice(name="tencent.com/gpu=0")],
                )
                for req in request.container_requests
            ]
        )

    async def PreStartContainer(self, request, context):
        self.calls.append((self.name, "PreStartContainer", list(request.devices_ids)))
        if self.pre_start_error is not None:
            await context.abort(*self.pre_start_error)
        return pb.PreStartContainerResponse()


class PluginHarness:
    """Serves fake plugins in the plugin directory and registers them with the emulator."""

    def __init__(self, plugin_dir: Path) -> None:
        self.plugin_dir = plugin_dir
        self.calls: list[tuple[str, str, list[str]]] = []
        self._servers: list[grpc.aio.Server] = []

    async def serve(self, plugin: FakePlugin, socket_name: str) -> grpc.aio.Server:
        server = grpc.aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(plugin, server)
        server.add_insecure_port(f"unix://{self.plugin_dir / socket_name}")
        await server.start()
        self._servers.append(server)
        return server

    async def register(
        self,
        resource: str,
        endpoint: str,
        *,
        version: str = "v1beta1",
        options: pb.DevicePluginOptions | None = None,
    ) -> None:
        async with grpc.aio.insecure_channel(f"unix://{self.plugin_dir / 'kubelet.sock'}") as channel:
            stub = pb_grpc.RegistrationStub(channel)
            await stub.Register(
                pb.RegisterRequest(
                    version=version, endpoint=endpoint, resource_name=resource, options=options
                ),
                timeout=WAIT,
            )

    async def start(
        self, resource: str, socket_name: str, devices: list[pb.Device], **kwargs: bool
    ) -> tuple[FakePlugin, grpc.aio.Server]:
        plugin = FakePlugin(socket_name, devices, self.calls, **kwargs)
        server = await self.serve(plugin, socket_name)
        await self.register(resource, socket_name, options=plugin.options)
        return plugin, server

    def names(self, plugin: str, method: str) -> list[list[str]]:
        return [ids for name, m, ids in self.calls if name == plugin and m == method]

    async def close(self) -> None:
        for server in self._servers:
            await server.stop(grace=None)


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kl", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def emulator(plugin_dir: Path) -> AsyncIterator[KubeletEmulator]:
    kubelet = KubeletEmulator(plugin_dir, dial_timeout=1.0, call_timeout=5.0)
    await kubelet.start()
    yield kubelet
    await kubelet.stop()


@pytest.fixture
async def plugins(plugin_dir: Path) -> AsyncIterator[PluginHarness]:
    harness = PluginHarness(plugin_dir)
    yield harness
    await harness.close()


async def until(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    """Poll a condition the emulator is not notified about (state inside the fake plugin)."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


def ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i:02d}" for i in range(n)]


async def two_plugins(plugins: PluginHarness, kubelet: KubeletEmulator, **mem_kwargs: bool):
    core, _ = await plugins.start(CORE, "vcore.sock", [device(i, 0) for i in ids("core", 8)])
    mem, _ = await plugins.start(
        MEM,
        "vmemory.sock",
        [device(i, 0) for i in ids("mem", 8)],
        pre_start=mem_kwargs.get("pre_start", False),
        preferred=mem_kwargs.get("preferred", False),
    )
    await kubelet.wait_for(lambda: kubelet.capacity(CORE) == 8 and kubelet.capacity(MEM) == 8, WAIT)
    return core, mem


# -- registration ----------------------------------------------------------------------------------


async def test_registration_dials_back_and_tracks_devices(emulator: KubeletEmulator, plugins: PluginHarness):
    devices = [device("a", 0), device("b", 1), device("c"), device("d", 0, health="Unhealthy")]
    plugin, _ = await plugins.start(CORE, "vcore.sock", devices)
    assert await emulator.wait_registered(CORE, WAIT) > 0
    await emulator.wait_for(lambda: emulator.capacity(CORE) == 4, WAIT)
    assert emulator.registration_count(CORE) == 1
    assert emulator.devices(CORE) == {"a": "Healthy", "b": "Healthy", "c": "Healthy", "d": "Unhealthy"}
    assert emulator.allocatable(CORE) == 3
    assert emulator.topology(CORE) == {"a": (0,), "b": (1,), "c": (), "d": (0,)}
    assert emulator.options(CORE) == plugin.options
    assert [m for _, m, _ in plugins.calls] == ["GetDevicePluginOptions", "ListAndWatch"]


async def test_register_with_wrong_version_is_rejected(emulator: KubeletEmulator, plugins: PluginHarness):
    plugin = FakePlugin("vcore.sock", [device("a")], plugins.calls)
    await plugins.serve(plugin, "vcore.sock")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await plugins.register(CORE, "vcore.sock", version="v1alpha")
    assert "v1alpha" in (err.value.details() or "")
    assert not emulator.is_registered(CORE)
    assert plugins.calls == []  # never dialled back
    assert emulator.rejected_registrations[-1].resource == CORE


@pytest.mark.parametrize(
    "name",
    [
        "vcuda-core",
        "kubernetes.io/gpu",
        "gpu.kubernetes.io/x",
        "requests.tencent.com/x",
        "Tencent.com/x",
        "tencent.com/",
        "tencent.com/a/b",
        "tencent.com/-x",
        "",
    ],
)
async def test_register_with_invalid_resource_name_is_rejected(
    emulator: KubeletEmulator, plugins: PluginHarness, name: str
):
    await plugins.serve(FakePlugin("p.sock", [device("a")], plugins.calls), "p.sock")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await plugins.register(name, "p.sock")
    assert "resource name" in (err.value.details() or "")
    assert plugins.calls == []
    assert not emulator.is_registered(name)


@pytest.mark.parametrize("name", [CORE, MEM, "nvidia.com/gpu", "example.com/a_b.c", "a-b.example.io/X1"])
def test_valid_extended_resource_names(name: str):
    assert is_extended_resource_name(name)


async def test_register_with_unreachable_endpoint_is_rejected(
    emulator: KubeletEmulator, plugins: PluginHarness
):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await plugins.register(CORE, "nobody.sock")
    assert "nobody.sock" in (err.value.details() or "")
    assert not emulator.is_registered(CORE)
    assert emulator.registration_count(CORE) == 0


async def test_wait_registered_times_out(emulator: KubeletEmulator):
    with pytest.raises(TimeoutError):
        await emulator.wait_registered(CORE, 0.2)


# -- ListAndWatch ----------------------------------------------------------------------------------


async def test_list_and_watch_health_changes_are_reflected(emulator: KubeletEmulator, plugins: PluginHarness):
    plugin, _ = await plugins.start(CORE, "vcore.sock", [device("a"), device("b")])
    await emulator.wait_for(lambda: emulator.allocatable(CORE) == 2, WAIT)
    plugin.set_devices([device("a"), device("b", health="Unhealthy")])
    await emulator.wait_for(lambda: emulator.devices(CORE).get("b") == "Unhealthy", WAIT)
    assert emulator.allocatable(CORE) == 1
    plugin.set_devices([device("a"), device("b"), device("c")])
    await emulator.wait_for(lambda: emulator.allocatable(CORE) == 3, WAIT)
    # the checkpoint records the healthy devices, as the kubelet writes it on each update
    await emulator.wait_for(
        lambda: (
            read_kubelet_checkpoint(emulator.checkpoint_path).registered_devices.get(CORE) == ("a", "b", "c")
        ),
        WAIT,
    )


async def test_broken_stream_makes_devices_unhealthy(emulator: KubeletEmulator, plugins: PluginHarness):
    _, server = await plugins.start(CORE, "vcore.sock", [device("a"), device("b")])
    await emulator.wait_for(lambda: emulator.allocatable(CORE) == 2, WAIT)
    await server.stop(grace=None)
    await emulator.wait_for(lambda: not emulator.is_registered(CORE), WAIT)
    assert emulator.devices(CORE) == {"a": "Unhealthy", "b": "Unhealthy"}
    assert emulator.allocatable(CORE) == 0
    with pytest.raises(AdmissionError) as err:
        await emulator.admit_pod("pod-1", [ContainerRequest("c", {CORE: 1})])
    assert err.value.reason == f"OutOf{CORE}"


async def test_reregistration_replaces_the_endpoint(emulator: KubeletEmulator, plugins: PluginHarness):
    old, old_server = await plugins.start(CORE, "old.sock", [device("a"), device("b")])
    await emulator.wait_for(lambda: emulator.capacity(CORE) == 2, WAIT)
    await plugins.start(CORE, "new.sock", [device("x"), device("y"), device("z")])
    await emulator.wait_registered(CORE, WAIT, count=2)
    await emulator.wait_for(lambda: set(emulator.devices(CORE)) == {"x", "y", "z"}, WAIT)
    # the emulator hangs up on the replaced plugin; its later updates and its end change nothing
    await until(lambda: ("old.sock", "ListAndWatchClosed", []) in plugins.calls)
    old.set_devices([device("a")])
    await old_server.stop(grace=None)
    assert emulator.devices(CORE) == {"x": "Healthy", "y": "Healthy", "z": "Healthy"}
    assert emulator.is_registered(CORE)
    await emulator.admit_pod("pod-1", [ContainerRequest("c", {CORE: 1})])
    assert plugins.names("new.sock", "Allocate") == [["x"]]
    assert plugins.names("old.sock", "Allocate") == []


# -- admission -------------------------------------------------------------------------------------


async def test_admission_calls_plugins_in_kubelet_order(emulator: KubeletEmulator, plugins: PluginHarness):
    core, _mem = await two_plugins(plugins, emulator)
    core.prefer = lambda req: sorted(req.available_deviceIDs, reverse=True)[: req.allocation_size]
    plugins.calls.clear()
    pod = await emulator.admit_pod(
        "pod-1", [ContainerRequest("main", {MEM: 3, CORE: 2, "cpu": 4}), ContainerRequest("side", {CORE: 1})]
    )
    assert plugins.calls == [
        ("vcore.sock", "GetPreferredAllocation", []),
        ("vcore.sock", "Allocate", ["core-07", "core-06"]),
        ("vmemory.sock", "Allocate", ["mem-00", "mem-01", "mem-02"]),
        ("vcore.sock", "PreStartContainer", ["core-07", "core-06"]),  # memory plugin: pre_start not required
        ("vcore.sock", "GetPreferredAllocation", []),
        ("vcore.sock", "Allocate", ["core-05"]),
        ("vcore.sock", "PreStartContainer", ["core-05"]),
    ]
    first, second = core.preferred_requests
    assert list(first.available_deviceIDs) == ids("core", 8)
    assert list(first.must_include_deviceIDs) == []
    assert first.allocation_size == 2
    assert list(second.available_deviceIDs) == ids("core", 6)  # allocated devices are not offered
    main = pod.container("main")
    assert main.device_ids == {CORE: ("core-07", "core-06"), MEM: ("mem-00", "mem-01", "mem-02")}
    assert main.responses[MEM].envs["IDS"] == "mem-00,mem-01,mem-02"
    assert pod.container("side").device_ids == {CORE: ("core-05",)}
    assert emulator.allocated(CORE) == {"core-07", "core-06", "core-05"}
    assert emulator.pod_devices("pod-1") == {
        "main": {CORE: ("core-07", "core-06"), MEM: ("mem-00", "mem-01", "mem-02")},
        "side": {CORE: ("core-05",)},
    }


async def test_unusable_preference_falls_back_to_free_devices(
    emulator: KubeletEmulator, plugins: PluginHarness
):
    core, _ = await two_plugins(plugins, emulator)
    await emulator.admit_pod("pod-1", [ContainerRequest("c", {CORE: 2})])  # takes core-00, core-01
    core.prefer = lambda req: ["ghost", "core-00", "core-05"]  # unknown, taken, valid
    pod = await emulator.admit_pod("pod-2", [ContainerRequest("c", {CORE: 3})])
    assert pod.container("c").device_ids[CORE] == ("core-05", "core-02", "core-03")


async def test_unhealthy_devices_are_never_chosen(emulator: KubeletEmulator, plugins: PluginHarness):
    core, _ = await two_plugins(plugins, emulator)
    core.set_devices(
        [device(i, 0, health="Unhealthy" if i < "core-04" else "Healthy") for i in ids("core", 8)]
    )
    await emulator.wait_for(lambda: emulator.allocatable(CORE) == 4, WAIT)
    core.prefer = lambda req: ["core-00"]
    pod = await emulator.admit_pod("pod-1", [ContainerRequest("c", {CORE: 2})])
    assert pod.container("c").device_ids[CORE] == ("core-04", "core-05")
    assert list(core.preferred_requests[-1].available_deviceIDs) == ids("core", 8)[4:]


async def test_failed_allocate_rejects_pod_and_frees_devices(
    emulator: KubeletEmulator, plugins: PluginHarness
):
    _core, mem = await two_plugins(plugins, emulator)
    mem.allocate_error = (grpc.StatusCode.RESOURCE_EXHAUSTED, "no card fits 3 units")
    with pytest.raises(AdmissionError) as err:
        await emulator.admit_pod("pod-1", [ContainerRequest("c", {CORE: 2, MEM: 3})])
    assert err.value.reason == "UnexpectedAdmissionError"
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.value.details == "no card fits 3 units"
    assert plugins.names("vcore.sock", "Allocate") == [["core-00", "core-01"]]
    assert plugins.names("vcore.sock", "PreStartContainer") == []
    assert emulator.allocated(CORE) == set() and emulator.pods() == []
    assert read_kubelet_checkpoint(emulator.checkpoint_path).entries == ()
    mem.allocate_error = None
    pod = await emulator.admit_pod("pod-2", [ContainerRequest("c", {CORE: 2, MEM: 3})])
    assert pod.container("c").device_ids[CORE] == ("core-00", "core-01")


async def test_a_device_update_during_allocate_does_not_checkpoint_the_call_in_flight(
    emulator: KubeletEmulator, plugins: PluginHarness
):
    """The kubelet checkpoints a container's devices once the plugin answered: a ListAndWatch update (which
    rewrites the checkpoint) while an Allocate is in flight must not record the container asking."""
    core, _ = await plugins.start(CORE, "vcore.sock", [device(i, 0) for i in ids("core", 4)])
    await emulator.wait_for(lambda: emulator.capacity(CORE) == 4, WAIT)
    seen: list[str] = []

    async def update_devices_first() -> None:
        core.set_devices([device(i, 0) for i in ids("core", 5)])
        await until(lambda: read_kubelet_checkpoint(emulator.checkpoint_path).registered_devices.get(CORE)
                    == tuple(ids("core", 5)))
        seen.extend(e.container_name for e in read_kubelet_checkpoint(emulator.checkpoint_path).entries)

    core.before_allocate = update_devices_first
    await emulator.admit_pod("pod-1", [ContainerRequest("c", {CORE: 2})])
    assert seen == []
    after = read_kubelet_checkpoint(emulator.checkpoint_path).entries
    assert [(e.pod_uid, e.container_name) for e in after] == [("pod-1", "c")]


async def test_failed_pre_start_rejects_pod_and_frees_devices(
    emulator: KubeletEmulator, plugins: PluginHarness
):
    core, _ = await two_plugins(plugins, emulator)
    await emulator.admit_pod("pod-0", [ContainerRequest("c", {CORE: 1})])
    core.pre_start_error = (grpc.StatusCode.FAILED_PRECONDITION, "pod not found")
    with pytest.raises(AdmissionError) as err:
        await emulator.admit_pod(
            "pod-1", [ContainerRequest("a", {CORE: 1}), ContainerRequest("b", {CORE: 2})]
        )
    assert (err.value.code, err.value.details) == (grpc.StatusCode.FAILED_PRECONDITION, "pod not found")
    assert plugins.names("vcore.sock", "PreStartContainer")[-1] == ["core-01"]
    assert plugins.names("vcore.sock", "Allocate")[-1] == ["core-01"]  # container b was never reached
    assert emulator.pods() == ["pod-0"] and emulator.allocated(CORE) == {"core-00"}
    assert [e.pod_uid for e in read_kubelet_checkpoint(emulator.checkpoint_path).entries] == ["pod-0"]


async def test_not_enough_devices_rejects_before_any_call(emulator: KubeletEmulator, plugins: PluginHarness):
    await two_plugins(plugins, emulator)
    await emulator.admit_pod("pod-1", [ContainerRequest("c", {CORE: 6})])
    plugins.calls.clear()
    with pytest.raises(AdmissionError) as err:
        await emulator.admit_pod(
            "pod-2", [ContainerRequest("a", {CORE: 1}), ContainerRequest("b", {CORE: 2})]
        )
    assert err.value.reason == f"OutOf{CORE}"
    assert plugins.calls == []
    assert emulator.pods() == ["pod-1"]


async def test_init_container_devices_are_reused(emulator: KubeletEmulator, plugins: PluginHarness):
    core, _ = await two_plugins(plugins, emulator)
    pod = await emulator.admit_pod(
        "pod-1",
        containers=[ContainerRequest("app1", {CORE: 2}), ContainerRequest("app2", {CORE: 1})],
        init_containers=[ContainerRequest("init", {CORE: 2})],
    )
    init_ids = pod.container("init").device_ids[CORE]
    assert pod.container("init").init and init_ids == ("core-00", "core-01")
    assert pod.container("app1").device_ids[CORE] == init_ids  # reused without asking the plugin
    assert pod.container("app2").device_ids[CORE] == ("core-02",)
    assert len(core.preferred_requests) == 2
    assert plugins.names("vcore.sock", "Allocate") == [list(init_ids), list(init_ids), ["core-02"]]


async def test_init_container_devices_are_must_include(emulator: KubeletEmulator, plugins: PluginHarness):
    core, _ = await two_plugins(plugins, emulator)
    await emulator.admit_pod(
        "pod-1", [ContainerRequest("app", {CORE: 3})], init_containers=[ContainerRequest("init", {CORE: 2})]
    )
    request = core.preferred_requests[-1]
    assert list(request.must_include_deviceIDs) == ["core-00", "core-01"]
    assert request.allocation_size == 3
    assert list(request.available_deviceIDs) == ids("core", 8)
    assert plugins.names("vcore.sock", "Allocate")[-1] == ["core-00", "core-01", "core-02"]


async def test_bad_pod_input_changes_nothing(emulator: KubeletEmulator, plugins: PluginHarness):
    await two_plugins(plugins, emulator)
    plugins.calls.clear()
    with pytest.raises(ValueError, match="used twice"):
        await emulator.admit_pod("p", [ContainerRequest("a", {CORE: 1}), ContainerRequest("a", {CORE: 1})])
    with pytest.raises(ValueError, match="non-negative"):
        await emulator.admit_pod("p", [ContainerRequest("a", {CORE: -1})])
    with pytest.raises(AdmissionError, match="example.com/fpga"):
        await emulator.admit_pod("p", [ContainerRequest("a", {CORE: 1, "example.com/fpga": 1})])
    assert plugins.calls == [] and emulator.pods() == []


# -- checkpoint ------------------------------------------------------------------------------------


def fnv1a_32(data: bytes) -> int:
    h = 2166136261
    for b in data:
        h = ((h ^ b) * 16777619) % 2**32
    return h


@pytest.mark.parametrize("fmt", ["v2", "v1"])
async def test_checkpoint_is_written_in_kubelet_layout(plugin_dir: Path, plugins: PluginHarness, fmt: str):
    kubelet = KubeletEmulator(plugin_dir, fmt, dial_timeout=1.0)
    await kubelet.start()
    try:
        await plugins.start(
            CORE,
            "vcore.sock",
            [device("g0-a", 0), device("g0-b", 0), device("g1-a", 1), device("nt-a"), device("both", 0, 1)],
        )
        await plugins.start(MEM, "vmemory.sock", [device("m0", 0), device("m1", 0)], pre_start=False)
        await kubelet.wait_for(lambda: kubelet.capacity(CORE) == 5 and kubelet.capacity(MEM) == 2, WAIT)
        pod = await kubelet.admit_pod(
            "uid-1", [ContainerRequest("cuda", {CORE: 5, MEM: 1}), ContainerRequest("idle", {"cpu": 1})]
        )
        doc = json.loads(kubelet.checkpoint_path.read_text())
        assert list(doc) == ["Data", "Checksum"]
        canonical = json.dumps(doc["Data"], sort_keys=True, separators=(",", ":")).encode()
        assert doc["Checksum"] == fnv1a_32(canonical)
        raw = {(e["ContainerName"], e["ResourceName"]): e for e in doc["Data"]["PodDeviceEntries"]}
        assert set(raw) == {("cuda", CORE), ("cuda", MEM)}
        core_ids = raw[("cuda", CORE)]["DeviceIDs"]
        if fmt == "v2":
            assert core_ids == {"-1": ["nt-a"], "0": ["both", "g0-a", "g0-b"], "1": ["both", "g1-a"]}
        else:
            assert core_ids == ["both", "g0-a", "g0-b", "g1-a", "nt-a"]
        blob = base64.b64decode(raw[("cuda", MEM)]["AllocResp"])
        assert pb.ContainerAllocateResponse.FromString(blob) == pod.container("cuda").responses[MEM]
        assert doc["Data"]["RegisteredDevices"] == {
            CORE: ["both", "g0-a", "g0-b", "g1-a", "nt-a"],
            MEM: ["m0", "m1"],
        }

        parsed = read_kubelet_checkpoint(plugin_dir)
        assert parsed.layout == fmt
        entry = next(e for e in parsed.entries if e.resource_name == CORE)
        assert (entry.pod_uid, entry.container_name) == ("uid-1", "cuda")
        assert sorted(entry.device_ids) == sorted(pod.container("cuda").device_ids[CORE])
        assert entry.alloc_resp == pod.container("cuda").responses[CORE]
        assert entry.alloc_resp.envs["PLUGIN"] == "vcore.sock"

        assert await kubelet.remove_pod("uid-1")
        assert not await kubelet.remove_pod("uid-1")
        doc = json.loads(kubelet.checkpoint_path.read_text())
        assert doc["Data"]["PodDeviceEntries"] is None  # Go marshals an empty slice of entries as null
        assert kubelet.allocated(CORE) == set()
    finally:
        await kubelet.stop()


# -- restart ---------------------------------------------------------------------------------------


async def test_restart_cleans_directory_keeps_allocations_and_needs_reregistration(
    emulator: KubeletEmulator, plugins: PluginHarness, plugin_dir: Path
):
    core, core_server = await plugins.start(CORE, "vcore.sock", [device(i, 0) for i in ids("core", 4)])
    await emulator.wait_for(lambda: emulator.capacity(CORE) == 4, WAIT)
    pod = await emulator.admit_pod("pod-1", [ContainerRequest("c", {CORE: 2})])
    (plugin_dir / "DEPRECATION").touch()
    (plugin_dir / "subdir").mkdir()
    old_socket = plugin_dir / "subdir" / "old-kubelet.sock"
    os.link(emulator.socket_path, old_socket)  # keeps the old inode alive, so it cannot be reused

    await emulator.restart()

    assert sorted(p.name for p in plugin_dir.iterdir()) == [
        "kubelet.sock",
        "kubelet_internal_checkpoint",
        "subdir",
    ]
    assert stat.S_ISSOCK(os.stat(emulator.socket_path).st_mode)
    assert os.stat(old_socket).st_nlink == 1  # the old kubelet.sock was removed ...
    assert os.stat(emulator.socket_path).st_ino != os.stat(old_socket).st_ino  # ... and a new one created
    assert not emulator.is_registered(CORE)
    assert emulator.devices(CORE) == {} and emulator.allocatable(CORE) == 0
    assert emulator.pod_devices("pod-1") == {"c": {CORE: ("core-00", "core-01")}}
    with pytest.raises(AdmissionError):
        await emulator.admit_pod("pod-2", [ContainerRequest("c", {CORE: 1})])

    # the plugin notices its socket is gone, serves again and re-registers
    await core_server.stop(grace=None)
    await plugins.serve(core, "vcore.sock")
    await plugins.register(CORE, "vcore.sock")
    await emulator.wait_registered(CORE, WAIT, count=2)
    await emulator.wait_for(lambda: emulator.allocatable(CORE) == 4, WAIT)
    pod2 = await emulator.admit_pod("pod-2", [ContainerRequest("c", {CORE: 2})])
    assert pod2.container("c").device_ids[CORE] == ("core-02", "core-03")

    # re-admitting the surviving pod (a node reboot) allocates nothing new, PreStart runs again
    plugins.calls.clear()
    again = await emulator.admit_pod("pod-1", [ContainerRequest("c", {CORE: 2})])
    assert again.container("c").device_ids == pod.container("c").device_ids
    assert again.container("c").responses == pod.container("c").responses
    assert plugins.calls == [("vcore.sock", "PreStartContainer", ["core-00", "core-01"])]
    with pytest.raises(AdmissionError, match="changed its request"):
        await emulator.admit_pod("pod-1", [ContainerRequest("c", {CORE: 1})])


async def test_restart_with_v1_checkpoint_keeps_allocations(plugin_dir: Path, plugins: PluginHarness):
    kubelet = KubeletEmulator(plugin_dir, "v1", dial_timeout=1.0)
    await kubelet.start()
    try:
        await plugins.start(CORE, "vcore.sock", [device(i, 0) for i in ids("core", 4)])
        await kubelet.wait_for(lambda: kubelet.capacity(CORE) == 4, WAIT)
        await kubelet.admit_pod("pod-1", [ContainerRequest("c", {CORE: 3})])
        await kubelet.restart()
        assert kubelet.last_checkpoint_error is None
        assert kubelet.pod_devices("pod-1") == {"c": {CORE: ("core-00", "core-01", "core-02")}}
        assert read_kubelet_checkpoint(plugin_dir).layout == "v1"
    finally:
        await kubelet.stop()


async def test_restart_with_corrupt_checkpoint_starts_empty(
    emulator: KubeletEmulator, plugins: PluginHarness
):
    await plugins.start(CORE, "vcore.sock", [device(i, 0) for i in ids("core", 4)])
    await emulator.wait_for(lambda: emulator.capacity(CORE) == 4, WAIT)
    await emulator.admit_pod("pod-1", [ContainerRequest("c", {CORE: 1})])
    emulator.checkpoint_path.write_text('{"Data": {"PodDeviceEntries": [')
    await emulator.restart()
    assert "kubelet_internal_checkpoint" in (emulator.last_checkpoint_error or "")
    assert emulator.pods() == []


# -- resource order and deferred start --------------------------------------------------------------


async def test_memory_first_order_allocates_each_containers_memory_before_its_cores(
    emulator: KubeletEmulator, plugins: PluginHarness
):
    await two_plugins(plugins, emulator)
    await emulator.admit_pod("p", [ContainerRequest("a", {CORE: 2, MEM: 1}), ContainerRequest("b", {CORE: 1, MEM: 2})],
                             resource_order="reverse")
    order = [(name, ids) for name, m, ids in plugins.calls if m == "Allocate"]
    assert [name for name, _ in order] == ["vmemory.sock", "vcore.sock", "vmemory.sock", "vcore.sock"]
    assert [len(ids) for _, ids in order] == [1, 2, 2, 1]
    with pytest.raises(ValueError, match="resource_order"):
        await emulator.admit_pod("q", [ContainerRequest("a", {CORE: 1})], resource_order="random")  # type: ignore[arg-type]


async def test_admitted_without_start_calls_prestart_only_when_started(
    emulator: KubeletEmulator, plugins: PluginHarness
):
    core, _ = await two_plugins(plugins, emulator)
    first = await emulator.admit_pod("p1", [ContainerRequest("a", {CORE: 2, MEM: 1})], start=False)
    second = await emulator.admit_pod("p2", [ContainerRequest("a", {CORE: 3, MEM: 1})], start=False)
    assert plugins.names("vcore.sock", "PreStartContainer") == []
    assert read_kubelet_checkpoint(emulator.checkpoint_path).entries  # recorded at admission
    await emulator.start_pod(second)
    await emulator.start_pod(first)
    assert plugins.names("vcore.sock", "PreStartContainer") == [
        list(second.container("a").device_ids[CORE]), list(first.container("a").device_ids[CORE])]
    core.pre_start_error = (grpc.StatusCode.FAILED_PRECONDITION, "does not fit")
    third = await emulator.admit_pod("p3", [ContainerRequest("a", {CORE: 1})], start=False)
    with pytest.raises(AdmissionError) as err:
        await emulator.start_pod(third)
    assert err.value.reason == "PreStartContainerError" and err.value.code == grpc.StatusCode.FAILED_PRECONDITION


async def test_a_kubelet_without_preferred_allocation_takes_the_sorted_free_set(
    emulator: KubeletEmulator, plugins: PluginHarness
):
    core, _ = await two_plugins(plugins, emulator)
    core.prefer = lambda req: list(req.available_deviceIDs)[-2:]
    emulator.use_preferred = False
    got = await emulator.admit_pod("p", [ContainerRequest("a", {CORE: 2})])
    assert plugins.names("vcore.sock", "GetPreferredAllocation") == []
    assert list(got.container("a").device_ids[CORE]) == ["core-00", "core-01"]
    emulator.use_preferred = True
    got = await emulator.admit_pod("q", [ContainerRequest("a", {CORE: 2})])
    assert list(got.container("a").device_ids[CORE]) == ["core-06", "core-07"]
