"""The node core: what both front ends drive, the device plugins (gpumgr/agent/) and the DRA driver (gpumgr/dra/).

- state.py: the one live ledger, changed only through `NodeState.commit` (checkpointed before it is live), per-card
  health, and loading the checkpoint at start.
- claims.py: DRA claims in the ledger (their keys and vDevice directory), which the device-plugin side counts as
  used and never frees, adopts or repairs.
- limits.py: the limits of an allocation and the PCI bus IDs of its cards.
- owner.py: the allocation of a container named as the holder (one builder for every path that names one).
- vdevices.py: a vDevice server for an allocation, and the sweep of servers and directories nothing holds.

Neither front end imports the other: whatever both need is here.
"""
