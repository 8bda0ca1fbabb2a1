"""Constants of the kubelet device-plugin protocol v1beta1 and the kubelet's resource-name rule."""

from __future__ import annotations

import os
import re
from pathlib import Path

API_VERSION = "v1beta1"
SUPPORTED_VERSIONS = (API_VERSION,)
KUBELET_SOCKET_NAME = "kubelet.sock"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
PRE_START_TIMEOUT_S = 30.0  # KubeletPreStartContainerRPCTimeoutInSecs
DIAL_TIMEOUT_S = 10.0  # the kubelet's blocking dial back to a registering plugin
UNIX_PATH_MAX = 107  # sun_path is 108 bytes including the terminating NUL
ADMISSION_ERROR_REASON = "UnexpectedAdmissionError"

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def is_extended_resource_name(name: str) -> bool:
    """True for a valid extended resource name: domain-prefixed, not in kubernetes.io, not `requests.*`.

    The kubelet checks that `requests.<name>` is a valid qualified name (quota form), so the domain
    must be a DNS subdomain and the part after the slash at most 63 characters.
    """
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    prefix, _, short = f"requests.{name}".partition("/")
    if "/" in short or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix):
        return False
    return len(short) <= 63 and bool(_QUALIFIED_NAME_PART.match(short))


def endpoint_path(plugin_dir: Path, endpoint: str) -> Path:
    """Resolve a RegisterRequest endpoint the way Go's filepath.Join does (cleaned, never absolute)."""
    return Path(os.path.normpath(f"{plugin_dir}/{endpoint}"))
