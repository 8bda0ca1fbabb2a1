"""The kubelet's `v1beta1.Registration` server on `<plugin_dir>/kubelet.sock`.

Register hands the request to the device manager, which checks it (`check_register_request`: version
and resource name), dials back and connects. Any failure returns an error status with a message, as
the kubelet does (its plain Go errors reach the plugin as status UNKNOWN).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from gpumgr.pb import deviceplugin_pb2 as pb
from gpumgr.pb import deviceplugin_pb2_grpc as pb_grpc
from gpumgr.sim.kubelet.protocol import SUPPORTED_VERSIONS, UNIX_PATH_MAX, is_extended_resource_name

log = logging.getLogger(__name__)

ConnectHandler = Callable[[pb.RegisterRequest], Awaitable[None]]


class RegistrationRejected(Exception):
    """A Register request that the kubelet refuses; the message goes back to the plugin."""


def check_register_request(request: pb.RegisterRequest) -> None:
    """Raise RegistrationRejected when the version or the resource name is not acceptable."""
    if request.version not in SUPPORTED_VERSIONS:
        raise RegistrationRejected(
            f"API version {request.version!r} is not supported; "
            f"supported versions: {list(SUPPORTED_VERSIONS)}"
        )
    if not is_extended_resource_name(request.resource_name):
        raise RegistrationRejected(
            f"resource name {request.resource_name!r} is not a valid extended resource name "
            "(it needs a domain prefix such as vendor.com/ and must not be in kubernetes.io)"
        )


class RegistrationServer:
    """Serves Registration on one unix socket; `connect` does the dial-back and may raise
    RegistrationRejected (or any exception, reported as its message)."""

    def __init__(self, socket_path: Path, connect: ConnectHandler) -> None:
        if len(str(socket_path).encode()) > UNIX_PATH_MAX:
            raise ValueError(f"kubelet socket path {socket_path} is longer than {UNIX_PATH_MAX} bytes")
        self.socket_path = socket_path
        self._connect = connect
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self.socket_path.unlink(missing_ok=True)
        server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(_RegistrationServicer(self._connect), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server
        log.info("kubelet registration server listening on %s", self.socket_path)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace=None)
        self.socket_path.unlink(missing_ok=True)

    @property
    def serving(self) -> bool:
        return self._server is not None


class _RegistrationServicer(pb_grpc.RegistrationServicer):
    def __init__(self, connect: ConnectHandler) -> None:
        self._connect = connect

    async def Register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        try:
            await self._connect(request)
        except Exception as exc:  # every failure is reported to the plugin, never raised
            log.info(
                "registration of %r (endpoint %r) rejected: %s", request.resource_name, request.endpoint, exc
            )
            await context.abort(grpc.StatusCode.UNKNOWN, str(exc) or type(exc).__name__)
        return pb.Empty()
