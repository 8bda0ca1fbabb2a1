"""Host PIDs of containers from cgroup trees laid out as the kubelet and each runtime really lay them out."""

from __future__ import annotations

import itertools
import shutil

import pytest

from gpumgr.node.cgroups import CgroupInputError, CgroupReader, parse_container_id, qos_of, read_pids
from tests.metrics import cgroup_trees as ct

UID = ct.pod_uid(0xABC)
CID = ct.container_id(0x1234)
OTHER_UID = ct.pod_uid(0xDEF)

LAYOUTS = list(itertools.product(ct.VERSIONS, ct.DRIVERS, ct.RUNTIMES, ct.QOS))


@pytest.mark.parametrize(("version", "driver", "runtime", "qos"), LAYOUTS,
                         ids=["-".join(x) for x in LAYOUTS])
def test_every_layout_gives_the_containers_own_pids(tmp_path, version, driver, runtime, qos):
    base = ct.hierarchy(tmp_path, version)
    d = ct.add_container(base, driver, runtime, qos, UID, CID, [4242, 17, 99])
    # another pod, same QoS, on the same node
    ct.add_container(base, driver, runtime, qos, OTHER_UID, ct.container_id(0x9999), [5555])
    reader = CgroupReader(tmp_path)
    ref = f"{ct.SCHEME[runtime]}://{CID}"

    assert reader.container_dir(UID, ref, qos) == d
    assert reader.pids(UID, ref, qos) == [17, 99, 4242]  # sorted; no sandbox (1), no conmon (2), no other pod
    # without the QoS class (pod not known yet) the search still finds it
    assert CgroupReader(tmp_path).pids(UID, ref) == [17, 99, 4242]


@pytest.mark.parametrize("runtime", ct.RUNTIMES)
def test_runtime_named_in_the_id_need_not_match_the_tree(tmp_path, runtime):
    """The tree is searched, not guessed from the container ID's scheme."""
    base = ct.hierarchy(tmp_path, "v2")
    ct.add_container(base, "systemd", runtime, "burstable", UID, CID, [7])
    for scheme in ("containerd", "cri-o", "docker", ""):
        ref = f"{scheme}://{CID}" if scheme else CID
        assert CgroupReader(tmp_path).pids(UID, ref, "burstable") == [7], scheme


def test_nested_cgroups_are_read_recursively_sorted_and_deduplicated(tmp_path):
    base = ct.hierarchy(tmp_path, "v2")
    d = ct.add_container(base, "systemd", "crio", "burstable", UID, CID, [30, 10])
    ct.write_procs(d / "container", [20, 10, 30])  # crun nests the payload one level down
    ct.write_procs(d / "container" / "sub", [5, 20])
    assert CgroupReader(tmp_path).pids(UID, f"cri-o://{CID}") == [5, 10, 20, 30]
    assert read_pids(d) == [5, 10, 20, 30]


@pytest.mark.parametrize("controller", ["memory", "pids", "cpu,cpuacct"])
def test_v1_any_of_the_known_controllers(tmp_path, controller):
    base = ct.hierarchy(tmp_path, "v1", v1_controller=controller)
    ct.add_container(base, "cgroupfs", "docker", "besteffort", UID, CID, [300, 200])
    assert CgroupReader(tmp_path).pids(UID, f"docker://{CID}") == [200, 300]


def test_v1_container_missing_from_memory_is_found_in_another_controller(tmp_path):
    ct.hierarchy(tmp_path, "v1", "memory")
    (tmp_path / "memory" / "kubepods").mkdir()
    base = ct.hierarchy(tmp_path, "v1", "pids")
    ct.add_container(base, "cgroupfs", "containerd", "burstable", UID, CID, [8])
    assert CgroupReader(tmp_path).pids(UID, f"containerd://{CID}") == [8]


