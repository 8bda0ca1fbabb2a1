"""gpumgr: a fractional vGPU manager for Kubernetes."""

__version__ = "0.1.0"
