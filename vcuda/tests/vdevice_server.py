"""A real grpcio vDevice server for the shim's registration tests.

It serves gpumgr.vdevice.v1.VDevice on ``unix:<dir>/vcuda.sock`` with the
generated code, records every RegisterRequest it receives, and answers with
the RegisterResponse (or gRPC error) the test configured.
"""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from gpumgr.pb import vdevice_pb2, vdevice_pb2_grpc


class VDeviceTestServer(vdevice_pb2_grpc.VDeviceServicer):
    def __init__(self, socket_path: str, reply: Reply) -> None:
        self.socket_path = socket_path
        self.reply = reply
        self.requests: list[vdevice_pb2.RegisterRequest] = []
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        vdevice_pb2_grpc.add_VDeviceServicer_to_server(self, self._server)
        self._server.add_insecure_port("unix:" + socket_path)

    def __enter__(self) -> VDeviceTestServer:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None).wait(5)

    def Register(  # noqa: N802 (gRPC method name)
        self, request: vdevice_pb2.RegisterRequest, context: grpc.ServicerContext
    ) -> vdevice_pb2.RegisterResponse:
        with self._lock:
            self.requests.append(request)
            n = len(self.requests)
        if self.reply.error is not None and (self.reply.fail_first == 0 or n <= self.reply.fail_first):
            context.abort(self.reply.error, self.reply.error_message)
        devices = [
            vdevice_pb2.DeviceLimit(uuid=uuid, index=index, memory_limit_bytes=limit)
            for uuid, index, limit in self.reply.devices
        ]
        host_pid = self.reply.host_pid if self.reply.host_pid is not None else request.pid
        return vdevice_pb2.RegisterResponse(
            devices=devices,
            core_limit=self.reply.core_limit,
            hard_limit=self.reply.hard_limit,
            core_ceiling=self.reply.core_ceiling,
            host_pid=host_pid,
        )


@dataclass
class Reply:
    devices: list[tuple[str, int, int]] = field(default_factory=list)
    core_limit: int = 0
    hard_limit: bool = True
    core_ceiling: int = 0
    host_pid: int | None = None  # None: echo the caller's pid
    error: grpc.StatusCode | None = None
    error_message: str = ""
    fail_first: int = 0  # with error: answer only the first N requests with it (0: all)
