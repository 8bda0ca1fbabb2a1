"""Where the API server is and how to prove who we are: a kubeconfig subset, or the pod's service account.

Supported in a kubeconfig: `current-context`; a cluster's `server`, `certificate-authority(-data)` and
`insecure-skip-tls-verify` (not both: like client-go, a CA together with the insecure flag is refused); a user's
`client-certificate(-data)`, `client-key(-data)`, `token` and `tokenFile`.
Anything else that changes how we connect (exec or auth-provider plugins, basic auth, proxies, impersonation)
is refused with one line naming the file and the field: guessing would send requests without credentials.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import ssl
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpumgr.files.docfile import InputError

log = logging.getLogger("gpumgr.kube")

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
MAX_TOKEN_BYTES = 64 << 10
MAX_CA_BYTES = 4 << 20  # a CA bundle; the system's whole bundle is ~200 KiB

_Version = tuple[int, int, int] | None  # (inode, mtime, size) of a file; None: no such file
_Versions = tuple[_Version, _Version, _Version]  # of the CA, client certificate and client key files

_INSECURE_WITH_CA = ("insecure-skip-tls-verify is true and a certificate-authority is given: specifying a root "
                     "certificates file with the insecure flag is not allowed (remove one of the two)")

# Fields that are descriptive only; every other unknown field is refused.
_CLUSTER_FIELDS = {"server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify",
                   "extensions", "disable-compression"}
_USER_FIELDS = {"client-certificate", "client-certificate-data", "client-key", "client-key-data", "token",
                "tokenFile", "extensions"}


class KubeConfigError(InputError):
    """The connection settings cannot be used; str() names the file (or in-cluster) and the field."""


@dataclass
class ClusterAccess:
    """One API server and one identity. `*_data` are PEM bytes given inline; `*_file` are paths."""

    server: str
    source: str  # "kubeconfig /path" or "in-cluster", for messages
    ca_file: str | None = None
    ca_data: bytes | None = None
    cert_file: str | None = None
    cert_data: bytes | None = None
    key_file: str | None = None
    key_data: bytes | None = None
    token: str | None = None
    token_file: str | None = None
    insecure: bool = False
    _token_seen: tuple[int, int, int] | None = field(default=None, repr=False)
    _token_cache: str | None = field(default=None, repr=False)
    _tls_cache: ssl.SSLContext | None = field(default=None, repr=False)
    _tls_seen: _Versions = field(default=(None, None, None), repr=False)  # of the files behind the cached context
    _ca_loaded: bytes | None = field(default=None, repr=False)  # the CA bytes the cached context trusts
    _tls_warned: _Versions | None = field(default=None, repr=False)  # the files' versions last warned about
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def tls(self) -> bool:
        return self.server.startswith("https://")

    def bearer(self, force: bool = False) -> str | None:
        """The token to send: the inline one, or the token file's content, read again whenever the file changes
        (the kubelet rotates projected service-account tokens by swapping the file)."""
        if self.token_file is None:
            return self.token
        with self._lock:
            try:
                st = os.stat(self.token_file)
            except OSError as e:
                if self._token_cache is not None:
                    return self._token_cache  # mid-swap: the last token is still valid for a while
                raise KubeConfigError(f"{self.source}: cannot read token file {self.token_file}: "
                                      f"{e.strerror or e}") from None
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            if force or seen != self._token_seen or self._token_cache is None:
                self._token_cache = _read_token(self.token_file, self.source)
                self._token_seen = seen
            return self._token_cache

    def tls_context(self) -> ssl.SSLContext | None:
        """The TLS settings for new connections (None for http://): the same object until the files behind it change.

        The CA file and the client certificate and key files are watched like the token file (inode, mtime, size):
        in a pod they are projected, and replaced when the cluster's root CA or the certificate is rotated. The
        kubelet also re-projects every file of a service-account volume when it refreshes the token, so a CA file
        that only got a new inode is compared by content: the same bytes keep the same context, silently. A reload
        that fails (a file unreadable, not a certificate, a key that does not match) keeps the last good context,
        with one warning per version of the files, and is tried again at the next call until it succeeds."""
        if not self.tls:
            return None
        with self._lock:
            cached = self._tls_cache
            files = (self.ca_file, self.cert_file, self.key_file)
            if cached is not None and not any(files):
                return cached  # inline data and system roots never change
            seen = (_version(files[0]), _version(files[1]), _version(files[2]))
            if cached is not None and seen == self._tls_seen:
                return cached
            try:
                ca = _read_ca(self.ca_file, self.source) if self.ca_file else self.ca_data
                same = cached is not None and ca == self._ca_loaded and seen[1:] == self._tls_seen[1:]
                ctx = cached if same and cached is not None else self._context(ca)
            except KubeConfigError as e:
                if cached is None:
                    raise
                if seen != self._tls_warned:
                    self._tls_warned = seen
                    log.warning("%s; new connections keep the TLS settings loaded before", e)
                return cached  # `_tls_seen` is kept: the next call tries again (the failure may not last)
            if ctx is not cached and cached is not None:
                changed = [f for f, now, was in zip(files[1:], seen[1:], self._tls_seen[1:], strict=True) if now != was]
                if ca != self._ca_loaded:
                    changed.insert(0, files[0])
                log.info("%s: %s changed; new connections use the new content", self.source,
                         ", ".join(str(f) for f in changed))
            self._tls_cache, self._tls_seen, self._ca_loaded = ctx, seen, ca
            return ctx

    def _context(self, ca: bytes | None) -> ssl.SSLContext:
        """A TLS context trusting the PEM bytes `ca` (None: the system's roots), with the client certificate."""
        if self.insecure and (self.ca_file or self.ca_data):
            raise KubeConfigError(f"{self.source}: {_INSECURE_WITH_CA}")
        where = self.ca_file or "certificate-authority-data"
        pem = ca.decode("ascii", "replace") if ca is not None else None
        if pem is not None and not pem.strip():  # ssl would take an empty string for "the system's roots"
            raise KubeConfigError(f"{self.source}: the cluster's CA certificate ({where}) is empty")
        try:
            ctx = ssl.create_default_context(cadata=pem)
        except (ssl.SSLError, ValueError) as e:
            raise KubeConfigError(f"{self.source}: the cluster's CA certificate cannot be loaded ({where}): {e}") \
                from None
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert_file or self.cert_data:
            with _pem_files(self) as (cert, key):
                try:
                    ctx.load_cert_chain(cert, key)
                except (ssl.SSLError, OSError) as e:
                    raise KubeConfigError(f"{self.source}: client certificate/key cannot be loaded: {e}") from None
        return ctx

    def official_configuration(self, workdir: Path) -> Any:
        """The same settings as a `kubernetes.client.Configuration` (only the DRA front end needs one).
        Inline PEM data is written under `workdir`, which must stay until the client is closed."""
        from kubernetes import client

        conf: Any = client.Configuration()
        conf.host = self.server.rstrip("/")
        conf.verify_ssl = not self.insecure
        conf.ssl_ca_cert = self.ca_file or (_write(workdir / "ca.crt", self.ca_data) if self.ca_data else None)
        conf.cert_file = self.cert_file or (_write(workdir / "client.crt", self.cert_data) if self.cert_data else None)
        conf.key_file = self.key_file or (_write(workdir / "client.key", self.key_data) if self.key_data else None)
        if self.token_file is not None or self.token is not None:
            conf.api_key["BearerToken"] = f"Bearer {self.bearer()}"
            if self.token_file is not None:
                conf.refresh_api_key_hook = lambda c: c.api_key.update(BearerToken=f"Bearer {self.bearer()}")
        return conf


def load_kubeconfig(path: str) -> ClusterAccess:
    """The current context of the kubeconfig file at `path`. Relative paths in it are taken from its folder."""
    from gpumgr.files.docfile import InputError, load_doc

    src = f"kubeconfig {path}"
    try:  # the project's bounded reader: size (GPUMGR_MAX_INPUT_BYTES), nesting, no YAML aliases
        doc = load_doc(path).data
    except InputError as e:
        raise KubeConfigError(f"kubeconfig {e}") from None
    if not isinstance(doc, dict):
        raise KubeConfigError(f"{src}: not a kubeconfig (expected a mapping)")
    current = doc.get("current-context")
    if not current or not isinstance(current, str):
        raise KubeConfigError(f"{src}: current-context is not set")
    ctx = _named(doc, "contexts", "context", current, src)
    cluster_name, user_name = ctx.get("cluster"), ctx.get("user")
    if not cluster_name or not isinstance(cluster_name, str):
        raise KubeConfigError(f"{src}: context {current!r} names no cluster")
    cluster = _named(doc, "clusters", "cluster", cluster_name, src)
    user = _named(doc, "users", "user", user_name, src) if isinstance(user_name, str) and user_name else {}
    _only(cluster, _CLUSTER_FIELDS, f"{src}: clusters[{cluster_name}].cluster")
    _only(user, _USER_FIELDS, f"{src}: users[{user_name}].user")

    base = Path(path).resolve().parent
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise KubeConfigError(f"{src}: clusters[{cluster_name}].cluster.server must be an https:// or http:// URL, "
                              f"got {'a string' if isinstance(server, str) else 'a ' + type(server).__name__}")

    def file_of(obj: dict[str, Any], key: str, where: str) -> str | None:
        v = obj.get(key)
        if v in (None, ""):
            return None
        if not isinstance(v, str):
            raise KubeConfigError(f"{src}: {where}.{key} must be a path")
        return str(base / v)

    def data_of(obj: dict[str, Any], key: str, where: str) -> bytes | None:
        v = obj.get(key)
        if v in (None, ""):
            return None
        if not isinstance(v, str):
            raise KubeConfigError(f"{src}: {where}.{key} must be a base64 string, got a {type(v).__name__}")
        try:
            return base64.b64decode(v, validate=True)
        except (binascii.Error, ValueError):
            raise KubeConfigError(f"{src}: {where}.{key} is not base64") from None

    cw, uw = f"clusters[{cluster_name}].cluster", f"users[{user_name}].user"
    token = user.get("token")
    if token is not None and not isinstance(token, str):
        raise KubeConfigError(f"{src}: {uw}.token must be a string")
    insecure = cluster.get("insecure-skip-tls-verify", False)
    if not isinstance(insecure, bool):
        raise KubeConfigError(f"{src}: {cw}.insecure-skip-tls-verify must be true or false")
    access = ClusterAccess(
        server=server, source=src, ca_file=file_of(cluster, "certificate-authority", cw),
        ca_data=data_of(cluster, "certificate-authority-data", cw),
        cert_file=file_of(user, "client-certificate", uw), cert_data=data_of(user, "client-certificate-data", uw),
        key_file=file_of(user, "client-key", uw), key_data=data_of(user, "client-key-data", uw),
        token=token or None, token_file=None if token else file_of(user, "tokenFile", uw), insecure=insecure)
    if bool(access.cert_file or access.cert_data) != bool(access.key_file or access.key_data):
        raise KubeConfigError(f"{src}: {uw} has a client certificate without a key, or a key without a certificate")
    if insecure and (access.ca_file or access.ca_data):  # client-go refuses it too: which one was meant?
        raise KubeConfigError(f"{src}: {cw}: {_INSECURE_WITH_CA}")
    access.tls_context()  # unreadable CA or client files are reported now, not at the first call
    if access.token_file:
        access.bearer()
    return access


def in_cluster(env: dict[str, str] | None = None, sa_dir: str = SERVICE_ACCOUNT_DIR) -> ClusterAccess:
    """The pod's own service account: KUBERNETES_SERVICE_HOST/PORT, and the token and CA in `sa_dir`."""
    env = dict(os.environ) if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubeConfigError("in-cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set "
                              "(not running in a pod? pass --kubeconfig)")
    if ":" in host:
        host = f"[{host}]"
    ca = os.path.join(sa_dir, "ca.crt")
    access = ClusterAccess(server=f"https://{host}:{port}", source="in-cluster", ca_file=ca,
                           token_file=os.path.join(sa_dir, "token"))
    if not os.path.isfile(ca):
        raise KubeConfigError(f"in-cluster: no service-account CA at {ca}")
    access.tls_context()
    access.bearer()
    return access


def _named(doc: dict[str, Any], section: str, inner: str, name: str, src: str) -> dict[str, Any]:
    entries = doc.get(section) or []
    if not isinstance(entries, list):
        raise KubeConfigError(f"{src}: {section} must be a list")
    for e in entries:
        if isinstance(e, dict) and e.get("name") == name:
            body = e.get(inner) or {}
            if not isinstance(body, dict):
                raise KubeConfigError(f"{src}: {section}[{name}].{inner} must be a mapping")
            return body
    raise KubeConfigError(f"{src}: no {section[:-1]} named {name!r}")


def _only(obj: dict[str, Any], allowed: set[str], where: str) -> None:
    for key in obj:
        if key not in allowed:
            raise KubeConfigError(f"{where}.{key} is not supported by gpumgr (supported: {', '.join(sorted(allowed))})")


def _version(path: str | None) -> _Version:
    """What tells that a file changed (inode, mtime, size); None while it cannot be stat'ed (mid-swap, removed)."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _read_ca(path: str, source: str) -> bytes:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CA_BYTES + 1)
    except OSError as e:
        raise KubeConfigError(f"{source}: the cluster's CA certificate cannot be read ({path}): "
                              f"{e.strerror or e}") from None
    if len(raw) > MAX_CA_BYTES:
        raise KubeConfigError(f"{source}: the cluster's CA certificate ({path}) is over {MAX_CA_BYTES} bytes")
    return raw


def _read_token(path: str, source: str) -> str:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TOKEN_BYTES + 1)
    except OSError as e:
        raise KubeConfigError(f"{source}: cannot read token file {path}: {e.strerror or e}") from None
    token = raw.decode("ascii", "replace").strip()
    if not token or len(raw) > MAX_TOKEN_BYTES or not token.isprintable():
        raise KubeConfigError(f"{source}: token file {path} holds no usable token")
    return token


def _write(path: Path, data: bytes) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return str(path)


class _pem_files:  # noqa: N801 - used as a context manager, like a function
    """The client certificate and key as files (ssl loads them only from files); inline data lives in a private
    temporary folder only while it is loaded."""

    def __init__(self, access: ClusterAccess):
        self.access = access
        self.tmp: tempfile.TemporaryDirectory[str] | None = None

    def __enter__(self) -> tuple[str, str | None]:
        a = self.access
        if a.cert_data or a.key_data:
            self.tmp = tempfile.TemporaryDirectory(prefix="gpumgr-kube-")
            d = Path(self.tmp.name)
            cert = a.cert_file or _write(d / "client.crt", a.cert_data or b"")
            key = a.key_file or (_write(d / "client.key", a.key_data) if a.key_data else None)
            return cert, key
        return str(a.cert_file), a.key_file

    def __exit__(self, *exc: object) -> None:
        if self.tmp is not None:
            self.tmp.cleanup()
