"""The limits of one container, and their text form (the `limits` file beside `vcuda.sock`).

One `key=value` per line; `#` comments; unknown keys ignored by readers. See docs/vdevice.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FORMAT_VERSION = 1
# How a device's compute limit is enforced (see docs/mig.md, "Limits inside an instance"):
#   process  NVML per-process utilisation (a card, or a share of one)
#   gpm      GPM per-instance SM utilisation (a share inside a MIG instance on Hopper and later)
#   none     nothing to measure by (a share inside a MIG instance on a card without GPM): not enforced
COMPUTE_MODES = ("process", "gpm", "none")


@dataclass(frozen=True)
class DeviceLimit:
    uuid: str
    index: int
    memory_limit_bytes: int  # 0 = no cap (whole card)
    compute: str = "process"  # one of COMPUTE_MODES; absent from an older agent's file or answer: process


@dataclass(frozen=True)
class Limits:
    pod_uid: str
    container_name: str
    core_limit: int  # percent of one card; 0 = no compute limit (whole cards)
    hard_limit: bool
    core_ceiling: int  # soft mode upper bound, percent; 0 = 100
    devices: tuple[DeviceLimit, ...] = field(default_factory=tuple)

    def to_text(self) -> str:
        lines = [
            "# gpumgr container limits (written by the node agent; read-only in the container)",
            f"version={FORMAT_VERSION}",
            f"pod_uid={self.pod_uid}",
            f"container_name={self.container_name}",
            f"core_limit={self.core_limit}",
            f"hard_limit={1 if self.hard_limit else 0}",
            f"core_ceiling={self.core_ceiling}",
            f"device_count={len(self.devices)}",
        ]
        for i, d in enumerate(self.devices):
            lines += [f"device{i}_uuid={d.uuid}", f"device{i}_index={d.index}",
                      f"device{i}_memory_limit={d.memory_limit_bytes}", f"device{i}_compute={d.compute}"]
        return "\n".join(lines) + "\n"

    @classmethod
    def parse(cls, text: str) -> Limits:
        kv: dict[str, str] = {}
        for raw in text.splitlines():
            line = _strip_comment(raw).strip()
            if not line or "=" not in line:
                continue
            k, _, v = line.partition("=")
            kv[k.strip()] = v.strip()
        n = int(kv.get("device_count", "0"))
        devices = tuple(
            DeviceLimit(uuid=kv[f"device{i}_uuid"], index=int(kv.get(f"device{i}_index", "0")),
                        memory_limit_bytes=int(kv.get(f"device{i}_memory_limit", "0")),
                        compute=_compute(kv.get(f"device{i}_compute", "process")))
            for i in range(n)
        )
        return cls(pod_uid=kv.get("pod_uid", ""), container_name=kv.get("container_name", ""),
                   core_limit=int(kv.get("core_limit", "0")), hard_limit=kv.get("hard_limit", "1") == "1",
                   core_ceiling=int(kv.get("core_ceiling", "0")), devices=devices)


def _compute(value: str) -> str:
    if value not in COMPUTE_MODES:
        raise ValueError(f"compute must be one of {', '.join(COMPUTE_MODES)}, got {value[:20]!r}")
    return value


def _strip_comment(line: str) -> str:
    """The shim's rule: `#` at the start of a line or after a space or tab starts a comment; a `#` glued to a value
    is part of the value."""
    for i, ch in enumerate(line):
        if ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line
