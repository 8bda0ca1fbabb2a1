"""The certificate files a rendered pod would see, written to disk, and a TLS handshake between two contexts."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path, PurePosixPath
from typing import Any

from .support import Rendered, container

HANDSHAKE_ROUNDS = 20


def mounted_file(rendered: Rendered, workload: dict[str, Any], container_name: str, path: str, out: Path) -> Path:
    """Write the Secret key that `path` names inside the container (through its volume mounts) to `out`."""
    pod = workload["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    target = PurePosixPath(path)
    for mount in container(workload, container_name).get("volumeMounts", []):
        mount_path = PurePosixPath(mount["mountPath"])
        if target.parent != mount_path:
            continue
        secret_name = volumes[mount["name"]]["secret"]["secretName"]
        data = rendered.get("Secret", secret_name)["data"]
        assert target.name in data, f"{path}: Secret {secret_name} has no key {target.name}"
        out.mkdir(parents=True, exist_ok=True)
        file = out / f"{secret_name}-{target.name}"
        file.write_bytes(base64.b64decode(data[target.name]))
        return file
    raise AssertionError(f"{path} is not in a Secret mounted into {workload['metadata']['name']}/{container_name}")


def handshake(server: ssl.SSLContext, client: ssl.SSLContext, server_name: str) -> None:
    """A full TLS handshake in memory (no sockets, no clocks); raises ssl.SSLError where either side refuses."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client_side = client.wrap_bio(c_in, c_out, server_side=False, server_hostname=server_name)
    server_side = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(HANDSHAKE_ROUNDS):
        for name, side in (("client", client_side), ("server", server_side)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            break
    assert all(done.values()), f"handshake did not finish: {done}"
    # TLS 1.3 reports a refused client certificate after the handshake: exchange one message each way.
    client_side.write(b"ping")
    s_in.write(c_out.read())
    assert server_side.read(4) == b"ping"
    server_side.write(b"pong")
    c_in.write(s_out.read())
    assert client_side.read(4) == b"pong"
