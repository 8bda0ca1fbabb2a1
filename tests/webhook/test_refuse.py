"""Pods no node could ever run are refused at admission, with a message that names the fix."""

from __future__ import annotations

from typing import Any

import pytest

from tests.webhook.conftest import Webhook
from tests.webhook.reviews import CORE, MEMORY, container, pod, review


async def _refused(webhook: Webhook, p: dict[str, Any]) -> str:
    body = review(p)
    resp = await webhook.review(body)
    assert resp["uid"] == body["request"]["uid"]
    assert resp["allowed"] is False, resp
    assert "patch" not in resp
    assert resp["status"]["code"] == 403
    return str(resp["status"]["message"])


async def test_cores_above_100_not_whole_cards(webhook: Webhook) -> None:
    msg = await _refused(webhook, pod(container("train", limits={CORE: "150"})))
    assert "'train'" in msg and "multiple of 100" in msg and "100 or 200" in msg


async def test_memory_without_cores(webhook: Webhook) -> None:
    msg = await _refused(webhook, pod(container("side"), container("infer", limits={MEMORY: "8"})))
    assert "'infer'" in msg and "without tencent.com/vcuda-core" in msg and f"Add {CORE}" in msg


async def test_share_without_memory(webhook: Webhook) -> None:
    msg = await _refused(webhook, pod(container("infer", limits={CORE: "30"})))
    assert "needs vcuda-memory" in msg and f"Add {MEMORY}" in msg


async def test_init_container_is_checked_too(webhook: Webhook) -> None:
    msg = await _refused(webhook, pod(container("app"), init=(container("warm", limits={CORE: "250"}),)))
    assert "init container 'warm'" in msg and "200 or 300" in msg


@pytest.mark.parametrize("value", ["1.5", "abc", "500m", True, -100])
async def test_quantities_that_are_not_whole_numbers(webhook: Webhook, value: Any) -> None:
    msg = await _refused(webhook, pod(container("train", requests={CORE: value})))
    assert f"resources.requests[{CORE}]" in msg and "whole numbers" in msg


async def test_whole_cards_and_shares_that_can_run_are_allowed(webhook: Webhook) -> None:
    for limits in ({CORE: "100"}, {CORE: "1k"}, {CORE: "50", MEMORY: "4"}, {CORE: 300, MEMORY: "200"}):
        resp = await webhook.review(review(pod(container("ok", limits=limits))))
        assert resp["allowed"] is True, (limits, resp)


async def test_too_many_containers(webhook: Webhook) -> None:
    p = pod(*[container(f"c{i}") for i in range(300)])
    assert "more than 256 containers" in await _refused(webhook, p)


@pytest.mark.parametrize("cores", ["9000000000000000000", "1700", "100k"])
async def test_more_whole_cards_than_the_cap_are_refused(webhook: Webhook, cores: str) -> None:
    msg = await _refused(webhook, pod(container("huge", limits={CORE: cores})))
    assert "'huge'" in msg and "at most 16 whole cards" in msg and "--max-cards-per-container" in msg


async def test_the_card_cap_is_configurable(certs: Any) -> None:
    from gpumgr.webhook.server import WebhookServer

    server = WebhookServer("gpumgr-scheduler", None, max_cards=2)
    port = await server.start("127.0.0.1", 0)
    try:
        import aiohttp

        async with aiohttp.ClientSession() as http:
            hook = Webhook(server, f"http://127.0.0.1:{port}", http)
            assert (await hook.review(review(pod(container("two", limits={CORE: "200"})))))["allowed"] is True
            msg = await _refused(hook, pod(container("three", limits={CORE: "300"})))
            assert "asks 3 whole cards" in msg and "at most 2" in msg
    finally:
        await server.stop()
