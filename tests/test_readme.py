"""What README.md says the commands print is what they print (each claim checked by running the command)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _readme() -> str:
    return " ".join(README.read_text().split())


def _gpumgr(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpumgr.cli", *args], capture_output=True, text=True, timeout=300)


def test_every_command_in_using_it_exists():
    block = README.read_text().split("## Using it", 1)[1].split("```")[1]
    used = {ln.split()[1] for ln in block.splitlines() if ln.startswith("gpumgr ")}
    p = _gpumgr("--help")
    assert p.returncode == 0
    listed = set(re.findall(r"^    ([a-z]+)\b", p.stdout, flags=re.M))
    assert used and used <= listed, used - listed


def test_the_demo_prints_what_the_readme_says():
    text = _readme()
    assert "it prints the topology tree with free capacity twice, at the start and after the GPU recovers" in text
    assert "card table (mode, health, cores used, memory allocated, holders)" in text
    assert "it ends with an excerpt of `/metric` and its URL" in text
    p = _gpumgr("demo", "--once", "--metrics-port", "0")
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout
    steps = re.split(r"^== ", out, flags=re.M)[1:]
    trees = [i for i, s in enumerate(steps) if re.search(r"^ROOT \(free: ", s, flags=re.M)]
    assert len(trees) == 2 and trees[0] == 0, trees
    assert "recovers" in steps[trees[1]].splitlines()[0]
    headers = [ln.split("  ") for ln in out.splitlines() if ln.startswith("GPU  MODEL")]
    assert headers and all(
        [c.strip() for c in h if c.strip()] == ["GPU", "MODEL", "MODE", "HEALTH", "CORES USED", "MEMORY ALLOCATED",
                                                "HOLDERS"] for h in headers)
    assert re.search(r"\n  container_request_gpu_utilization\{.*\n(.*\n)*Prometheus metrics: http://\S+/metric", out)
