"""Reading YAML or JSON input files with line numbers, so that errors can name the file and line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Path_ = tuple[str | int, ...]


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


def load_doc(path: str | Path) -> Doc:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"{p}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise InputError(f"{p}:1: not UTF-8 text") from None
    return parse_doc(text, str(p))


def parse_doc(text: str, source: str) -> Doc:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        raise InputError(f"{source}:{line}: not valid YAML/JSON: {e.problem or e}") from None
    except yaml.YAMLError as e:
        raise InputError(f"{source}:1: not valid YAML/JSON: {e}") from None
    doc = Doc(source=source, data=data)
    if node is not None:
        _index(node, (), doc.lines)
    return doc


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