def test_kubelet_with_its_own_cgroup_root_is_found_by_search(tmp_path):
    """kind and kubelets run with --cgroup-root put the pods under e.g. kubelet.slice/kubelet-kubepods.slice."""
    us = UID.replace("-", "_")
    d = (tmp_path / "kubelet.slice" / "kubelet-kubepods.slice" / "kubelet-kubepods-besteffort.slice"
         / f"kubelet-kubepods-besteffort-pod{us}.slice" / f"cri-containerd-{CID}.scope")
    ct.hierarchy(tmp_path, "v2")
    ct.write_procs(d, [61, 60])
    ct.write_procs(tmp_path / "system.slice" / "containerd.service", [1000])
    assert CgroupReader(tmp_path).pids(UID, f"containerd://{CID}") == [60, 61]


def test_unknown_container_gives_no_pids(tmp_path):
    base = ct.hierarchy(tmp_path, "v2")
    ct.add_container(base, "systemd", "containerd", "burstable", UID, CID, [1, 2])
    reader = CgroupReader(tmp_path)
    other = ct.container_id(0x77)
    assert reader.container_dir(UID, f"containerd://{other}") is None
    assert reader.pids(UID, f"containerd://{other}") == []
    assert reader.pids(OTHER_UID, f"containerd://{CID}") == []
    assert CgroupReader(tmp_path / "nowhere").pids(UID, f"containerd://{CID}") == []


def test_a_container_that_went_away_is_not_served_from_memory(tmp_path):
    base = ct.hierarchy(tmp_path, "v2")
    d = ct.add_container(base, "systemd", "containerd", "burstable", UID, CID, [11])
    reader = CgroupReader(tmp_path)
    assert reader.pids(UID, f"containerd://{CID}") == [11]
    shutil.rmtree(d)
    assert reader.pids(UID, f"containerd://{CID}") == []
    # the same container now seen by a kubelet using cgroupfs (e.g. after a node reconfiguration)
    ct.add_container(base, "cgroupfs", "containerd", "burstable", UID, CID, [12])
    assert reader.pids(UID, f"containerd://{CID}") == [12]


def test_crio_monitor_is_never_taken_for_the_container(tmp_path):
    base = ct.hierarchy(tmp_path, "v2")
    d = ct.add_container(base, "systemd", "crio", "burstable", UID, CID, [40])
    shutil.rmtree(d)  # the container exited; its conmon scope lingers
    assert (d.parent / f"crio-conmon-{CID}.scope").is_dir()
    assert CgroupReader(tmp_path).pids(UID, f"cri-o://{CID}") == []


def test_garbage_in_cgroup_procs_is_skipped(tmp_path):
    base = ct.hierarchy(tmp_path, "v2")
    d = ct.add_container(base, "systemd", "containerd", "burstable", UID, CID, [])
    (d / "cgroup.procs").write_text("12\n\nnot-a-pid\n3\n")
    assert read_pids(d) == [3, 12]


@pytest.mark.parametrize(("uid", "cid", "words"), [
    ("../../etc", f"containerd://{CID}", "pod UID"),
    ("", f"containerd://{CID}", "pod UID"),
    (UID, "containerd://../../../etc", "container ID"),
    (UID, "containerd://", "container ID"),
    (UID, "docker://abc/def", "container ID"),
])
def test_bad_identities_are_refused_with_a_clear_error(tmp_path, uid, cid, words):
    with pytest.raises(CgroupInputError, match=words):
        CgroupReader(tmp_path).pids(uid, cid)


def test_parse_container_id_and_qos():
    assert parse_container_id(f"containerd://{CID.upper()}").id == CID
    assert parse_container_id(f"cri-o://{CID}").runtime == "cri-o"
    assert parse_container_id(CID).runtime == ""
    assert qos_of({"status": {"qosClass": "BestEffort"}}) == "besteffort"
    assert qos_of({"status": {"qosClass": "Guaranteed"}}) == "guaranteed"
    assert qos_of({"status": {}}) is None
    assert qos_of({}) is None
