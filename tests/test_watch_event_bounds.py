"""One parser for a watch event line (gpumgr.kube.watch_event.parse_event), used by both watchers: the agent's
(gpumgr/kube/rest.py, aiohttp) and the extender's (gpumgr/extender/watcher.py, urllib3). They used to differ: one
element per 16 bytes of MAX_EVENT_BYTES in the agent, per 8 in the extender, so an event one took the other
refused; and the extender took an event without an object, which the agent refused."""

from __future__ import annotations

import pytest

from gpumgr.kube.pace import MAX_EVENT_BYTES, MAX_EVENT_ELEMENTS
from gpumgr.kube.watch_event import parse_event


def event(zeros: int) -> bytes:
    """A MODIFIED event of 4 + `zeros` elements (the event, its type and object keys, the object, its array key, the
    array and its numbers): small in bytes, many elements."""
    return b'{"type":"MODIFIED","object":{"a":[' + b",".join([b"0"] * zeros) + b"]}}"


def test_an_event_within_the_element_bound_is_taken_and_one_past_it_refused():
    fits = event(MAX_EVENT_ELEMENTS - 10)
    assert len(fits) < MAX_EVENT_BYTES
    assert parse_event(fits)["type"] == "MODIFIED"
    over = event(MAX_EVENT_ELEMENTS + 10)  # before: the extender's watcher took this one
    assert len(over) < MAX_EVENT_BYTES
    with pytest.raises(ValueError, match="not JSON within bounds"):
        parse_event(over)


@pytest.mark.parametrize("line", [b'{"type":"MODIFIED"}', b'{"type":"ADDED","object":null}',
                                  b'{"type":"DELETED","object":[1]}', b'["MODIFIED",{}]'])
def test_an_event_without_an_object_is_refused(line: bytes):
    with pytest.raises(ValueError, match="without an object"):  # before: the extender's watcher took the first two
        parse_event(line)


def test_both_watchers_use_the_one_parser():
    from gpumgr.extender import watcher
    from gpumgr.kube import rest

    assert watcher.parse_event is rest.parse_event is parse_event
