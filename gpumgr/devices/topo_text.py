"""Parser for the text `nvidia-smi topo -m` prints.

Real outputs vary: tabs or spaces, NIC rows and columns (`NIC0` or `mlx5_0`), `SOC` in old drivers, CPU/NUMA
affinity columns (sometimes blank, ranges or lists), a GPU NUMA ID column, a legend, comment prefixes (`#`) from
being pasted into scripts, and a misaligned header. Only the GPU x GPU block and each GPU's NUMA node are kept.
Pastes often carry a UTF-8 byte-order mark, or a header whose GPU names ran together (`GPU0GPU1GPU2`); both
are read. Broken input raises `TopoParseError` naming the line. At most `max_gpus` GPU columns (default
1024) are accepted, and a GPU index has at most 4 ASCII digits; a header column or row label that starts with
`GPU` but is not `GPU<ASCII digits>` (`GPU١`, `GPUx`) is refused with its line, never read as another device.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpumgr.topology import levels as lv

_GPU = re.compile(r"GPU([0-9]+)")
_GPU_RUN = re.compile(r"(GPU[0-9]+)")
_AFFINITY_START = {"CPU", "NUMA"}
MAX_INDEX_DIGITS = 4
DEFAULT_MAX_GPUS = 1024
LABEL_RULE = "a GPU label is GPU followed by ASCII digits (GPU0, GPU1, ...)"


class TopoParseError(ValueError):
    """The text is not a usable `nvidia-smi topo -m` matrix; the message names the line."""


def parse_topo_text(text: str, source: str = "<topo>", max_gpus: int = DEFAULT_MAX_GPUS) -> TopoMatrix:
    lines = [_uncomment(raw) for raw in text.removeprefix("\ufeff").splitlines()]
    header_no, header = _find_header(lines, source)
    gpu_cols, aff_cols = _header_columns(header, f"{source}:{header_no + 1}")
    n = len(gpu_cols)
    if n > max_gpus:
        raise TopoParseError(f"{source}:{header_no + 1}: the header lists {n} GPUs; at most {max_gpus} are accepted "
                             "(GPUMGR_MAX_GPUS raises the limit)")
    rows: dict[int, tuple[int, list[str], dict[str, str]]] = {}
    for no in range(header_no + 1, len(lines)):
        line = lines[no]
        first = line.split(maxsplit=1)[0] if line.strip() else ""
        m = _GPU.fullmatch(first)
        where = f"{source}:{no + 1}"
        if not m:
            if first.startswith("GPU"):  # GPU١, GPUx: a malformed label, never another kind of row
                raise TopoParseError(f"{where}: {_clip(first)!r} is not a GPU label: {LABEL_RULE}")
            continue
        idx = _index(m.group(1), where)
        if idx >= n:
            raise TopoParseError(f"{where}: row GPU{idx} but the header has only {n} GPU columns")
        if idx in rows:
            raise TopoParseError(f"{where}: GPU{idx} appears twice (first on line {rows[idx][0]})")
        cells = line.split()[1:]
        if len(cells) < n:
            raise TopoParseError(f"{where}: GPU{idx} row has {len(cells)} cells, expected at least {n}")
        block = []
        for j, cell in enumerate(cells[:n]):
            if not cell.isascii():
                raise TopoParseError(f"{where}: GPU{idx} to GPU{j}: {_clip(cell)!r} is not a link level")
            if j == idx:
                if cell != "X":
                    raise TopoParseError(f"{where}: GPU{idx} against itself should be 'X', found {cell!r}")
                block.append("X")
                continue
            try:
                block.append(lv.normalize(cell))
            except ValueError as e:
                raise TopoParseError(f"{where}: GPU{idx} to GPU{j}: {e}") from None
        rows[idx] = (no + 1, block, _affinity(line, n, aff_cols))
    missing = [i for i in range(n) if i not in rows]
    if missing:
        raise TopoParseError(f"{source}: no row for GPU{missing[0]} (header line {header_no + 1} lists {n} GPUs)")
    levels = tuple(tuple(rows[i][1]) for i in range(n))
    for i in range(n):
        for j in range(i + 1, n):
            if levels[i][j] != levels[j][i]:
                raise TopoParseError(
                    f"{source}:{rows[i][0]}: GPU{i}-GPU{j} is {levels[i][j]} but line {rows[j][0]} "
                    f"says GPU{j}-GPU{i} is {levels[j][i]}"
                )
    numa = tuple(_first_int(rows[i][2].get("NUMA Affinity", "")) for i in range(n))
    cpus = tuple(rows[i][2].get("CPU Affinity", "") for i in range(n))
    return TopoMatrix(levels=levels, numa_nodes=numa, cpu_affinity=cpus)


def _uncomment(raw: str) -> str:
    line = raw.rstrip("\r\n")
    stripped = line.lstrip()
    while stripped.startswith("#"):
        stripped = stripped[1:]
        line = stripped
        stripped = stripped.lstrip()
    return line


def _index(digits: str, where: str) -> int:
    if len(digits) > MAX_INDEX_DIGITS:
        raise TopoParseError(f"{where}: GPU index {_clip(digits)} has more than {MAX_INDEX_DIGITS} digits")
    return int(digits)


def _clip(text: str, width: int = 24) -> str:
    return text if len(text) <= width else text[:width] + "..."


def _tokens(line: str) -> list[str]:
    """The header's tokens, with GPU names that ran together (`GPU0GPU1GPU2`, `GPU3CPU`) taken apart."""
    out: list[str] = []
    for tok in line.split():
        if tok.startswith("GPU") and _GPU_RUN.match(tok) and not _GPU.fullmatch(tok):
            out.extend(part for part in _GPU_RUN.split(tok) if part)
        else:
            out.append(tok)
    return out


