"""MIG: hardware partitions of MIG-capable cards (A100, A30, H100, H200).

`profiles` (the GPU-instance profiles per card family), `types` (profiles, instances, cards as the node sees
them), `book` (the instances the ledger holds, and creations in flight), `reconcile` (the ledger against what
NVML says exists after a restart), `manager` (create and destroy through the ledger and the checkpoint).
Facts: docs/mig.md.
"""
