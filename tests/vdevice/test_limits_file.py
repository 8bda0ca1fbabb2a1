"""The agent's reader of the limits file follows the same comment rule as the shim and the docs."""

import re
from pathlib import Path

from gpumgr.vdevice.limits import Limits

DOC = Path(__file__).resolve().parents[2] / "docs" / "shim.md"


def _doc_example() -> str:
    text = DOC.read_text()
    section = text.split("### The limits file", 1)[1]
    lines: list[str] = []
    for ln in section.splitlines():
        if ln.startswith("    ") and "=" in ln:
            lines.append(ln[4:])
        elif lines and ln.strip():
            break  # the first indented block is the example
    assert lines, "docs/shim.md lost its example limits file"
    return "\n".join(lines) + "\n"


def test_the_docs_example_with_inline_comments_reads_as_documented() -> None:
    lim = Limits.parse(_doc_example())
    assert lim.core_limit == 30
    assert lim.hard_limit is True
    assert lim.container_name == "main"
    assert len(lim.devices) == 1
    dev = lim.devices[0]
    assert dev.uuid == "GPU-8f6c2b1e-5a4d-4c3b-9e2f-1a2b3c4d5e6f"
    assert dev.index == 3
    assert dev.memory_limit_bytes == 4294967296


def test_a_hash_glued_to_a_value_is_part_of_the_value() -> None:
    lim = Limits.parse("container_name=a#b\ndevice_count=0\n")
    assert lim.container_name == "a#b"
    assert re.fullmatch(r"a#b", lim.container_name)
