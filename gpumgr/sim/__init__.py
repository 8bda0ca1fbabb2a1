"""Simulation of the pieces a GPU node needs (kubelet, API server, GPUs) so gpumgr runs and tests anywhere."""
