"""The shim's host side: what the in-container vCUDA shim meets on the node.

- vdriver.py: the shim and the NVIDIA driver libraries staged on the host for GPU containers to mount.
- layout.py: the per-allocation vDevice directories (and the keys they are named by).
- server.py: the gRPC service in each directory that hands the container's limits to the shim.
- limits.py: the limits file written beside it; peers.py: which host process is calling (found through /proc).
"""
