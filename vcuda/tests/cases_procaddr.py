"""Injection both ways and symbol resolution: LD_PRELOAD (with the dlsym
path the CUDA runtime uses), installed as libcuda.so.1, cuGetProcAddress as the
CUDA 11.3, 12.x and 13 runtimes call it, and the export table."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from harness import UUID_A, Container, Fixture, GiB, Node, fields
from registry import case

SRC = Path(__file__).resolve().parent.parent / "src"


@case("injection: LD_PRELOAD; cuGetProcAddress(_v2) as CUDA 11.3, 12.x and 13 runtimes ask")
def preload_procaddr(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    c = fx.container()
    c.write_limits([(UUID_A, 8 * GiB)])
    r = c.run("vcproc", env=c.env(node)).ok()
    assert r.out.count("PASS") == 7, r.out


def dropin_env(fx: Fixture, c: Container, node: Node, explicit: bool) -> dict[str, str]:
    """The shim installed as libcuda.so.1 and libnvidia-ml.so.1 in a directory of its own."""
    d = fx.path("dropin")
    d.mkdir(exist_ok=True)
    for name in ("libcuda.so.1", "libnvidia-ml.so.1"):
        link = d / name
        if not link.exists():
            link.symlink_to(fx.build / "libvcuda-driver.so")
    fake = fx.build / "fake"
    env = c.env(node, preload=False, VCTEST_SHIM=str(fx.build / "libvcuda-driver.so"), VCTEST_DROPIN="1")
    if explicit:
        env["LD_LIBRARY_PATH"] = str(d)
        env["VCUDA_REAL_CUDA"] = str(fake / "libcuda.so.1")
        env["VCUDA_REAL_NVML"] = str(fake / "libnvidia-ml.so.1")
    else:
        env["LD_LIBRARY_PATH"] = f"{d}:{fake}"  # the default search must skip the shim itself
    return env


@case("injection: installed as libcuda.so.1 with VCUDA_REAL_CUDA; unhooked calls pass through")
def dropin_explicit(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    c = fx.container()
    c.write_limits([(UUID_A, 8 * GiB)])
    env = dropin_env(fx, c, node, explicit=True)
    r = c.run("vcproc", env=env).ok()
    assert r.out.count("PASS") == 7, r.out
    c.write_limits([(UUID_A, 1 * GiB)])
    r = c.run("vcmem", "paths", env=env).ok()
    assert r.out.count("PASS") == 9, r.out
    i = fields(c.run("vcmem", "info", env=env).ok().line("INFO"))
    assert i["cuda_total"] == i["nvml_total"] == i["nvml2_total"] == 1 * GiB, i


@case("injection: installed as libcuda.so.1, the default search finds the driver and never itself")
def dropin_search(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    c = fx.container()
    c.write_limits([(UUID_A, 1 * GiB)])
    env = dropin_env(fx, c, node, explicit=False)
    r = c.run("vcmem", "paths", env=env).ok()
    assert r.out.count("PASS") == 9, r.out
    bad = dict(env, VCUDA_REAL_CUDA=str(fx.path("dropin") / "libcuda.so.1"), VCUDA_LOG_LEVEL="1")
    r = c.run("vcmem", "init", env=bad)
    assert "cuInit=3" in r.out and "it is this shim" in r.err, r.out + r.err


@case("injection: libvcuda's dlsym keeps dlsym(RTLD_NEXT, ...) relative to its real caller")
def rtld_next(fx: Fixture) -> None:
    c = fx.container()
    env = c.env(None, preload=False)
    env["LD_PRELOAD"] = f"{fx.build / 'libvcuda.so'} {fx.build / 'libnext_probe.so'}"
    r = c.run("vcnext", env=env)
    assert r.rc == 0, r.out + r.err


def _exports(lib: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True)
    return {ln.split()[-1] for ln in out.stdout.splitlines() if ln.strip()}


@case("build: libvcuda.so exports exactly the hooks (and dlsym); the drop-in adds only pass-throughs")
def export_table(fx: Fixture) -> None:
    hooks_h = (SRC / "vc_hooks.h").read_text()
    hooks = set(re.findall(r"X\((cu\w+|nvml\w+), ", hooks_h))
    assert len(hooks) > 40, hooks
    got = _exports(fx.build / "libvcuda.so")
    assert got == hooks | {"dlsym"}, f"extra: {got - hooks - {'dlsym'}}, missing: {hooks - got}"
    surface = set()
    for inc in ("vc_surface_cuda.inc", "vc_surface_nvml.inc"):
        surface |= set(re.findall(r"VC_SURFACE\((\w+)\)", (SRC / inc).read_text()))
    assert not surface & hooks, f"hooked names in the pass-through lists: {surface & hooks}"
    drv = _exports(fx.build / "libvcuda-driver.so")
    assert drv == hooks | surface, f"extra: {drv - hooks - surface}, missing: {(hooks | surface) - drv}"
    deps = subprocess.run(["readelf", "-d", str(fx.build / "libvcuda.so")], capture_output=True, text=True, check=True)
    needed = set(re.findall(r"\(NEEDED\).*\[(.+)\]", deps.stdout))
    assert needed <= {"libc.so.6", "libdl.so.2", "libpthread.so.0"}, needed


@case("injection: under LD_PRELOAD the shim drives the libcuda the process loaded, whatever VCUDA_REAL_CUDA says")
def preload_explicit(fx: Fixture) -> None:
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    c = fx.container()
    c.write_limits([(UUID_A, 1 * GiB)])
    fake = fx.build / "fake"
    same = c.env(node, VCUDA_REAL_CUDA=str(fake / "libcuda.so.1"), VCUDA_REAL_NVML=str(fake / "libnvidia-ml.so.1"))
    r = c.run("vcmem", "paths", env=same).ok()
    assert r.err == "", r.err
    copy = fx.path("copy")
    copy.mkdir()
    shutil.copy(fake / "libcuda.so.1", copy / "libcuda.so.1")  # another driver file, e.g. a compat library
    other = c.env(node, VCUDA_REAL_CUDA=str(copy / "libcuda.so.1"))
    r = c.run("vcmem", "paths", env=other).ok()
    assert "is not the libcuda.so.1 this process loads" in r.err, r.err


@case("injection: dlmopen(LM_ID_NEWLM) of libcuda.so.1 bypasses the LD_PRELOAD build; the drop-in build holds "
      "(but not against the real driver opened by path)")
def dlmopen_namespace(fx: Fixture) -> None:
    # A new link-map namespace gets no preloaded library: documented in docs/shim.md as what the LD_PRELOAD
    # build cannot stop. Installed as libcuda.so.1, the shim is what the new namespace loads by that name.
    node = fx.node([(UUID_A, 16 * GiB, 80)])
    c = fx.container()
    c.write_limits([(UUID_A, 1 * GiB)])
    pre = c.run("vcdlmopen", env=c.env(node))
    assert pre.rc == 0 and pre.line("ALLOC") == "ALLOC 0", f"LD_PRELOAD: {pre.out}{pre.err}"
    env = dropin_env(fx, c, node, explicit=True)
    drop = c.run("vcdlmopen", env=env)
    assert drop.rc == 0 and drop.line("ALLOC") == "ALLOC 2", f"drop-in: {drop.out}{drop.err}"
    # Neither build is a security boundary: the real driver opened by its path is not the shim (the drop-in build
    # must be able to open that file too). docs/shim.md says so.
    direct = c.run("vcdlmopen", env["VCUDA_REAL_CUDA"], env=env)
    assert direct.rc == 0 and direct.line("ALLOC") == "ALLOC 0", f"drop-in, real path: {direct.out}{direct.err}"
