"""Node labels from the node's GPUs (model, count, memory, driver and CUDA versions), and the minimal patch that
brings a node's labels to what they should be.

Pure functions: the caller reads the node, and sends the patch (a JSON merge patch of `metadata.labels`) only
when `labels_patch` returns one, so labels are updated when they change and never churned.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Mapping

from gpumgr.devices.types import Inventory
from gpumgr.requests.podspec import ascii_uint

DEFAULT_PREFIX = "gpumgr.io/"
GAIA_MODEL_LABEL = "gaia.tencent.com/gpu-model"  # what gpu-manager set: the 2nd word of card 0's name
MAX_VALUE = 63

_INVALID_RUN = re.compile(r"[^A-Za-z0-9._-]+")
_DASHES = re.compile(r"-{2,}")
_EDGE = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_PREFIX = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")


def label_value(text: str) -> str:
    """`text` as a valid label value: at most 63 of [A-Za-z0-9._-], starting and ending alphanumeric; anything
    else becomes one dash ("NVIDIA A100 80GB PCIe" -> "NVIDIA-A100-80GB-PCIe"). May be "" (nothing usable)."""
    value = _DASHES.sub("-", _INVALID_RUN.sub("-", text))
    value = _EDGE.sub("", value)
    return _EDGE.sub("", value[:MAX_VALUE])


def normalise_prefix(prefix: str) -> str:
    """`"gpumgr.io"` or `"gpumgr.io/"` -> `"gpumgr.io/"`. Raises ValueError unless it is a DNS subdomain."""
    domain = prefix[:-1] if prefix.endswith("/") else prefix
    if len(domain) > 253 or not _PREFIX.fullmatch(domain):
        raise ValueError(f"label prefix {prefix!r} must be a lowercase DNS subdomain such as 'gpumgr.io/'")
    return domain + "/"


def node_labels(inventory: Inventory, prefix: str = DEFAULT_PREFIX) -> dict[str, str]:
    """The labels this node should carry. A node without GPUs gets none (so `<prefix>gpu=true` means GPUs).

    On a node with mixed models, `gpu.model` is the most common model (ties: the one on the lowest card),
    `gpu.models` the number of distinct models, and `gpu.memory` the smallest card's memory in MiB, so that a
    selector on memory never promises more than every card has. Labels whose value is unknown are left out.
    """
    p = normalise_prefix(prefix)
    gpus = inventory.gpus
    if not gpus:
        return {}
    names = [g.name.strip() for g in gpus]
    counts = Counter(names)
    top = max(counts.values())
    model = next(n for n in names if counts[n] == top)  # first in card order among the most common
    out = {
        f"{p}gpu": "true",
        f"{p}gpu.count": str(len(gpus)),
        f"{p}gpu.model": label_value(model),
        f"{p}gpu.models": str(len(counts)),
        f"{p}gpu.memory": str(min(g.memory_mib for g in gpus)),
        GAIA_MODEL_LABEL: label_value(_second_word(names[0])),
    }
    out.update(_version_labels(f"{p}driver-version", inventory.driver_version))
    out.update(_version_labels(f"{p}cuda.driver-version", inventory.cuda_driver_version))
    return {k: v for k, v in out.items() if v}


def labels_patch(
    current: Mapping[str, str] | None,
    wanted: Mapping[str, str],
    prefix: str = DEFAULT_PREFIX,
    also_owned: Collection[str] = (GAIA_MODEL_LABEL,),
) -> dict[str, str | None] | None:
    """The smallest merge patch of `metadata.labels` that turns `current` into `wanted`, or None when nothing
    changes. Labels under `prefix` (and those in `also_owned`) are ours: one we no longer want is removed (None).
    Every other label is left alone."""
    p = normalise_prefix(prefix)
    current = current or {}
    patch: dict[str, str | None] = {k: v for k, v in wanted.items() if current.get(k) != v}
    owned = set(also_owned)
    for key in current:
        if key not in wanted and (key.startswith(p) or key in owned):
            patch[key] = None
    return patch or None


def _second_word(name: str) -> str:
    words = name.split()
    return words[1] if len(words) > 1 else name


def _version_labels(key: str, version: str) -> dict[str, str]:
    """`key` = the full version; `key.major` / `key.minor` when it starts with numbers ("550.54.15", "12.4")."""
    full = label_value(version.strip())
    if not full:
        return {}
    out = {key: full}
    parts = full.split(".")
    if ascii_uint(parts[0], 9) is not None:
        out[f"{key}.major"] = parts[0]
        if len(parts) > 1 and ascii_uint(parts[1], 9) is not None:
            out[f"{key}.minor"] = parts[1]
    return out
