"""Node spec files for the simulated backend: the GPUs of a node and how they are wired.

YAML or JSON:

    name: sim-node                      # optional
    driver_version: "550.54.15"         # optional
    cuda_driver_version: "12.4"         # optional
    defaults: {model: "NVIDIA A100-SXM4-40GB", memory_mib: 40960}
    gpus:                               # optional if the topology gives the count
      - {model: ..., memory_mib: ..., uuid: ..., minor: ..., bus_id: ..., numa_node: ...}
    topology:                           # exactly one of:
      levels: [["X", "NV12"], ["NV12", "X"]]
      nvidia_smi: |                     # the text of `nvidia-smi topo -m`
        ...
      file: topo.txt                    # such a text in a file, relative to the spec

At most `max_gpus()` GPUs (default 1024, env GPUMGR_MAX_GPUS) in a spec, a levels matrix or a topology text.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from gpumgr.devices.topo_text import DEFAULT_MAX_GPUS, TopoMatrix, TopoParseError, parse_topo_text
from gpumgr.devices.types import GPU, Inventory
from gpumgr.files.docfile import Doc, InputError, env_limit, load_doc, read_text_bounded
from gpumgr.requests.podspec import ascii_uint
from gpumgr.topology import levels as lv

DEFAULT_MODEL = "NVIDIA Tesla (simulated)"
DEFAULT_MEMORY_MIB = 16384
ASSUMED_MODEL = "unknown model (assumed)"  # what `--topo-file` cards are called unless --gpu-model says
MAX_GPUS_ENV = "GPUMGR_MAX_GPUS"


def max_gpus() -> int:
    """How many GPUs a spec or a topology may declare (env GPUMGR_MAX_GPUS, default 1024)."""
    return env_limit(MAX_GPUS_ENV, DEFAULT_MAX_GPUS)


def load_node_spec(path: str | Path) -> Inventory:
    doc = load_doc(path)
    return inventory_from_doc(doc, Path(path).parent)


def inventory_from_topo_file(path: str | Path, memory_mib: int = DEFAULT_MEMORY_MIB,
                             model: str = DEFAULT_MODEL) -> Inventory:
    p = Path(path)
    if not model.strip() or len(model) > 256 or not model.isprintable():
        raise InputError(f"the GPU model must be 1 to 256 printable characters, got {model[:40]!r}")
    text = read_text_bounded(p, "the topology text", errors="replace")
    try:
        matrix = parse_topo_text(text, str(p), max_gpus=max_gpus())
    except TopoParseError as e:
        raise InputError(str(e)) from None
    gpus = [_gpu(i, {}, {"model": model, "memory_mib": memory_mib}, matrix, p.stem) for i in range(matrix.count)]
    return Inventory(gpus=tuple(gpus), levels=matrix.levels)


def inventory_from_doc(doc: Doc, base: Path) -> Inventory:
    data = doc.data
    if not isinstance(data, dict):
        raise doc.error((), "a node spec must be a mapping with 'gpus' and/or 'topology'")
    unknown = set(data) - {"name", "driver_version", "cuda_driver_version", "defaults", "gpus", "topology"}
    if unknown:
        raise doc.error((sorted(unknown)[0],), "unknown key (expected name, driver_version, "
                        "cuda_driver_version, defaults, gpus, topology)")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise doc.error(("defaults",), "must be a mapping")
    matrix = _topology(doc, base)
    gpus_in = data.get("gpus")
    if gpus_in is None:
        if matrix is None:
            raise doc.error((), "needs 'gpus' or 'topology' (nothing says how many GPUs there are)")
        gpus_in = [{} for _ in range(matrix.count)]
    if not isinstance(gpus_in, list) or not gpus_in:
        raise doc.error(("gpus",), "must be a non-empty list")
    if len(gpus_in) > max_gpus():
        raise doc.error(("gpus",), f"lists {len(gpus_in)} GPUs; at most {max_gpus()} are accepted "
                        f"({MAX_GPUS_ENV} raises the limit)")
    if matrix is not None and matrix.count != len(gpus_in):
        raise doc.error(("gpus",), f"lists {len(gpus_in)} GPUs but the topology has {matrix.count}")
    name = str(data.get("name", "node"))
    gpus = []
    for i, g in enumerate(gpus_in):
        if not isinstance(g, dict):
            raise doc.error(("gpus", i), "must be a mapping")
        try:
            gpus.append(_gpu(i, g, defaults, matrix, name))
        except (TypeError, ValueError) as e:
            raise doc.error(("gpus", i), f"bad value: {e}") from None
    uuids = [g.uuid for g in gpus]
    if len(set(uuids)) != len(uuids):
        raise doc.error(("gpus",), "UUIDs must be unique")
    minors = [g.minor for g in gpus]
    if len(set(minors)) != len(minors):
        raise doc.error(("gpus",), "minor numbers must be unique")
    if matrix is None:
        levels = tuple(tuple("X" if i == j else "SYS" for j in range(len(gpus))) for i in range(len(gpus)))
    else:
        levels = matrix.levels
    return Inventory(
        gpus=tuple(gpus), levels=levels,
        driver_version=str(data.get("driver_version", "")),
        cuda_driver_version=str(data.get("cuda_driver_version", "")),
    )


def _topology(doc: Doc, base: Path) -> TopoMatrix | None:
    topo = doc.data.get("topology")
    if topo is None:
        return None
    if not isinstance(topo, dict) or len(set(topo) & {"levels", "nvidia_smi", "file"}) != 1 or len(topo) != 1:
        raise doc.error(("topology",), "must have exactly one of 'levels', 'nvidia_smi' or 'file'")
    if "levels" in topo:
        return _levels(doc, topo["levels"])
    if "nvidia_smi" in topo:
        text, source = str(topo["nvidia_smi"]), f"{doc.source}:topology.nvidia_smi"
        offset = doc.line(("topology", "nvidia_smi"))
    else:
        f = base / str(topo["file"])
        try:
            text, source, offset = read_text_bounded(f, "the topology text", errors="replace"), str(f), 0
        except InputError as e:
            raise doc.error(("topology", "file"), str(e)) from None
    try:
        return parse_topo_text(text, source, max_gpus=max_gpus())
    except TopoParseError as e:
        if offset:
            raise doc.error(("topology", "nvidia_smi"), f"in the embedded text (block starts at line "
                            f"{offset + 1}): {e}") from None
        raise InputError(str(e)) from None


def _levels(doc: Doc, rows: Any) -> TopoMatrix:
    if not isinstance(rows, list) or not rows or not all(isinstance(r, list) for r in rows):
        raise doc.error(("topology", "levels"), "must be a square list of lists")
    n = len(rows)
    if n > max_gpus():
        raise doc.error(("topology", "levels"), f"has {n} rows; at most {max_gpus()} GPUs are accepted "
                        f"({MAX_GPUS_ENV} raises the limit)")
    out = []
    for i, row in enumerate(rows):
        if len(row) != n:
            raise doc.error(("topology", "levels", i), f"row has {len(row)} entries, expected {n}")
        cells = []
        for j, cell in enumerate(row):
            text = str(cell).strip()
            if not text.isascii() or len(text) > 16:
                raise doc.error(("topology", "levels", i, j), f"not a link level: {text[:20]!r}")
            if i == j:
                if text not in ("X", "x"):
                    raise doc.error(("topology", "levels", i, j), f"diagonal must be 'X', found {text!r}")
                cells.append("X")
                continue
            try:
                cells.append(lv.normalize(text))
            except ValueError as e:
                raise doc.error(("topology", "levels", i, j), str(e)) from None
        out.append(tuple(cells))
    for i in range(n):
        for j in range(i + 1, n):
            if out[i][j] != out[j][i]:
                raise doc.error(("topology", "levels", j, i),
                                f"GPU{j}-GPU{i} is {out[j][i]} but GPU{i}-GPU{j} is {out[i][j]}")
    return TopoMatrix(levels=tuple(out), numa_nodes=tuple(None for _ in range(n)), cpu_affinity=("",) * n)


def _gpu(i: int, g: dict[str, Any], defaults: dict[str, Any], matrix: TopoMatrix | None, node: str) -> GPU:
    allowed = {"model", "name", "memory_mib", "uuid", "minor", "bus_id", "numa_node"}
    extra = set(g) - allowed
    if extra:
        raise ValueError(f"unknown key {sorted(extra)[0]!r} (allowed: {', '.join(sorted(allowed))})")

    def pick(key: str, fallback: Any) -> Any:
        return g.get(key, defaults.get(key, fallback))

    memory = pick("memory_mib", DEFAULT_MEMORY_MIB)
    if isinstance(memory, bool) or not isinstance(memory, int) or memory <= 0:
        raise ValueError(f"memory_mib must be a positive whole number of MiB, got {memory!r}")
    numa = g.get("numa_node", matrix.numa_nodes[i] if matrix is not None else None)
    if isinstance(numa, str) and (number := ascii_uint(numa, 5)) is not None:
        numa = number  # "3" as well as 3; never Unicode digits
    if numa is not None and (isinstance(numa, bool) or not isinstance(numa, int) or not 0 <= numa < 1 << 16):
        raise ValueError(f"numa_node must be a whole number 0..65535 or absent, got {numa!r}")
    minor = pick("minor", i) if "minor" in g else i
    if isinstance(minor, bool) or not isinstance(minor, int) or minor < 0:
        raise ValueError(f"minor must be a whole number >= 0, got {minor!r}")
    return GPU(
        index=i,
        uuid=str(g.get("uuid") or f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.gpu{i}.gpumgr.sim')}"),
        minor=minor,
        name=str(g.get("model", g.get("name", defaults.get("model", DEFAULT_MODEL)))),
        memory_mib=memory,
        bus_id=str(g.get("bus_id") or f"00000000:{0x10 + i:02X}:00.0"),
        numa_node=numa,
    )
