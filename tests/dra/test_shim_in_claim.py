"""The real shim (libvcuda, in front of the fake CUDA driver) in a DRA container: it sees exactly the claim's
memory, through the vDevice server and limits file that NodePrepareResources made and the CDI spec mounted."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from tests.dra.harness import GIB, DraNode, share_request

BUILD = Path(__file__).resolve().parents[2] / "vcuda" / "build"
pytestmark = pytest.mark.skipif(not (BUILD / "libvcuda.so").is_file() or not (BUILD / "vcmem").is_file(),
                                reason="the shim is not built (make shim)")


def fields(line: str) -> dict[str, int]:
    return {k: int(v) for k, v in (t.split("=", 1) for t in line.split() if "=" in t)}


async def test_shim_sees_the_claims_memory(node: DraNode):
    node.create_claim("c", [share_request(memory="3Gi", cores=25)])
    running = await node.run_pod("p", {"gpu": {"resourceClaimName": "c"}})
    edits = running.containers["main"]
    vdir = edits.mount_source("/etc/vcuda")
    assert vdir is not None
    uuid = edits.env["NVIDIA_VISIBLE_DEVICES"]
    state = node.root / "fakegpu.state"
    subprocess.run([str(BUILD / "fakegpu"), "init", str(state), f"{uuid}:{16 * GIB}:80", "50", "0", "13000"],
                   check=True, timeout=10)
    shm = node.root / "shm"
    shm.mkdir()
    # the container's environment from the CDI spec, with container paths mapped to the host's
    env = {k: v for k, v in edits.env.items() if k.startswith("VCUDA_") or k == "NVIDIA_VISIBLE_DEVICES"}
    env.update({
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "VCUDA_LIMITS": edits.env["VCUDA_LIMITS"].replace("/etc/vcuda", vdir),
        "VCUDA_SOCKET": edits.env["VCUDA_SOCKET"].replace("/etc/vcuda", vdir),
        "VCUDA_SHARED_DIR": str(shm),
        "LD_PRELOAD": str(BUILD / "libvcuda.so"),
        "LD_LIBRARY_PATH": str(BUILD / "fake"),
        "FAKEGPU_STATE": str(state),
        "FAKEGPU_BLOCK_NS": "10000",
        "VCTEST_SHIM": str(BUILD / "libvcuda.so"),
        "VCTEST_FAKE": str(BUILD / "fake" / "libcuda.so.1"),
    })
    # the vDevice server runs on this event loop: the program must not block it
    proc = await asyncio.create_subprocess_exec(str(BUILD / "vcmem"), "info", env=env, cwd=node.root,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    info = fields(next(line for line in out.decode().splitlines() if line.startswith("INFO")))
    assert info["cuda_total"] == info["nvml_total"] == 3 * GIB, info
    assert info["cuda_free"] == 3 * GIB, info
    assert node.vdevices is not None and node.vdevices.registrations >= 1  # it asked the claim server
