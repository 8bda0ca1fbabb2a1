"""The DRA front end: ResourceSlices, the kubelet DRA plugin, CDI specs; over the same node core as the device
plugins (NodeState ledger + checkpoint, vDevice servers, health). See docs/dra.md."""
