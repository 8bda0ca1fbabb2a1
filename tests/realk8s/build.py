"""Build the pinned Kubernetes release (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet) and the
fake CRI runtime once, into a cache outside the checkout: ~/.cache/gpumgr/k8s-<version>/bin (or
$GPUMGR_K8S_CACHE/k8s-<version>/bin). A second run costs a hash of a few files.

The version lives in one place: the `k8s.io/kubernetes` line of tests/realk8s/kube/go.mod.

    python -m tests.realk8s.build        # build (or reuse) and print the bin directory
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

KUBE_MODULE_DIR = Path(__file__).resolve().parent / "kube"
KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")
FAKECRI = "fakecri"
BUILD_TIMEOUT_S = 3600  # a cold build on 2 busy cores takes ~15 min


def kube_version() -> str:
    """The pinned release, read from go.mod (`k8s.io/kubernetes vX.Y.Z`)."""
    text = (KUBE_MODULE_DIR / "go.mod").read_text()
    found = re.search(r"^\s*k8s\.io/kubernetes\s+(v\d+\.\d+\.\d+)\s*$", text, re.MULTILINE)
    if not found:
        raise BuildError(f"{KUBE_MODULE_DIR / 'go.mod'}: no `k8s.io/kubernetes vX.Y.Z` requirement")
    return found.group(1)


def cache_dir() -> Path:
    root = os.environ.get("GPUMGR_K8S_CACHE") or str(Path.home() / ".cache" / "gpumgr")
    return Path(root) / f"k8s-{kube_version()}"


def go_binary() -> str | None:
    return shutil.which("go")


def ensure_binaries(log=sys.stderr) -> Path:  # type: ignore[no-untyped-def]
    """The bin directory with all five programs, building what is missing or stale."""
    go = go_binary()
    if go is None:
        raise BuildError("Go is not installed (the real-Kubernetes tier builds Kubernetes with Go 1.26)")
    bin_dir = cache_dir() / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    go_version = _run([go, "env", "GOVERSION"], env=_go_env()).strip()
    version = kube_version()
    kube_key = _digest(version, go_version, _file_digest(KUBE_MODULE_DIR / "go.sum"))
    cri_key = _digest(kube_key, _file_digest(KUBE_MODULE_DIR / "cmd" / FAKECRI / "main.go"))
    if _stale(bin_dir, KUBE_COMMANDS, "kube", kube_key):
        major, minor = version.lstrip("v").split(".")[:2]
        pkg = "k8s.io/component-base/version"
        ldflags = (f"-s -w -X {pkg}.gitVersion={version} -X {pkg}.gitMajor={major} -X {pkg}.gitMinor={minor} "
                   f"-X {pkg}.gitTreeState=clean")
        print(f"building Kubernetes {version} with {go_version} into {bin_dir} (once; ~15 min cold)", file=log)
        _go_build(go, bin_dir, ldflags, [f"k8s.io/kubernetes/cmd/{c}" for c in KUBE_COMMANDS])
        (bin_dir / ".kube-stamp").write_text(kube_key)
    if _stale(bin_dir, (FAKECRI,), "fakecri", cri_key):
        print(f"building {FAKECRI} into {bin_dir}", file=log)
        _go_build(go, bin_dir, "-s -w", [f"./cmd/{FAKECRI}"])
        (bin_dir / ".fakecri-stamp").write_text(cri_key)
    return bin_dir


def _stale(bin_dir: Path, names: tuple[str, ...], stamp: str, key: str) -> bool:
    stamp_file = bin_dir / f".{stamp}-stamp"
    present = all((bin_dir / n).is_file() for n in names)
    return not (present and stamp_file.is_file() and stamp_file.read_text() == key)


def _go_build(go: str, bin_dir: Path, ldflags: str, packages: list[str]) -> None:
    cmd = ["nice", "-n", "10", go, "build", "-trimpath", f"-ldflags={ldflags}", "-o", str(bin_dir) + "/", *packages]
    try:
        done = subprocess.run(cmd, cwd=KUBE_MODULE_DIR, env=_go_env(), capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise BuildError(f"`{' '.join(cmd)}` did not finish in {BUILD_TIMEOUT_S} s") from None
    if done.returncode != 0:
        raise BuildError(f"`{' '.join(cmd)}` failed:\n{done.stderr[-4000:]}")


def _go_env() -> dict[str, str]:
    # Kubernetes 1.36 declares go 1.26: a newer toolchain (jsonv2 on by default in 1.27) breaks /openapi/v2.
    return {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}


def _run(cmd: list[str], env: dict[str, str]) -> str:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=60).stdout


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


class BuildError(RuntimeError):
    """Kubernetes or the fake runtime could not be built."""


if __name__ == "__main__":
    try:
        print(ensure_binaries())
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
