"""How a container's compute limit is enforced, per device, in the limits the node gives it: `process` outside
MIG, `gpm` for a share inside a MIG instance on a card with GPM (Hopper and later), `none` inside one on a card
without it (A100, A30). Through container_limits, the limits file, and the vDevice server's answer over unix-socket
gRPC (an older agent's file and answer, without the field, read as `process`)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gpumgr.allocator import Allocation, ContainerHolder
from gpumgr.devices.arch import has_gpm
from gpumgr.devices.types import GPU, Inventory
from gpumgr.node.limits import container_limits, with_compute
from gpumgr.pb import vdevice_pb2 as pb
from gpumgr.pb import vdevice_pb2_grpc as pb_grpc
from gpumgr.requests import podspec
from gpumgr.vdevice.layout import VDeviceLayout, allocation_key
from gpumgr.vdevice.limits import DeviceLimit, Limits
from gpumgr.vdevice.server import VDeviceManager

UID = "aaaaaaaa-0000-4000-8000-000000000001"
HOLDER = ContainerHolder(UID, "default", "p", "main", memory_units=8)
NAMES = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA H200", "NVIDIA A30")


def inventory(gpm: tuple[bool | None, ...] = (None, None, None, None)) -> Inventory:
    gpus = tuple(GPU(index=i, uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000", minor=i, name=n, memory_mib=81920,
                     gpm=gpm[i]) for i, n in enumerate(NAMES))
    return Inventory(gpus=gpus, levels=tuple(tuple("X" if i == j else "SYS" for j in range(4)) for i in range(4)))


def pod() -> dict:
    limits = {podspec.RESOURCE_CORE: "30", podspec.RESOURCE_MEMORY: "8"}
    return {"metadata": {"uid": UID, "name": "p", "namespace": "default", "annotations": {}},
            "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]}}


def share(card: int, mig: str | None) -> Allocation:
    return Allocation("a" + "0" * 24, (card,), 30, 8 * 256, HOLDER, verified=True, mig=mig)


@pytest.mark.parametrize(("card", "mig", "want"), [
    (0, None, "process"), (1, None, "process"),  # a share of a card: NVML per-process utilisation
    (0, "mig-0-0", "gpm"), (2, "mig-2-4", "gpm"),  # a share inside a MIG instance of an H100 / H200
    (1, "mig-1-0", "none"), (3, "mig-3-0", "none"),  # ... of an A100 / A30: nothing to measure by
])
def test_the_node_says_how_each_share_is_enforced(card: int, mig: str | None, want: str):
    limits = container_limits(inventory(), 256, share(card, mig), pod())
    assert [(d.index, d.compute) for d in limits.devices] == [(card, want)]
    assert limits.core_limit == 30 and limits.devices[0].memory_limit_bytes == 8 * 256 << 20  # memory unchanged


def test_what_nvml_said_of_the_card_wins_over_its_name():
    inv = inventory(gpm=(False, True, None, None))  # e.g. an H100 whose driver has GPM off; an A100 "with" it
    assert not has_gpm(inv.gpus[0]) and has_gpm(inv.gpus[1])
    assert container_limits(inv, 256, share(0, "mig-0-0"), pod()).devices[0].compute == "none"
    assert container_limits(inv, 256, share(1, "mig-1-0"), pod()).devices[0].compute == "gpm"
    # a device the limits name by its MIG UUID is inside MIG whatever the allocation record says
    named = Limits(UID, "main", 30, True, 0, (DeviceLimit("MIG-11111111-2222-3333-4444-555555555555", 3, 1 << 30),))
    assert with_compute(inv, named, mig=False).devices[0].compute == "none"


def test_the_limits_file_carries_it_and_an_older_file_reads_as_process():
    limits = container_limits(inventory(), 256, share(1, "mig-1-0"), pod())
    text = limits.to_text()
    assert "device0_compute=none" in text
    assert Limits.parse(text) == limits
    older = "\n".join(ln for ln in text.splitlines() if "_compute=" not in ln) + "\n"
    assert Limits.parse(older).devices[0].compute == "process"
    with pytest.raises(ValueError, match="compute must be one of"):
        Limits.parse(text.replace("device0_compute=none", "device0_compute=maybe"))


@pytest.fixture
def root() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="vdc", dir="/tmp"))  # unix socket paths must stay short
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def test_the_vdevice_server_answers_it_per_device(root: Path):
    mig_gpm = container_limits(inventory(), 256, share(0, "mig-0-0"), pod())
    mig_none = container_limits(inventory(), 256, share(1, "mig-1-0"), pod())
    layout = VDeviceLayout(root / "vm")
    mgr = VDeviceManager(layout, root / "proc")
    keys = [allocation_key([u]) for u in ("u-gpm", "u-none")]
    try:
        answers = []
        for key, lim in zip(keys, (mig_gpm, mig_none), strict=True):
            await mgr.start(key, lim)
            async with grpc.aio.insecure_channel(f"unix://{layout.socket_for(key)}") as ch:
                answers.append(await pb_grpc.VDeviceStub(ch).Register(pb.RegisterRequest(), timeout=30))
    finally:
        await mgr.stop_all()
    assert [[d.compute for d in a.devices] for a in answers] == [["gpm"], ["none"]]
    assert answers[1].core_limit == 30 and answers[1].devices[0].memory_limit_bytes == 8 * 256 << 20
