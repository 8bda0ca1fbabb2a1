"""Issue 18, not yet attacked: upgrading the agent while pods run. The agent installs the vCUDA shim into the host
directory every GPU container mounts (and LD_PRELOADs); a DaemonSet rollout installs a new version while processes
in containers have the old one mapped. Those processes must not crash, new ones get the new version, and the old
file goes only when nothing maps it (a new file renamed over the name: the old inode lives until its last user).

A shared library stands in for the shim: two builds of the same source (version 1 and 2, 256 KiB of code each);
a running process keeps version 1 mapped and calls into it again after the upgrade. The control test shows the
harm the design avoids: the same file rewritten in place changes the code under the running process."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpumgr.vdevice import vdriver

C_SOURCE = """
#define STR(x) #x
#define XSTR(x) STR(x)
int version(void) { return VERSION; }
/* code and data that fill pages, so the process really runs from the mapping */
static const unsigned char filler[FILL] = { VERSION };
unsigned long checksum(void) {
    unsigned long s = 0;
    for (unsigned long i = 0; i < sizeof filler; i++) s = s * 31 + filler[i] + i;
    return s + VERSION;
}
"""

USER = textwrap.dedent("""
    import ctypes, sys
    lib = ctypes.CDLL(sys.argv[1])
    lib.checksum.restype = ctypes.c_ulong
    print(lib.version(), lib.checksum(), flush=True)
    sys.stdin.readline()          # the upgrade happens here
    print(lib.version(), lib.checksum(), flush=True)
""")


def _build(tmp: Path, version: int, fill: int) -> Path:
    src = tmp / f"v{version}.c"
    src.write_text(C_SOURCE)
    out = tmp / f"libv{version}.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O0", f"-DVERSION={version}", f"-DFILL={fill}", "-o", str(out),
                    str(src)], check=True, capture_output=True)
    return out


@pytest.fixture
def builds(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    return _build(tmp_path, 1, 256 << 10), _build(tmp_path, 2, 64 << 10)  # the new one shorter: in place = SIGBUS


def _running(lib: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", USER, str(lib)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.first = proc.stdout.readline().split()  # type: ignore[attr-defined]
    return proc


def _after_upgrade(proc: subprocess.Popen[str]) -> tuple[list[str], int]:
    out, _ = proc.communicate("go\n", timeout=60)
    return out.split(), proc.returncode


def test_a_running_process_keeps_the_old_shim_and_new_ones_get_the_new(tmp_path: Path,
                                                                        builds: tuple[Path, Path]) -> None:
    v1, v2 = builds
    shim_dir = tmp_path / "vdriver"
    installed = vdriver.install_shim(v1, shim_dir)
    assert installed is not None
    old = _running(installed)
    assert old.first[0] == "1"  # type: ignore[attr-defined]
    stale = installed.with_name(f"{vdriver.TMP_PREFIX}4242.tmp")
    stale.write_bytes(b"half a copy")  # an agent killed mid-install left this

    assert vdriver.install_shim(v2, shim_dir) == installed  # the rollout's new agent
    maps = Path(f"/proc/{old.pid}/maps").read_text()
    assert f"{installed} (deleted)" in maps  # the old inode, unnamed, still mapped by the running process
    new = _running(installed)
    assert new.first[0] == "2"  # type: ignore[attr-defined]
    after, code = _after_upgrade(old)
    assert code == 0 and after == old.first, (code, after)  # type: ignore[attr-defined]  # unharmed: same code
    _after_upgrade(new)
    assert sorted(p.name for p in installed.parent.iterdir()) == [vdriver.SHIM_NAME]  # no temp copies left
    assert installed.read_bytes() == v2.read_bytes()


def test_control_a_shim_rewritten_in_place_breaks_the_running_process(tmp_path: Path,
                                                                      builds: tuple[Path, Path]) -> None:
    """What install_shim must never do (and what HAMi users report): the file rewritten under the mapping."""
    v1, v2 = builds
    lib = tmp_path / "libvcuda.so"
    shutil.copyfile(v1, lib)
    old = _running(lib)
    with open(lib, "r+b") as f:  # in place: same inode, truncated and rewritten
        f.truncate(0)
        f.write(v2.read_bytes())
    after, code = _after_upgrade(old)
    assert code != 0 or after != old.first  # type: ignore[attr-defined]  # crashed (SIGBUS) or ran other code
