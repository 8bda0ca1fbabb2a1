"""`gpumgr run --mode/--dra-*/--cdi-dir`: checked before anything starts, and carried to the DRA front end."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from gpumgr.commands import run as run_cmd
from gpumgr.dra.config import DraConfig, from_agent_config, mode_of


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpumgr.cli", "run", "--node-name", "n1", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("args", "words"), [
    (("--mode", "dra-only"), "--mode must be one of device-plugin, dra, both"),
    (("--dra-driver-name", "Bad_Driver"), "--dra-driver-name must be a DNS subdomain"),
    (("--dra-plugin-dir", "/" + "x" * 120), "longer than a unix socket allows"),
])
def test_bad_dra_flags_exit_2_with_one_line(args, words):
    p = run(*args)
    assert p.returncode == 2, p.stderr
    assert words in p.stderr and "Traceback" not in p.stderr


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    run_cmd.register(parser.add_subparsers())
    return parser.parse_args(["run", "--node-name", "n1", *argv])


def test_flags_reach_the_dra_config(monkeypatch):
    monkeypatch.setenv("GPUMGR_CDI_DIR", "/run/cdi-from-env")
    cfg = run_cmd.config_from(parse("--mode", "both", "--plugins-registry-dir", "/r"))
    assert mode_of(cfg) == "both"
    dra = from_agent_config(cfg)
    assert dra == DraConfig(node_name="n1", cdi_dir=Path("/run/cdi-from-env"),
                            plugin_dir=Path("/var/lib/kubelet/plugins/vgpu.gpumgr.io"), registry_dir=Path("/r"),
                            driver_dir=str(Path(cfg.shim_dir) / "driver"), shim_dir=cfg.shim_dir)
    assert dra.socket == Path("/var/lib/kubelet/plugins/vgpu.gpumgr.io/dra.sock")
    assert dra.registration_socket == Path("/r/vgpu.gpumgr.io-reg.sock")
    assert mode_of(run_cmd.config_from(parse())) == "device-plugin"
