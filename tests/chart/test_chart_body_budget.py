"""Issue 18, finding 3: the extender's and the webhook's budget for request bodies in flight comes from the
container's memory limit, which the chart hands them (GPUMGR_MEMORY_LIMIT_BYTES from resources.limits.memory,
the downward API in bytes); a body limit that cannot fit in it is refused at start, naming the largest that can."""

from __future__ import annotations

import argparse
import re
from typing import Any

import pytest

from gpumgr.commands import extender as extender_command
from gpumgr.commands import webhook as webhook_command
from gpumgr.files.docfile import InputError

from .support import PREFIX, container, render

UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
MEMORY_ENV = {"name": "GPUMGR_MEMORY_LIMIT_BYTES", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}}}


def _bytes(quantity: str) -> int:
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi)", quantity)
    assert m, quantity
    return int(m.group(1)) * UNITS[m.group(2)]


def _parse(module: Any, args: list[str], memory: int) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpumgr")
    module.register(parser.add_subparsers(dest="command"))
    ns = parser.parse_args(args)
    ns.memory_limit_bytes = str(memory)  # what the kubelet puts in GPUMGR_MEMORY_LIMIT_BYTES
    return ns


@pytest.mark.parametrize("component", ["extender", "webhook"])
def test_the_chart_hands_the_memory_limit_to_the_process(component: str) -> None:
    c = container(render().get("Deployment", f"{PREFIX}-{component}"), component)
    assert MEMORY_ENV in c["env"]
    memory = _bytes(c["resources"]["limits"]["memory"])
    module = extender_command if component == "extender" else webhook_command
    limits = module._limits(_parse(module, c["args"], memory))
    budget = limits.budget_bytes if component == "extender" else None
    if budget is not None:
        assert limits.max_body_bytes <= budget <= memory * 3 // 8 - limits.decode_peak_bytes


def test_without_a_memory_limit_no_variable_is_set() -> None:
    values = {c: {"resources": {"limits": {"memory": None}}} for c in ("extender", "webhook")}  # null: removed
    for component in ("extender", "webhook"):
        c = container(render(values).get("Deployment", f"{PREFIX}-{component}"), component)
        assert MEMORY_ENV not in c.get("env", [])


def test_a_body_limit_the_memory_cannot_hold_is_refused_at_start() -> None:
    c = container(render({"extender": {"maxBodyBytes": 64 << 20}}).get("Deployment", f"{PREFIX}-extender"),
                  "extender")
    memory = _bytes(c["resources"]["limits"]["memory"])
    with pytest.raises(InputError, match=r"--max-body-bytes 67108864 with --memory-limit-bytes 536870912: .*"
                                         r"lower the body limit to at most \d+ bytes"):
        extender_command._limits(_parse(extender_command, c["args"], memory))