def _find_header(lines: list[str], source: str) -> tuple[int, list[str]]:
    for no, line in enumerate(lines):
        tokens = _tokens(line)
        if tokens and tokens[0] == "GPU0" and len(tokens) > 1 and tokens[1] != "X":
            return no, tokens
    first = next(((no, ln.strip()) for no, ln in enumerate(lines) if ln.strip()), None)
    if first is None:
        raise TopoParseError(f"{source}: the file is empty (expected the output of `nvidia-smi topo -m`)")
    no, text = first
    raise TopoParseError(f"{source}:{no + 1}: no header line: expected a line of columns 'GPU0 GPU1 ...' "
                         f"before the GPU rows; line {no + 1} reads {_clip(text, 60)!r}")


def _header_columns(tokens: list[str], where: str) -> tuple[list[str], list[str]]:
    devices: list[str] = []
    for i, tok in enumerate(tokens):
        if tok in _AFFINITY_START or (tok == "GPU" and i + 1 < len(tokens) and tokens[i + 1] == "NUMA"):
            break
        devices.append(tok)
    gpus = []
    for tok in devices:
        m = _GPU.fullmatch(tok)
        if not m:
            if tok.startswith("GPU"):  # GPU١ would otherwise end the GPU columns: a one-GPU node, no error
                raise TopoParseError(f"{where}: header column {_clip(tok)!r} is not a GPU label: {LABEL_RULE}")
            break
        _index(m.group(1), where)
        gpus.append(tok)
    expected = (f"GPU{i}" for i in range(len(gpus)))
    wrong = next(((i, g) for i, (g, e) in enumerate(zip(gpus, expected, strict=True)) if g != e), None)
    if wrong is not None:
        raise TopoParseError(f"{where}: header GPU columns are not GPU0..GPU{len(gpus) - 1} in order: column "
                             f"{wrong[0] + 1} is {_clip(wrong[1])}")
    tail = " ".join(tokens[len(devices):])
    found = sorted((tail.find(c), c) for c in ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID") if c in tail)
    return gpus, [c for _, c in found]


def _affinity(line: str, n: int, columns: list[str]) -> dict[str, str]:
    """Map a GPU row's trailing affinity values to the header's affinity columns."""
    if not columns:
        return {}
    if "\t" in line:
        fields = [f.strip() for f in line.split("\t")]
        if fields and fields[0] == "":
            fields = fields[1:]
        values = fields[1:]
        # skip the device cells (GPUs and NICs): everything up to the first non-level value
        k = n
        while k < len(values) and (values[k] == "X" or lv.is_level(values[k])):
            k += 1
        rest = values[k:]
    else:
        tokens = line.split()[1:]
        k = n
        while k < len(tokens) and (tokens[k] == "X" or lv.is_level(tokens[k])):
            k += 1
        rest = tokens[k:]
    return {col: rest[i] for i, col in enumerate(columns) if i < len(rest)}


def _first_int(text: str) -> int | None:
    m = re.match(r"\s*([0-9]{1,6})", text)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class TopoMatrix:
    levels: tuple[tuple[str, ...], ...]  # canonical levels, "X" on the diagonal
    numa_nodes: tuple[int | None, ...]
    cpu_affinity: tuple[str, ...]

    @property
    def count(self) -> int:
        return len(self.levels)
