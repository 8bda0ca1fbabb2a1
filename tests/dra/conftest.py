from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.dra.harness import DraNode, running_node


@pytest.fixture
async def node() -> AsyncIterator[DraNode]:
    async with running_node(DraNode) as n:
        yield n
