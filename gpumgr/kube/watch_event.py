"""One line of a Kubernetes watch stream, decoded within the bounds of gpumgr.kube.pace, the same way for both of
gpumgr's watchers: the agent's (gpumgr/kube/rest.py, aiohttp) and the extender's (gpumgr/extender/watcher.py,
urllib3). Each turns the ValueError into its own error type; what one takes the other takes. Every event the API
server sends (ADDED, MODIFIED, DELETED, BOOKMARK, ERROR) carries an object, so a line without one is refused."""

from __future__ import annotations

from typing import Any

from gpumgr.kube.pace import MAX_EVENT_ELEMENTS
from gpumgr.serving import jsonbound


def parse_event(line: bytes) -> dict[str, Any]:
    """The event of one watch line (a JSON object with an object `object`); ValueError naming what is wrong, with
    the line's first 80 bytes."""
    try:
        event = jsonbound.loads(line, max_elements=MAX_EVENT_ELEMENTS, max_depth=jsonbound.API_OBJECT_DEPTH,
                                what="a watch event")
    except ValueError:
        raise ValueError(f"a watch event is not JSON within bounds: {line[:80]!r}") from None
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
        raise ValueError(f"a watch event without an object: {line[:80]!r}")
    return event
