"""`gpumgr webhook`: the mutating admission webhook (schedulerName for GPU pods, refusal of impossible asks)."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING

from gpumgr.commands.common import env_default

if TYPE_CHECKING:
    from gpumgr.webhook.server import TlsFiles

LOG_LEVELS = ("debug", "info", "warning", "error")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("webhook", help="run the admission webhook that sends GPU pods to the gpumgr scheduler",
                       description="Mutating admission webhook over HTTPS: /mutate sets spec.schedulerName on pods "
                       "that ask for tencent.com/vcuda-core or vcuda-memory and refuses asks no node could run; "
                       "/healthz answers on the same port. Every flag can also be set with the environment "
                       "variable GPUMGR_<FLAG> (e.g. GPUMGR_TLS_CERT_FILE).")
    p.add_argument("--listen", default=env_default("--listen", "0.0.0.0:8443"), metavar="HOST:PORT",
                   help="address to serve on (default 0.0.0.0:8443)")
    p.add_argument("--tls-cert-file", default=env_default("--tls-cert-file", ""), metavar="F",
                   help="PEM certificate (chain) served to the API server")
    p.add_argument("--tls-key-file", default=env_default("--tls-key-file", ""), metavar="F", help="its PEM key")
    p.add_argument("--client-ca-file", default=env_default("--client-ca-file", ""), metavar="F",
                   help="if set, callers must present a client certificate signed by this CA")
    p.add_argument("--scheduler-name", default=env_default("--scheduler-name", "gpumgr-scheduler"), metavar="NAME",
                   help="schedulerName given to GPU pods that name none or default-scheduler "
                   "(default gpumgr-scheduler)")
    p.add_argument("--insecure-http", action="store_true",
                   default=(env_default("--insecure-http", "") or "").lower() in ("1", "true", "yes"),
                   help="serve plain HTTP without a certificate (tests and demos only; the API server needs HTTPS)")
    p.add_argument("--log-level", default=env_default("--log-level", "info"), help="debug, info, warning, error")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpumgr.commands.extender import parse_listen
    from gpumgr.docfile import InputError

    host, port = parse_listen(args.listen)
    if str(args.log_level).lower() not in LOG_LEVELS:
        raise InputError(f"--log-level {args.log_level!r}: expected one of {', '.join(LOG_LEVELS)}")
    if not _NAME.match(args.scheduler_name or ""):
        raise InputError(f"--scheduler-name {args.scheduler_name!r}: expected a lower-case DNS name "
                         "such as gpumgr-scheduler")
    tls = _tls(args)
    import asyncio

    return asyncio.run(_serve(args.scheduler_name, tls, host, port))


def _tls(args: argparse.Namespace) -> TlsFiles | None:
    """TlsFiles, or None with --insecure-http; InputError naming the flag and file otherwise."""
    import logging
    import ssl
    from pathlib import Path

    from gpumgr.docfile import InputError
    from gpumgr.webhook.server import TlsFiles, server_context

    if not args.tls_cert_file and not args.tls_key_file:
        if args.insecure_http:
            logging.getLogger("gpumgr.webhook").warning(
                "--insecure-http: serving plain HTTP; the API server only calls webhooks over HTTPS")
            return None
        raise InputError("--tls-cert-file and --tls-key-file are required (the API server calls webhooks over "
                         "HTTPS); use --insecure-http only for tests")
    if not args.tls_cert_file or not args.tls_key_file:
        raise InputError("give both --tls-cert-file and --tls-key-file")
    for flag, path in (("--tls-cert-file", args.tls_cert_file), ("--tls-key-file", args.tls_key_file),
                       ("--client-ca-file", args.client_ca_file)):
        if path and not Path(path).is_file():
            raise InputError(f"{flag} {path}: no such file")
    tls = TlsFiles(args.tls_cert_file, args.tls_key_file, args.client_ca_file)
    try:
        server_context(tls)
    except (OSError, ssl.SSLError) as e:
        raise InputError(f"cannot use --tls-cert-file {tls.cert_file} with --tls-key-file {tls.key_file}"
                         f"{' and --client-ca-file ' + tls.client_ca_file if tls.client_ca_file else ''}: "
                         f"{getattr(e, 'reason', None) or e}") from None
    return tls


async def _serve(scheduler_name: str, tls: TlsFiles | None, host: str, port: int) -> int:
    import asyncio
    import logging
    import signal

    from gpumgr.webhook.server import WebhookServer

    log = logging.getLogger("gpumgr.webhook")
    server = WebhookServer(scheduler_name, tls)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start(host, port)
    except OSError as e:
        log.error("cannot listen on %s:%d: %s", host, port, e)
        return 1
    try:
        await stop.wait()
    finally:
        await server.stop()
        log.info("gpumgr webhook stopped")
    return 0
