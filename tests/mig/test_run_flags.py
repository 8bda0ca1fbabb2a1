"""`gpumgr run`'s MIG flags: a bad layout name, layouts file, resource prefix or strategy is one clear line and exit 2,
before anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpumgr.cli", "run", "--node-name", "n1", *args],
                          capture_output=True, text=True, timeout=60)


def test_bad_mig_flags_are_refused_before_anything_starts(tmp_path: Path):
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    bad_layout = tmp_path / "layout.json"
    bad_layout.write_text('{"halves": {"first": ["3g.40gb"]}}')
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)  # under the size limit; json.loads alone overflows the recursion limit
    for args, words in [
        (("--mig-layout", "half"), "unknown MIG layout 'half'; known: all-<profile>, all-balanced, all-disabled"),
        (("--mig-layout", "a b"), "MIG layout name 'a b'"),
        (("--mig-layouts-file", str(bad_json)), f"--mig-layouts-file {bad_json}:1: not valid YAML/JSON"),
        (("--mig-layouts-file", str(bad_layout)), "MIG layout halves: 'first' is neither \"all\" nor a card index"),
        (("--mig-layouts-file", str(tmp_path / "none.json")), "cannot read"),
        (("--mig-layouts-file", str(deep)), f"--mig-layouts-file {deep}:1: nested more than 64 levels deep"),
        (("--mig-shared", "1g.10gb=1"), "--mig-shared: '1g.10gb=1' is not <profile>=<replicas 2..64>"),
        (("--mig-shared", "1g.10gb=2,1g.10gb=3"), "--mig-shared: profile 1g.10gb given twice"),
        (("--mig-shared", ",".join(f"1g.{i}gb=2" for i in range(1, 66))), "--mig-shared: at most 64 profiles, got 65"),
        (("--mig-resource-prefix", "NVIDIA.com/mig-"), "--mig-resource-prefix must be a resource name prefix"),
        (("--mig-strategy", "single"), "--mig-strategy must be mixed"),
    ]:
        p = run(*args)
        assert p.returncode == 2, (args, p.stderr)
        assert words in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
