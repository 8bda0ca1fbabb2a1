"""The DRA front end as one unit: recovery, the DRA and registration sockets, ResourceSlice
publishing.

    fe = await start_dra(agent)      # after the agent's state, vDevice manager and kube client exist
    ...
    await fe.stop()

It shares the agent's node core: `agent.state` (ledger + checkpoint + health), the vDevice layout and manager of
`agent.service` (or `agent.vdevices` / `agent.layout`), and `agent.kube.api_client`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import grpc

from gpumgr.dra.config import DraConfig, from_agent_config
from gpumgr.dra.kubeaccess import DraKube
from gpumgr.dra.placement import CachedPod
from gpumgr.dra.plugin import DraHealthServicer, DraPluginServicer
from gpumgr.dra.preparer import ClaimPreparer
from gpumgr.dra.publisher import SlicePublisher
from gpumgr.dra.recovery import RecoveryReport, recover
from gpumgr.dra.registration import RegistrationServicer
from gpumgr.node.state import NodeState
from gpumgr.pb import dra_pb2_grpc, drahealth_pb2_grpc, pluginregistration_pb2_grpc
from gpumgr.vdevice.layout import VDeviceLayout
from gpumgr.vdevice.server import VDeviceManager

log = logging.getLogger("gpumgr.dra")
WATCH_S = 1.0  # how often the sockets are checked (a kubelet restart may wipe the registry directory)
MAX_MESSAGE_BYTES = 4 << 20


class DraFrontEnd:
    def __init__(self, cfg: DraConfig, state: NodeState, layout: VDeviceLayout, vdevices: VDeviceManager,
                 kube: DraKube, cached_pod: CachedPod | None = None):
        self.cfg = cfg
        self.state = state
        self.kube = kube
        self.preparer = ClaimPreparer(cfg, state, layout, vdevices, lambda ns, name, uid: kube.get_claim(ns, name),
                                      kube.get_pod, cached_pod)
        self.publisher = SlicePublisher(cfg, state, kube)
        self.registration = RegistrationServicer(cfg)
        self.health = DraHealthServicer(cfg, state)
        self.recovery: RecoveryReport | None = None
        self._plugin_server: grpc.aio.Server | None = None
        self._reg_server: grpc.aio.Server | None = None
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.recovery = await recover(self.preparer, self.kube.list_claims)
        r = self.recovery
        log.info("DRA recovery: %d claims restored, %d freed, %d kept, %d failed", len(r.restored), len(r.freed),
                 len(r.kept), len(r.failed))
        await self._serve_plugin()
        await self._serve_registration()
        self.publisher.start()
        self._watch = asyncio.create_task(self._watch_sockets())

    async def _serve_plugin(self) -> None:
        sock = self.cfg.socket
        _check_path(sock)
        await asyncio.get_running_loop().run_in_executor(None, _fresh_socket_dir, sock)
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
        dra_pb2_grpc.add_DRAPluginServicer_to_server(DraPluginServicer(self.cfg, self.preparer), server)
        drahealth_pb2_grpc.add_DRAResourceHealthServicer_to_server(self.health, server)
        server.add_insecure_port(f"unix://{sock}")
        await server.start()
        self._plugin_server = server
        log.info("DRA driver %s serving on %s", self.cfg.driver_name, sock)

    async def _serve_registration(self) -> None:
        sock = self.cfg.registration_socket
        _check_path(sock)
        await asyncio.get_running_loop().run_in_executor(None, _fresh_socket_dir, sock)
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 10)])
        pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(self.registration, server)
        server.add_insecure_port(f"unix://{sock}")
        await server.start()
        self._reg_server = server
        log.info("DRA registration socket %s", sock)

    async def _watch_sockets(self) -> None:
        while True:
            await asyncio.sleep(WATCH_S)
            try:
                if not self.cfg.socket.exists() and self._plugin_server is not None:
                    log.warning("DRA socket %s vanished: serving it again", self.cfg.socket)
                    await self._plugin_server.stop(grace=0.5)
                    await self._serve_plugin()
                if not self.cfg.registration_socket.exists() and self._reg_server is not None:
                    log.warning("registration socket %s vanished (kubelet restart?): registering again",
                                self.cfg.registration_socket)
                    await self._reg_server.stop(grace=0.5)
                    await self._serve_registration()
            except Exception:  # noqa: BLE001 - keep watching
                log.exception("DRA socket watch failed")

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch
        await self.publisher.stop()
        for server in (self._reg_server, self._plugin_server):
            if server is not None:
                await server.stop(grace=0.5)
        for sock in (self.cfg.registration_socket, self.cfg.socket):
            with contextlib.suppress(OSError):
                sock.unlink()


async def start_dra(agent: Any, cfg: DraConfig | None = None) -> DraFrontEnd:
    """Start the DRA front end over the agent's node core. `cfg` defaults to the agent config's DRA settings."""
    state: NodeState = agent.state
    layout, vdevices = agent.layout, agent.vdevices  # the agent's, shared with the device-plugin front end
    if layout is None or vdevices is None:
        raise RuntimeError("start_dra: the agent has not built its vDevice layout and manager yet")
    pods = getattr(agent, "pods", None)  # the agent's cache of this node's pods
    fe = DraFrontEnd(cfg or from_agent_config(agent.config), state, layout, vdevices, DraKube(agent.kube.api_client),
                     pods.get if pods is not None else None)
    mig = getattr(agent, "mig", None)
    if mig is not None:  # MIG-capable cards: partitionable devices, instances made at prepare (docs/mig.md)
        from gpumgr.dra.mig_prepare import MigClaims
        from gpumgr.dra.mig_shares import ShareSupport

        fe.preparer.mig = MigClaims(state, mig.manager, fe.cfg.cdi_dir, agent.config.mig_minors, fe.cfg.node_name,
                                    ShareSupport(fe.cfg, layout, vdevices))
        fe.publisher.mig_cards = await asyncio.to_thread(mig.manager.cards)
    await fe.start()
    return fe


def _check_path(sock: Path) -> None:
    if len(str(sock)) >= 108:
        raise ValueError(f"socket path {sock} is longer than a unix socket allows (107 bytes)")


def _fresh_socket_dir(sock: Path) -> None:
    sock.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sock)
