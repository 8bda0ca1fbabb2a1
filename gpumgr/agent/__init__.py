"""The node agent: the device-plugin front end's service on the node core, recovery, and the agent process.

- service.py: `AllocationService`, composed of one part per concern, each building on the one before (no circle):
  base.py (shared state, the kubelet checkpoint, who asks and who holds) <- release.py <- podwrites.py (pod
  annotations, events, failing a pod) <- settle.py (guesses the kubelet names) <- preferred.py (device lists,
  GetPreferredAllocation), allocate.py (Allocate), prestart.py (PreStartContainer); ports.py: what it talks to.
- guess.py, truth.py, gone.py, kubelet_cache.py: the admission rules, the kubelet's word in the ledger, whether
  a pod is gone, the cached kubelet checkpoint.
- reconcile.py: the ledger brought back to what running pods hold; daemon.py, config.py, errors.py: the process.
"""
