"""The kubelet plugin-registration service on `<plugins registry>/<driver>-reg.sock`: tells the kubelet where
the DRA socket is and which services it serves, and hears whether registration worked."""

from __future__ import annotations

import asyncio
import logging

import grpc

from gpumgr.dra.config import PLUGIN_SERVICES, DraConfig
from gpumgr.pb import pluginregistration_pb2 as pb
from gpumgr.pb import pluginregistration_pb2_grpc as pb_grpc

log = logging.getLogger("gpumgr.dra.registration")
MAX_ERROR = 1024


class RegistrationServicer(pb_grpc.RegistrationServicer):
    def __init__(self, cfg: DraConfig):
        self.cfg = cfg
        self.registered = asyncio.Event()
        self.registrations = 0
        self.last_error = ""

    async def GetInfo(self, request: pb.InfoRequest,  # noqa: N802
                      context: grpc.aio.ServicerContext) -> pb.PluginInfo:
        return pb.PluginInfo(type="DRAPlugin", name=self.cfg.driver_name, endpoint=str(self.cfg.socket),
                             supported_versions=list(PLUGIN_SERVICES))

    async def NotifyRegistrationStatus(self, request: pb.RegistrationStatus,  # noqa: N802
                                       context: grpc.aio.ServicerContext) -> pb.RegistrationStatusResponse:
        if request.plugin_registered:
            self.registrations += 1
            self.last_error = ""
            self.registered.set()
            log.info("kubelet registered DRA driver %s (registration %d)", self.cfg.driver_name, self.registrations)
        else:
            self.last_error = request.error[:MAX_ERROR]
            self.registered.clear()
            log.error("kubelet refused DRA driver %s: %s", self.cfg.driver_name, self.last_error)
        return pb.RegistrationStatusResponse()
