"""Releasing allocations of the device-plugin front end: one checkpoint write for a set of keys, their vDevice
servers stopped, and containers riding on a freed reservation reserving again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from gpumgr.agent.base import ServiceBase, holder_names
from gpumgr.allocator import Allocation, Ledger, LedgerError
from gpumgr.vdevice.layout import allocation_key

log = logging.getLogger("gpumgr.agent")


class Releasing(ServiceBase):
    async def release(self, keys: list[str], why: str, unverified_only: bool = False,
                      expect: Mapping[str, Allocation] | None = None) -> list[Allocation]:
        """Free allocations (one checkpoint write) and stop their vDevice servers. `unverified_only`: never free a
        verified one (a started container's), and a container riding on a freed reservation reserves again.
        `expect`: the allocations the decision was made on; a key whose holder has changed since is left alone."""
        held = [k for k in keys if self.state.ledger.held_by(k) is not None]
        if not held:
            return []

        def free(ledger: Ledger) -> list[Allocation]:
            out = []
            for k in held:
                a = ledger.held_by(k)
                if a is None or (unverified_only and a.verified) \
                        or (expect is not None and expect.get(k) != a):
                    continue
                ledger.release(k)
                out.append(a)
            if unverified_only:
                _reserve_again(ledger, {a.key for a in out})
            return out

        freed: list[Allocation] = await self.state.commit(free)
        for a in freed:
            await self.vdevices.stop(a.key)
            log.info("released cards %s of %s/%s container %s (key %s): %s", list(a.cards), *holder_names(a), a.key,
                     why)
        return freed

    async def release_ids(self, device_ids: list[str]) -> None:
        await self.release([allocation_key(device_ids)], "rolled back with the rest of its Allocate call")


def _reserve_again(ledger: Ledger, freed: set[str]) -> None:
    """Containers that rode on a freed reservation reserve their own memory again (it fits: the freed one
    reserved at least as much on the same cards)."""
    for r in list(ledger.allocations.values()):
        if not r.reserve and r.rides_on in freed:
            ledger.release(r.key)
            alone = replace(r, reserve=True, rides_on=None)
            try:
                ledger.assign(alone, check_health=False)
            except LedgerError:
                ledger.assign(r, check_health=False)
