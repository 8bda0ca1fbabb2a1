"""TLS for the extender and the webhook: the server context (HTTPS, client certificates required; the webhook
builds its own through it) and the matching client context a kube-scheduler stand-in presents
(`enableHTTPS: true`, `tlsConfig` with certFile, keyFile, caFile)."""

from __future__ import annotations

import ssl
from pathlib import Path


class TlsSettingsError(ValueError):
    """A certificate, key or CA file that cannot be used; the message names the file."""


def server_context(cert_file: str, key_file: str, client_ca_file: str = "") -> ssl.SSLContext:
    """HTTPS with this certificate; with `client_ca_file`, every caller must present a certificate it signed."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, cert_file, key_file, "--tls-cert-file", "--tls-key-file")
    if client_ca_file:
        _load_ca(ctx, client_ca_file, "--client-ca-file")
        ctx.verify_mode = ssl.CERT_REQUIRED
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def client_context(ca_file: str, cert_file: str = "", key_file: str = "",
                   server_name_check: bool = True) -> ssl.SSLContext:
    """What the scheduler presents: trusts `ca_file` for the extender's certificate, and shows its own."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_ca(ctx, ca_file, "caFile")
    ctx.check_hostname = server_name_check
    if cert_file:
        _load_chain(ctx, cert_file, key_file, "certFile", "keyFile")
    return ctx


def requires_client_certs(ctx: ssl.SSLContext | None) -> bool:
    return ctx is not None and ctx.verify_mode == ssl.CERT_REQUIRED


def _load_chain(ctx: ssl.SSLContext, cert_file: str, key_file: str, cert_flag: str, key_flag: str) -> None:
    for flag, path in ((cert_flag, cert_file), (key_flag, key_file)):
        if not path or not Path(path).is_file():
            raise TlsSettingsError(f"{flag} {path!r}: no such file")
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, OSError) as e:
        raise TlsSettingsError(f"{cert_flag} {cert_file} / {key_flag} {key_file}: not a certificate and its "
                               f"private key in PEM: {e}") from None


def _load_ca(ctx: ssl.SSLContext, ca_file: str, flag: str) -> None:
    if not ca_file or not Path(ca_file).is_file():
        raise TlsSettingsError(f"{flag} {ca_file!r}: no such file")
    try:
        ctx.load_verify_locations(cafile=ca_file)
    except (ssl.SSLError, OSError) as e:
        raise TlsSettingsError(f"{flag} {ca_file}: not PEM CA certificates: {e}") from None
