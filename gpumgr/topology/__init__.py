"""Topology: how the node's GPUs are linked and what that costs.

- levels.py: the link levels of `nvidia-smi topo -m` (NV#, PIX, PXB, PHB, NODE, SYS) and their order.
- cost.py: the cost matrix and cost tree of a node's GPUs (`Topology`), which the allocator's evaluators read.
- render.py: text renderings for people (the tree with free capacity, the level matrix, the card table).
"""
