"""What a pod or a claim asks, read from API JSON: pure, shared by the node and the cluster side.

- podspec.py: resource names, annotation keys and the readers of pod JSON (what each container asks).
- choices.py: a pod's card choices (policy, UUID select/exclude) and the node's cordoned cards.
- quantity.py: Kubernetes resource quantities (`4Gi`, `500m`), parsed exactly.
- claim_results.py: what a ResourceClaim's allocation gives one DRA driver (the rule both the node and the
  extender count claims by).
"""
