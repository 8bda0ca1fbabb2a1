"""Kubernetes access for the node agent: a small asyncio REST client (no `kubernetes` import), and a pod cache."""
