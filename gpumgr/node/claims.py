"""DRA claims in the ledger. The DRA front end holds them under `dra/<claim uid>/<n>` (one key per granted device)
and gives every container of a claim one vDevice directory; the device-plugin front end counts them as used and
never frees, adopts or repairs them."""

from __future__ import annotations

from gpumgr.allocator import Allocation, Ledger
from gpumgr.allocator.ledger import CLAIM_PREFIX
from gpumgr.vdevice.layout import allocation_key

# ledger allocation keys of claims: dra/<claim uid>/<result index>. `Allocation` refuses a claim holder under any
# other key and any other holder under this prefix, so the key and the holder type say the same thing
LEDGER_PREFIX = CLAIM_PREFIX


def is_claim(a: Allocation) -> bool:
    return a.is_claim


def claim_keys(ledger: Ledger, uid: str) -> list[str]:
    prefix = f"{LEDGER_PREFIX}{uid}/"
    return sorted(k for k in ledger.allocations if k.startswith(prefix))


def claim_uids(ledger: Ledger) -> set[str]:
    return {k[len(LEDGER_PREFIX):].split("/", 1)[0] for k in ledger.allocations if k.startswith(LEDGER_PREFIX)}


def vdevice_key(uid: str) -> str:
    """The vDevice directory key of a claim, shared by every container that uses it."""
    return allocation_key([f"{LEDGER_PREFIX}{uid}"])


def claim_vdevice_keys(ledger: Ledger) -> set[str]:
    return {vdevice_key(uid) for uid in claim_uids(ledger)}
