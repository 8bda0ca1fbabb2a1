"""Per-container vDevice directories and the gRPC service that hands limits to the in-container shim."""
