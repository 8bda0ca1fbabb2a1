"""One bound for the JSON elements of a watch event (gpumgr.kube.pace.MAX_EVENT_ELEMENTS), in both watchers: the
agent's (gpumgr/kube/rest.py, aiohttp) and the extender's (gpumgr/extender/watcher.py, urllib3). They used to
differ (one element per 16 bytes of MAX_EVENT_BYTES in the agent, per 8 in the extender), so an event one took
the other refused."""

from __future__ import annotations

import pytest

from gpumgr.extender import watcher
from gpumgr.extender.kubeaccess import ApiCallError
from gpumgr.kube import rest
from gpumgr.kube.pace import MAX_EVENT_BYTES, MAX_EVENT_ELEMENTS
from gpumgr.kube.rest import ApiError


def event(zeros: int) -> bytes:
    """A MODIFIED event of 4 + `zeros` elements (the event, its type and object keys, the object, its array key, the
    array and its numbers): small in bytes, many elements."""
    return b'{"type":"MODIFIED","object":{"a":[' + b",".join([b"0"] * zeros) + b"]}}"


def test_both_watchers_take_and_refuse_the_same_events():
    fits = event(MAX_EVENT_ELEMENTS - 10)
    assert len(fits) < MAX_EVENT_BYTES
    assert rest._event(fits)["type"] == watcher._event(fits)["type"] == "MODIFIED"
    over = event(MAX_EVENT_ELEMENTS + 10)  # before: the extender's watcher took this one
    assert len(over) < MAX_EVENT_BYTES
    with pytest.raises(ApiError, match="not JSON within bounds"):
        rest._event(over)
    with pytest.raises(ApiCallError, match="a watch event"):
        watcher._event(over)
