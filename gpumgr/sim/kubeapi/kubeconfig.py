"""A kubeconfig file that points the real `kubernetes` client (or kubectl) at the test API server."""

from __future__ import annotations

from pathlib import Path

import yaml


def write_kubeconfig(path: str | Path, server_url: str, *, context: str = "gpumgr-sim",
                     namespace: str = "default") -> Path:
    """Write a kubeconfig for `server_url` (plain HTTP, no credentials) and return its path.

    Load it with `kubernetes.config.load_kube_config(config_file=path)` or
    `kubernetes.config.new_client_from_config(config_file=path)`.
    """
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": {"server": server_url}}],
        "users": [{"name": context, "user": {}}],
        "contexts": [{"name": context,
                      "context": {"cluster": context, "user": context, "namespace": namespace}}],
        "current-context": context,
        "preferences": {},
    }
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    tmp.replace(target)
    return target
