"""Small helpers shared by the tests."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
TOPO_FILES = sorted((FIXTURES / "topo").glob("*.txt"))


def topo_path(prefix: str) -> Path:
    matches = [p for p in TOPO_FILES if p.name.startswith(prefix)]
    assert len(matches) == 1, f"fixture {prefix!r}: {matches}"
    return matches[0]
