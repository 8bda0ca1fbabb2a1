"""The node file and the control file of the fake libnvidia-ml.so.1 (tests/fakes/libnvml in a source checkout),
which simulates a whole GPU node under the real nvidia-ml-py: written from an `Inventory` (for instance one parsed
from a `nvidia-smi topo -m` text), then driven by appending commands (XID, ECC, temperature, a card off the bus).
Used by the NVML tests and by `gpumgr demo --nvml`. The formats are described in fake_nvml_node.c.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from gpumgr.devices.types import Inventory

ENV = "FAKE_NVML_NODE"  # the variable the library reads the node file's path from
LIBRARY_ENV = "GPUMGR_FAKE_NVML_LIB"  # a built fake library to use instead of the source checkout's
LIBRARY_DIR = Path(__file__).resolve().parents[2] / "tests" / "fakes" / "libnvml"  # only in a source checkout


def library(variant: str = "current") -> Path:
    """Where `make fake-nvml` puts the library (one build per driver age, see its Makefile), or $GPUMGR_FAKE_NVML_LIB
    for today's driver (the variant an installed gpumgr's demo uses)."""
    override = os.environ.get(LIBRARY_ENV, "")
    if override and variant == "current":
        return Path(override)
    return LIBRARY_DIR / "build" / variant / "libnvidia-ml.so.1"


def gpu_bus_id(index: int) -> str:
    """A valid, distinct PCI bus id for GPU `index` (32 per PCI domain, so the bus stays two hex digits)."""
    return f"{index // 32:08X}:{0x07 + 8 * (index % 32):02X}:00.0"


def npu_bus_id(index: int) -> str:
    """The IBM NPU at the CPU end of GPU `index`'s NVLinks: a domain no GPU or NVSwitch uses."""
    return f"0000FFFF:{index % 256:02X}:00.0"


def sysfs_bus(bus_id: str) -> str:
    """NVML's bus id "00000000:07:00.0" as /sys/bus/pci/devices names it: "0000:07:00.0"."""
    dom, rest = bus_id.split(":", 1)
    return f"{int(dom, 16):04x}:{rest.lower()}"


