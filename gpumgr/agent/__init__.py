"""The node agent: node state, the allocation service behind the plugins, recovery, and the daemon."""
