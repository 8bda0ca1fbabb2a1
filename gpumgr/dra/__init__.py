"""The DRA front end: ResourceSlices, the kubelet DRA plugin, CDI specs; over the same node core as the device
plugins (NodeState ledger + checkpoint, vDevice servers, health). See docs/dra.md. MIG: `mig_slices.py` (partitionable
devices: counter sets and a device per profile and placement), `mig_prepare.py` (the instance made at prepare,
destroyed at unprepare); see docs/mig.md."""