_ANCESTOR = {"PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50}
GPU_PCI_ID = 0x20B010DE  # A100 (device << 16 | NVIDIA vendor)
SWITCH_PCI_ID = 0x1AF110DE  # NVSwitch
NPU_PCI_ID = 0x04EA1014  # IBM NPU (POWER CPU end of an NVLink)
SWITCHES = 6


@dataclass
class FakeNvmlNode:
    """One simulated node: write it with `write()`, point $FAKE_NVML_NODE at `spec`, then drive it."""

    workdir: Path
    inventory: Inventory
    nvswitch: bool | None = None  # None: infer (every pair NV<k> with the same k, 3+ GPUs)
    npu_links: int = 0  # extra NVLinks from every GPU to the CPU (IBM POWER)
    memory_affinity: bool = True  # NVML answers nvmlDeviceGetMemoryAffinity with the GPU's NUMA node
    driver: str = "550.54.15"
    init_error: int = 0
    no_ecc: tuple[int, ...] = ()  # cards with ECC off: no ECC counters, registering for ECC events refused
    bus_ids: list[str] = field(default_factory=list)
    # MIG: card index -> family (a100-40, a100-80, h100-80, h200, a30); cards in `mig_on` start in MIG mode.
    # The instances live in `mig_state` (the "hardware", shared by every process and surviving agent restarts).
    mig: dict[int, str] = field(default_factory=dict)
    mig_on: tuple[int, ...] = ()
    mig_privileged: bool = True
    # card index -> architecture (ampere, hopper, ...); without it, from the MIG family or the card's name
    arch: dict[int, str] = field(default_factory=dict)

    @property
    def spec(self) -> Path:
        return self.workdir / "fake-nvml-node.txt"

    @property
    def control(self) -> Path:
        return self.workdir / "fake-nvml-control.txt"

    @property
    def mig_state(self) -> Path:
        return self.workdir / "fake-nvml-mig-state.txt"

    @property
    def mig_minors(self) -> Path:
        """The node's /proc/driver/nvidia-caps/mig-minors."""
        return self.workdir / "mig-minors"

    def env(self) -> dict[str, str]:
        return {ENV: str(self.spec)}

    def is_switched(self) -> bool:
        if self.nvswitch is not None:
            return self.nvswitch
        n = self.inventory.count
        cells = {self.inventory.levels[a][b] for a in range(n) for b in range(n) if a != b}
        return n >= 3 and len(cells) == 1 and next(iter(cells)).startswith("NV")

    def write(self) -> FakeNvmlNode:
        inv, n = self.inventory, self.inventory.count
        self.bus_ids = [gpu_bus_id(i) for i in range(n)]
        lines = [f"driver {self.driver}", "cuda 12040", f"control {self.control}"]
        if self.init_error:
            lines.append(f"init_error {self.init_error}")
        for i, g in enumerate(inv.gpus):
            lines.append(f"gpu {g.uuid} {g.minor} {self.bus_ids[i]} {g.memory_mib} {GPU_PCI_ID:08X} {g.name}")
            if self.memory_affinity and g.numa_node is not None:
                lines.append(f"memaff {i} {g.numa_node}")
            if i in self.no_ecc:
                lines.append(f"noecc {i}")
        for i, family in sorted(self.mig.items()):
            lines.append(f"mig {i} {family} {1 if i in self.mig_on else 0}")
        for i, arch in sorted(self.arch.items()):
            lines.append(f"arch {i} {arch}")
        if self.mig:
            lines.append(f"migstate {self.mig_state}")
            if not self.mig_privileged:
                lines.append("migpriv 0")
        used = [0] * n
        links: list[str] = []

        def add(i: int, kind: str, bus: str, pci_id: int) -> None:
            links.append(f"link {i} {used[i]} {kind} {bus} {pci_id:08X}")
            used[i] += 1

        if self.is_switched():
            k = int(inv.levels[0][1][2:])
            for i in range(n):
                for link in range(k):
                    add(i, "switch", f"00000000:{0xC0 + link % SWITCHES:02X}:00.0", SWITCH_PCI_ID)
        else:
            for a in range(n):
                for b in range(n):
                    m = re.fullmatch(r"NV(\d+)", inv.levels[a][b])
                    for _ in range(int(m.group(1)) if m else 0):
                        add(a, "gpu", self.bus_ids[b], GPU_PCI_ID)
        for i in range(n):
            for _ in range(self.npu_links):
                add(i, "npu", npu_bus_id(i), NPU_PCI_ID)
        for i in range(n):
            if used[i]:
                lines.append(f"nvlinks {i} {max(used[i], 12)}")
        lines += links
        for a in range(n):
            for b in range(a + 1, n):
                level = inv.levels[a][b]
                lines.append(f"anc {a} {b} {_ANCESTOR.get(level, 40)}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.control.write_text("")
        if self.mig:
            self.mig_state.unlink(missing_ok=True)
            self.mig_minors.write_text(mig_minors_text([g.minor for g in inv.gpus]))
        self.spec.write_text("\n".join(lines) + "\n")
        return self

    def write_sysfs(self, root: Path, numa: dict[int, int]) -> Path:
        """A sysfs tree with `bus/pci/devices/<bus>/numa_node` for the GPUs in `numa` (index -> node)."""
        for i, node in numa.items():
            d = root / "bus" / "pci" / "devices" / sysfs_bus(self.bus_ids[i])
            d.mkdir(parents=True, exist_ok=True)
            (d / "numa_node").write_text(f"{node}\n")
        return root

    # -- what happens on the cards (appended to the control file) ------------------------------------------
    def send(self, command: str) -> None:
        with open(self.control, "a", encoding="ascii") as f:
            f.write(command + "\n")
            f.flush()
            os.fsync(f.fileno())

    def xid(self, gpu: int, code: int, instance: tuple[int, int] | None = None) -> None:
        """An XID on the card, or on one MIG instance (GI, CI)."""
        self.send(f"xid {gpu} {code}" + (f" {instance[0]} {instance[1]}" if instance else ""))

    def double_bit_ecc(self, gpu: int) -> None:
        self.send(f"dbe {gpu}")

    def ecc_count(self, gpu: int, count: int) -> None:
        self.send(f"ecc {gpu} {count}")

    def temperature(self, gpu: int, celsius: int) -> None:
        self.send(f"temp {gpu} {celsius}")

    def fall_off_bus(self, gpu: int) -> None:
        self.send(f"lost {gpu}")

    def back_on_bus(self, gpu: int) -> None:
        self.send(f"back {gpu}")

    def process(self, gpu: int, pid: int, used_bytes: int, sm: int) -> None:
        self.send(f"proc {gpu} {pid} {used_bytes} {sm}")

    def reset(self, gpu: int) -> None:
        """A GPU reset: a pending MIG mode becomes current (Ampere needs one; nothing may run on the card)."""
        self.send(f"reset {gpu}")

    def gpm_load(self, gpu: int, gi: int | None, sm_percent: int) -> None:
        """From now on, GPU instance `gi` of the card (None: the whole card) keeps sm_percent of its SMs busy: what
        GPM's samples (Hopper and later) measure."""
        self.send(f"gpmload {gpu} {'-' if gi is None else gi} {sm_percent}")

    def instance_process(self, gpu: int, gi: int, ci: int, pid: int, running: bool = True) -> None:
        """A process starts (or ends) on a compute instance: destroying a busy one fails with IN_USE."""
        self.send(f"{'ciproc' if running else 'nociproc'} {gpu} {gi} {ci} {pid}")


MAX_GI_IDS = 15  # GPU-instance ids 0..14
MAX_CI_IDS = 8  # compute-instance ids 0..7


def mig_minors_text(gpu_minors: list[int]) -> str:
    """/proc/driver/nvidia-caps/mig-minors as the kernel module lists it: `config M`, `monitor M`, then
    `gpu<minor>/gi<G>/access M` and `gpu<minor>/gi<G>/ci<C>/access M` for every possible instance."""
    lines, m = ["config 1", "monitor 2"], 3
    for minor in gpu_minors:
        for gi in range(MAX_GI_IDS):
            lines.append(f"gpu{minor}/gi{gi}/access {m}")
            m += 1
            for ci in range(MAX_CI_IDS):
                lines.append(f"gpu{minor}/gi{gi}/ci{ci}/access {m}")
                m += 1
    return "\n".join(lines) + "\n"
