"""`gpumgr.serving.jsonbound`: the scan of the bytes agrees with the document it lets through, and refuses cheaply."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumgr.serving import jsonbound

TEXT = st.text(alphabet='ab{}[],:"\\ \u00e9\n', max_size=6)
DOCS = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(TEXT, kids, max_size=4),
                    max_leaves=40)


def elements(doc: Any) -> int:
    if isinstance(doc, dict):
        return 1 + len(doc) + sum(elements(v) for v in doc.values())
    if isinstance(doc, list):
        return 1 + sum(elements(v) for v in doc)
    return 1


def depth(doc: Any) -> int:
    if isinstance(doc, dict | list):
        kids = doc.values() if isinstance(doc, dict) else doc
        return 1 + max((depth(k) for k in kids), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(DOCS, st.integers(1, 60), st.integers(1, 6), st.booleans())
def test_refused_exactly_when_over_a_bound(doc: Any, max_elements: int, max_depth: int, ascii_only: bool) -> None:
    raw = json.dumps(doc, ensure_ascii=ascii_only).encode()
    over = elements(doc) > max_elements or depth(doc) > max_depth
    try:
        got = jsonbound.loads(raw, max_elements=max_elements, max_depth=max_depth)
    except jsonbound.JsonBoundsError as e:
        assert over, (raw, str(e))
        return
    assert not over, raw
    assert got == doc


@pytest.mark.parametrize("piece", [b"{}", b"[]", b"0", b'""', b"null", b'{"":0}', b'"\\\\"'])
def test_a_million_of_anything_is_refused_before_decoding(piece: bytes) -> None:
    raw = b"[" + b",".join([piece] * 1_000_000) + b"]"
    with pytest.raises(jsonbound.JsonBoundsError, match="at most 100000 are accepted"):
        jsonbound.loads(raw, max_elements=100_000, max_depth=64)


def test_malformed_json_is_left_to_the_parser_to_describe() -> None:
    for raw in (b'{"a": ', b"[[[", b"]]", b'"abc', b"\xff"):
        with pytest.raises(jsonbound.JsonBoundsError, match="not JSON"):
            jsonbound.loads(raw, max_elements=10, max_depth=3)
