"""Tests of the simulation pieces (API server, kubelet emulator)."""
