from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.dra.harness import DraNode, remove_root, short_root


@pytest.fixture
async def node() -> AsyncIterator[DraNode]:
    root = short_root()
    n = DraNode(root)
    await n.start()
    try:
        yield n
    finally:
        await n.stop()
        remove_root(root)
