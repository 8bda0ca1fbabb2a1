"""Throwaway certificates for the extender's TLS tests, made with the `openssl` command: a CA, a server
certificate for 127.0.0.1 / localhost, a client certificate, and a client certificate of another CA."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _run(*argv: str) -> None:
    subprocess.run(["openssl", *argv], check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> tuple[Path, Path]:
    key, crt = d / f"{name}.key", d / f"{name}.crt"
    _run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key),
         "-out", str(crt), "-days", "2", "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return crt, key


def _leaf(d: Path, name: str, ca: tuple[Path, Path], ext: str) -> tuple[Path, Path]:
    key, csr, crt, extfile = d / f"{name}.key", d / f"{name}.csr", d / f"{name}.crt", d / f"{name}.ext"
    extfile.write_text(ext)
    _run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key),
         "-out", str(csr), "-subj", f"/CN={name}")
    _run("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
         "-out", str(crt), "-days", "2", "-extfile", str(extfile))
    return crt, key


def make_certs(d: Path) -> Certs:
    d.mkdir(parents=True, exist_ok=True)
    ca = _ca(d, "cluster-ca")
    other = _ca(d, "other-ca")
    server = _leaf(d, "extender", ca, "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    client = _leaf(d, "kube-scheduler", ca, "extendedKeyUsage=clientAuth\n")
    stranger = _leaf(d, "stranger", other, "extendedKeyUsage=clientAuth\n")
    return Certs(ca=ca[0], server_crt=server[0], server_key=server[1], client_crt=client[0], client_key=client[1],
                 stranger_crt=stranger[0], stranger_key=stranger[1])


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_crt: Path
    server_key: Path
    client_crt: Path  # signed by `ca`
    client_key: Path
    stranger_crt: Path  # signed by another CA
    stranger_key: Path
