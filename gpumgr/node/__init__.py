"""The node core: what both front ends drive, the device plugins (gpumgr/agent/) and the DRA driver (gpumgr/dra/).

- state.py: the one live ledger, changed only through `NodeState.commit` (checkpointed before it is live), per-card
  health, and loading the checkpoint at start.
- claims.py: DRA claims in the ledger (their keys and vDevice directory), which the device-plugin side counts as
  used and never frees, adopts or repairs.
- limits.py: the limits of an allocation and the PCI bus IDs of its cards.
- owner.py: the allocation of a container named as the holder (one builder for every path that names one).
- vdevices.py: a vDevice server for an allocation, and the sweep of servers and directories nothing holds.
- checkpoint.py: the ledger on disk (versioned, checksummed, written atomically, previous generation kept).
- binding.py: which pod and container an allocation is for (the guess at Allocate, the owner's ask).
- kubelet_checkpoint.py: the kubelet's device-manager checkpoint, read (never written): who the kubelet gave what.
- cgroups.py: the host PIDs of a container, from its cgroup (for per-container usage).
- inventory.py, labels.py: what the node publishes: the inventory annotation the extender reads, the node labels.

Neither front end imports the other: whatever both need is here.
"""
