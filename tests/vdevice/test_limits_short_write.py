"""The limits file the shim reads is written whole or not at all: a real short write (a file-size limit, as on a
nearly full disk) refuses the new limits and leaves the previous file and no temp file (gpumgr.files.write.write_new,
which the checkpoint and the CDI specs use too)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpumgr.vdevice.layout import VDeviceLayout
from gpumgr.vdevice.limits import DeviceLimit, Limits

UID = "aaaaaaaa-0000-4000-8000-000000000001"
KEY = "a0123456789abcdef01234567"

_SHORT_WRITE = """
import resource, signal, sys
from gpumgr.vdevice.layout import VDeviceLayout
from gpumgr.vdevice.limits import DeviceLimit, Limits

root, key, uid, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
many = tuple(DeviceLimit(uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000", index=i, memory_limit_bytes=1 << 30)
             for i in range(16))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit: a short write, then EFBIG (not a kill)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    VDeviceLayout(root).write_limits(key, Limits(pod_uid=uid, container_name="main", core_limit=30, hard_limit=True,
                                                 core_ceiling=0, devices=many))
except OSError as e:
    print("refused", e.errno)
else:
    print("written")
"""


def test_a_short_write_keeps_the_previous_limits_and_leaves_no_temp_file(tmp_path: Path) -> None:
    layout = VDeviceLayout(tmp_path)
    path = layout.write_limits(KEY, Limits(pod_uid=UID, container_name="main", core_limit=30, hard_limit=True,
                                           core_ceiling=0, devices=(DeviceLimit(uuid="GPU-0", index=0,
                                                                                memory_limit_bytes=1 << 30),)))
    before = path.read_bytes()
    limit = 512
    assert len(before) < limit
    done = subprocess.run([sys.executable, "-c", _SHORT_WRITE, str(tmp_path), KEY, UID, str(limit)],
                          capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "refused", done.stdout
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir() if p.name.startswith(".")) == []
