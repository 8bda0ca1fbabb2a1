"""Kubernetes access for the node agent: a small async face over the `kubernetes` client, and a pod cache."""
