"""Reading YAML or JSON input files with line numbers, so that errors can name the file and line.

Input files are bounded before and while they are parsed (see docs/configuration.md, "Input limits"):
at most `GPUMGR_MAX_INPUT_BYTES` bytes (default 1 MiB), nesting at most `MAX_DEPTH` deep, and no YAML aliases
(`*name`, also `<<: *name`): an alias lets a few hundred bytes stand for billions of values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpumgr.requests.podspec import ascii_uint

Path_ = tuple[str | int, ...]

DEFAULT_MAX_INPUT_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_BYTES_ENV = "GPUMGR_MAX_INPUT_BYTES"


class InputError(ValueError):
    """Bad input; str() names the file and line: `file:line: what is wrong`."""


@dataclass
class Doc:
    """A parsed document and the line of every value in it (1-based)."""

    source: str
    data: Any
    lines: dict[Path_, int] = field(default_factory=dict)

    def line(self, path: Path_) -> int:
        while path and path not in self.lines:
            path = path[:-1]
        return self.lines.get(path, 1)

    def error(self, path: Path_, message: str) -> InputError:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
        prefix = f"{where}: " if where else ""
        return InputError(f"{self.source}:{self.line(path)}: {prefix}{message}")


def env_limit(name: str, default: int) -> int:
    """A positive whole-number limit from the environment (ASCII digits only), else `default`."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    value = ascii_uint(raw, 18)
    if value is None or value <= 0:
        raise InputError(f"{name} must be a positive whole number, got {raw[:40]!r}")
    return value


def max_input_bytes() -> int:
    return env_limit(MAX_BYTES_ENV, DEFAULT_MAX_INPUT_BYTES)


def read_text_bounded(path: str | Path, what: str = "file", errors: str = "strict") -> str:
    """A whole UTF-8 text file of at most `max_input_bytes()` bytes, or InputError naming the file."""
    p = Path(path)
    limit = max_input_bytes()
    try:
        with p.open("rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise InputError(f"{p}: cannot read: {e.strerror or e}") from None
    if len(data) > limit:
        raise InputError(f"{p}: {what} is larger than {limit} bytes (set {MAX_BYTES_ENV} to allow more)")
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError:
        raise InputError(f"{p}:1: not UTF-8 text") from None


def load_doc(path: str | Path) -> Doc:
    p = Path(path)
    return parse_doc(read_text_bounded(p, "the document"), str(p))


def parse_doc(text: str, source: str) -> Doc:
    if len(text) > max_input_bytes():
        raise InputError(f"{source}: the document is larger than {max_input_bytes()} bytes "
                         f"(set {MAX_BYTES_ENV} to allow more)")
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except _Refused as e:
        raise InputError(f"{source}:{e.line}: {e.reason}") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        raise InputError(f"{source}:{line}: not valid YAML/JSON: {e.problem or e}") from None
    except yaml.YAMLError as e:
        raise InputError(f"{source}:1: not valid YAML/JSON: {e}") from None
    except RecursionError:  # not reachable with MAX_DEPTH, kept so that no input can ever print a traceback
        raise InputError(f"{source}:1: nested too deeply") from None
    finally:
        loader.dispose()
    doc = Doc(source=source, data=data)
    if node is not None:
        _index(node, (), doc.lines)
    return doc


class _Refused(Exception):
    def __init__(self, line: int, reason: str):
        super().__init__(reason)
        self.line = line
        self.reason = reason


class _BoundedLoader(yaml.SafeLoader):
    """The safe loader, refusing aliases and nesting deeper than MAX_DEPTH while it composes."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise _Refused(mark.line + 1, "YAML aliases (*name) are not accepted in gpumgr input files; "
                                          "write the value out in full")
        if self._depth >= MAX_DEPTH:
            mark = self.peek_event().start_mark
            raise _Refused(mark.line + 1, f"nested more than {MAX_DEPTH} levels deep")
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """Python's own limits (a 5000-digit int, a 13th month) become a refusal naming the value's line."""
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as e:
            reason = str(e) if len(str(e)) <= 120 else str(e)[:120] + "..."
            raise _Refused(node.start_mark.line + 1, f"a value that cannot be read: {reason}") from None


def _index(node: yaml.Node, path: Path_, out: dict[Path_, int]) -> None:
    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else str(k)
            _index(v, (*path, key), out)
            out[(*path, key)] = k.start_mark.line + 1  # the key's line reads best in messages
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _index(v, (*path, i), out)
