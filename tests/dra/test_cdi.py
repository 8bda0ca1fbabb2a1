"""CDI specs the driver writes: valid against the official CDI JSON schema, at the lowest version that covers
the fields used, written atomically, one per claim."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from gpumgr.dra import cdi
from tests.dra.harness import NS, DraNode, share_request, whole_request

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "cdi-schema"


def validator() -> jsonschema.Draft7Validator:
    schema = json.loads((SCHEMA_DIR / "schema.json").read_text())
    defs = json.loads((SCHEMA_DIR / "defs.json").read_text())
    registry = Registry().with_resource("defs.json", Resource.from_contents(defs, default_specification=DRAFT7))
    return jsonschema.Draft7Validator(schema, registry=registry)


def test_the_schema_rejects_a_broken_spec():
    spec = cdi.build_spec(claim_uid="u1", gpus=[(0, 0, "GPU-0")], ctl_devices=["/dev/nvidiactl"], driver_dir="/d",
                          shim_dir="/s", vdevice_dir=Path("/v"), limited=True, shim_log_level=2, annotations={})
    validator().validate(spec)
    spec["devices"][0]["containerEdits"]["deviceNodes"][0]["permissions"] = 7
    with pytest.raises(jsonschema.ValidationError):
        validator().validate(spec)


def test_lowest_version_covering_the_fields():
    base: dict[str, Any] = dict(claim_uid="u1", gpus=[(0, 0, "GPU-0")], ctl_devices=[], driver_dir="/d",
                                shim_dir="/s", vdevice_dir=Path("/v"), limited=False, shim_log_level=2)
    assert cdi.build_spec(**base, annotations={})["cdiVersion"] == "0.5.0"  # deviceNodes[].hostPath
    assert cdi.build_spec(**base, annotations={"a": "b"})["cdiVersion"] == "0.6.0"
    assert cdi.minimum_version({"kind": "a.b/c", "devices": [{"name": "x", "containerEdits": {
        "deviceNodes": [{"path": "/dev/x"}]}}]}) == "0.3.0"


async def test_prepared_specs_validate_and_are_removed_at_unprepare(node: DraNode):
    node.create_claim("share", [share_request()])
    node.create_claim("pair", [whole_request(count=2)])
    await node.run_pod("a", {"s": {"resourceClaimName": "share"}})
    await node.run_pod("b", {"w": {"resourceClaimName": "pair"}})
    files = sorted(node.cfg.cdi_dir.glob("*.json"))
    assert len(files) == 2
    v = validator()
    for f in files:
        doc = json.loads(f.read_text())
        v.validate(doc)
        assert doc["kind"] == "gpumgr.io/vgpu" and doc["cdiVersion"] == "0.5.0"
        uid = f.name.removeprefix("gpumgr.io-vgpu_").removesuffix(".json")
        assert node.claim("share")["metadata"]["uid"] == uid or node.claim("pair")["metadata"]["uid"] == uid
    assert not list(node.cfg.cdi_dir.glob(".*"))  # no temp files left
    await node.delete_pod("a")
    await node.delete_pod("b")
    assert list(node.cfg.cdi_dir.glob("*.json")) == []
    assert node.layout.keys() == []
    assert node.api.store.get_pod(NS, "a") is None


def test_the_runtime_stand_in_refuses_a_spec_with_one_device_name_twice(tmp_path: Path):
    from gpumgr.sim.kubelet.dra_cdi import CdiResolveError, resolve

    spec = cdi.build_spec(claim_uid="u1", gpus=[(0, 0, "GPU-0"), (0, 0, "GPU-0")], ctl_devices=[], driver_dir="/d",
                          shim_dir="/s", vdevice_dir=Path("/v"), limited=False, shim_log_level=2, annotations={})
    (tmp_path / "x.json").write_text(json.dumps(spec))
    with pytest.raises(CdiResolveError, match="duplicate device name"):
        resolve([cdi.qualified(cdi.device_name("u1", 0))], [tmp_path])


_SHORT_WRITE = """
import json, resource, signal, sys
from pathlib import Path
from gpumgr.dra import cdi

root, limit = Path(sys.argv[1]), int(sys.argv[2])
spec = json.loads(sys.stdin.read())
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit: a short write, then EFBIG (not a kill)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    cdi.CdiDir(root).write("u1", spec)
except OSError as e:
    print("refused", e.errno)
else:
    print("written")
"""


def test_a_short_write_leaves_the_previous_spec_in_place_and_no_temp_file(tmp_path: Path):
    """A real short write: a file-size limit (RLIMIT_FSIZE, as a nearly full disk would) lets the first write(2)
    store only part of the spec. In a child process, so the limit touches nothing else."""
    import subprocess
    import sys

    base: dict[str, Any] = dict(claim_uid="u1", ctl_devices=["/dev/nvidiactl"], driver_dir="/d", shim_dir="/s",
                                vdevice_dir=Path("/v"), limited=True, shim_log_level=2, annotations={})
    store = cdi.CdiDir(tmp_path)
    old = store.write("u1", cdi.build_spec(**base, gpus=[(0, 0, "GPU-0")]))
    before = old.read_bytes()
    new = cdi.build_spec(**base, gpus=[(i, i, f"GPU-{i}") for i in range(8)])
    limit = 512
    assert len(json.dumps(new, indent=2)) > 2 * limit
    done = subprocess.run([sys.executable, "-c", _SHORT_WRITE, str(tmp_path), str(limit)], input=json.dumps(new),
                          capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "refused", done.stdout
    assert old.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [old.name]
    # with room again, the same spec is written whole
    store.write("u1", new)
    assert json.loads(old.read_text()) == new
