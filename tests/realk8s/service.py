"""What kube-proxy does for a Service, for host processes: a TCP forwarder on 127.0.0.1 that sends each new
connection to the replica whose pod object matches the rendered Service's selector (for the extender: the one pod
the leader labelled gpumgr.io/extender-leader=true). TLS passes through untouched. No matching replica: the
connection is closed, as a Service without endpoints refuses it."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from typing import Any

BUFFER = 65536


class ServiceProxy:
    def __init__(self, port: int, selector: dict[str, str], namespace: str, client: Callable[[], Any],
                 ports_by_pod: dict[str, int]):
        self.port = port
        self.selector = selector
        self.namespace = namespace
        self.ports_by_pod = ports_by_pod  # pod name -> the port its host process listens on
        self._client = client
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", port))
        self._listener.settimeout(0.5)
        self._thread = threading.Thread(target=self._serve, name=f"service-{port}", daemon=True)

    def start(self) -> ServiceProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()

    def endpoints(self) -> list[int]:
        from kubernetes import client as k

        selector = ",".join(f"{key}={value}" for key, value in sorted(self.selector.items()))
        pods = k.CoreV1Api(self._client()).list_namespaced_pod(self.namespace, label_selector=selector).items
        return [self.ports_by_pod[p.metadata.name] for p in pods if p.metadata.name in self.ports_by_pod]

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._forward, args=(conn,), daemon=True).start()

    def _forward(self, conn: socket.socket) -> None:
        try:
            ports = self.endpoints()
            if not ports:
                conn.close()
                return
            upstream = socket.create_connection(("127.0.0.1", ports[0]), timeout=10)
        except Exception:  # noqa: BLE001 - no endpoint: refused like a Service without endpoints
            conn.close()
            return
        upstream.settimeout(None)
        conn.settimeout(None)
        threading.Thread(target=_pipe, args=(upstream, conn), daemon=True).start()
        _pipe(conn, upstream)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(BUFFER):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            src.close()
