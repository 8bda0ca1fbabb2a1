"""Issue 18, not yet attacked: `gpumgr run --mode dra` against a hostile or broken API server. As
test_run_hostile_api.py does for the device plugins: the agent runs as its own process in a memory cgroup of the
chart's limit, its API calls through a proxy that turns hostile (fat bookmark floods and 256 MiB answers that
ignore `limit`, every watch 410 Gone, 500 on every write) and then goes away. Throughout, the DRA plugin answers
the kubelet emulator over its unix socket: a claim it cannot read gets its own clear error within the kubelet's
deadline, claims prepared before stay prepared and in the checkpoint, and a prepared claim is unprepared from
the checkpoint alone. Once the server is back, a new claim is prepared."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from gpumgr.dra.config import DRIVER_NAME
from gpumgr.node.checkpoint import CheckpointStore
from gpumgr.sim.dra_scheduler import DraScheduler
from gpumgr.sim.kubeapi.kubeconfig import write_kubeconfig
from gpumgr.sim.kubelet.dra_kubelet import DraKubelet
from tests.dra.harness import NS, device_classes, share_request
from tests.e2e.agent_process import ProcessNode, process_node
from tests.hardening.hostile_api import SwitchingProxy, met_a_huge_list
from tests.hardening.memcap import Capped, chart_memory_limit

HOSTILE_S = 8.0
GONE_S = 8.0


def _allocated(n: ProcessNode, scheduler: DraScheduler, name: str) -> tuple[str, str, str]:
    """A claim of 10 cores and 1 GiB, allocated on the node and reserved for a pod bound there (written straight
    into the API test server, as the scheduler would: the agent's own API calls are what the proxy attacks)."""
    n.api.store.create_object("resourceclaims", {"metadata": {"name": name},
                                                 "spec": {"devices": {"requests": [share_request(memory="1Gi",
                                                                                                 cores=10)]}}}, NS)
    n.api.store.create_pod({"metadata": {"name": f"pod-{name}", "namespace": NS},
                            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                                     "containers": [{"name": "main", "image": "cuda",
                                                     "resources": {"claims": [{"name": "gpu"}]}}]}})
    scheduler.schedule_pod(NS, f"pod-{name}", [n.name])
    claim = n.api.store.get_object("resourceclaims", name, NS)
    assert claim is not None
    return NS, name, claim["metadata"]["uid"]


def _dra_keys(n: ProcessNode) -> set[str]:
    snap = CheckpointStore(n.workdir / "ckpt").load().snapshot
    assert snap is not None
    return {k.split("/")[1] for k in snap.ledger.allocations if k.startswith("dra/")}


async def _until(check: Any, what: Any, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, what()
        await asyncio.sleep(0.1)


async def test_the_dra_plugin_keeps_serving_the_kubelet_through_a_hostile_then_absent_api(tmp_path: Path) -> None:
    limit = chart_memory_limit("agent")
    async with process_node("hostile-dra", "dgx-a100", 16384, "--check-period", "1") as n:
        for dc in device_classes():
            n.api.store.create_object("deviceclasses", dc)
        args = [*n.agent.args, "--mode", "dra", "--cdi-dir", str(n.workdir / "cdi"),
                "--dra-plugin-dir", str(n.workdir / "dra"), "--plugins-registry-dir", str(n.workdir / "reg")]
        kubelet = DraKubelet(n.workdir / "reg", [n.workdir / "cdi"], n.api.store, n.name)
        scheduler = DraScheduler(n.api.store)
        async with SwitchingProxy(n.api.url) as proxy:
            write_kubeconfig(n.workdir / "kubeconfig", proxy.url)  # the agent's API calls go through the proxy
            agent = Capped.start(args, limit, tmp_path / "agent.log", dict(os.environ))
            await kubelet.start()
            try:
                await kubelet.wait_driver(DRIVER_NAME, timeout=60)
                await _until(lambda: n.api.store.list_resource("resourceslices"),
                             lambda: f"no ResourceSlice: {agent.output()}")
                keep, drop = _allocated(n, scheduler, "keep"), _allocated(n, scheduler, "drop")
                resp = await kubelet.prepare(DRIVER_NAME, [keep, drop])
                assert all(r.error == "" and r.devices for r in resp.claims.values()), (resp, agent.output())
                assert _dra_keys(n) == {keep[2], drop[2]}

                errors = {}
                for mode, seconds in (("expire", HOSTILE_S), ("flood", HOSTILE_S), ("gone", GONE_S)):
                    proxy.switch(mode)
                    await asyncio.sleep(seconds)
                    if mode == "expire":  # the pod cache has met a 256 MiB list (asserted below; a loaded machine
                        await _until(lambda: met_a_huge_list(proxy, agent.log), agent.output, 90)  # may need longer)
                    assert agent.alive(), agent.output()
                    assert kubelet.drivers.get(DRIVER_NAME) is not None, mode  # still registered
                    claim = _allocated(n, scheduler, f"new-{mode}")
                    # one call within the kubelet's deadline (a hang would raise DEADLINE_EXCEEDED here)
                    got = (await kubelet.prepare(DRIVER_NAME, [claim])).claims[claim[2]]
                    assert got.error and not got.devices, (mode, got)
                    errors[mode] = got.error
                    assert _dra_keys(n) == {keep[2], drop[2]}, mode  # the prepared claims are still held
                    assert (n.workdir / "cdi").exists()
                    if mode == "gone":  # the API away: unprepare works from the checkpoint alone
                        undone = (await kubelet.unprepare(DRIVER_NAME, [drop])).claims[drop[2]]
                        assert undone.error == "", undone
                        assert _dra_keys(n) == {keep[2]}

                proxy.switch("pass")
                after = _allocated(n, scheduler, "after")
                for _ in range(30):
                    got = (await kubelet.prepare(DRIVER_NAME, [after])).claims[after[2]]
                    if got.error == "":
                        break
                    await asyncio.sleep(1)
                else:
                    raise AssertionError((got.error, agent.output()))
                peak = agent.peak_rss()
                calls = dict(proxy.calls)
                lists = proxy.hostile["expire"].lists
            finally:
                await kubelet.stop()
                agent.close()
            log = agent.log.read_text(errors="replace")
        print(f"\nDRA agent {agent.where}: {HOSTILE_S:g} s of 410s and 256 MiB answers ({lists} lists), "
              f"{HOSTILE_S:g} s of bookmark floods ({calls.get('flood', 0)} calls), "
              f"{GONE_S:g} s gone ({calls.get('gone', 0)} calls); peak RSS {peak / 2**20:.0f} MiB "
              f"(limit {limit >> 20} MiB); errors: {errors}")
        for mode, error in errors.items():
            assert f"claim default/new-{mode}: reading it from the API" in error, (mode, error)
            assert len(error) < 500, error
        assert lists >= 1 and "an answer over 33554432 bytes" in log  # the pod cache met the 256 MiB lists
        assert peak < limit
        assert "Traceback" not in log
        assert _dra_keys(n) == {keep[2], after[2]}  # nothing prepared was lost; the unprepared one is gone
        cdi = {p.name for p in (n.workdir / "cdi").glob("*")}
        assert len(cdi) == 2 and all(any(u[2] in name for name in cdi) for u in (keep, after)), cdi
