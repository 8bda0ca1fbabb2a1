"""`gpumgr webhook`: the mutating admission webhook (schedulerName for GPU pods, refusal of impossible asks)."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING

from gpumgr.commands.common import (
    MEMORY_LIMIT_HELP,
    check_log_level,
    env_default,
    env_flag,
    memory_limit_flag,
    parse_listen,
    seconds_flag,
    stop_on_signals,
    whole_flag,
)
from gpumgr.serving.body import MAX_CONNECTIONS

if TYPE_CHECKING:
    from gpumgr.webhook.server import TlsFiles

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
MAX_CARDS_CEILING = 4096  # --max-cards-per-container: far above any node (a node has at most a few dozen cards)
# --header-timeout: the API server gives a webhook call at most 30 s (timeoutSeconds), so a client that takes
# minutes to send its request head is not the API server; 300 s is ten times that (the extender's bound is 600 s).
MAX_HEADER_TIMEOUT = 300.0


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
    p.add_argument("--probe-listen", default=env_default("--probe-listen", ""), metavar="HOST:PORT",
                   help="also serve /healthz (only) on plain HTTP here, for kubelet probes (they present no client "
                   "certificate, which --client-ca-file requires on --listen)")
    p.add_argument("--scheduler-name", default=env_default("--scheduler-name", "gpumgr-scheduler"), metavar="NAME",
                   help="schedulerName given to GPU pods that name none or default-scheduler "
                   "(default gpumgr-scheduler)")
    p.add_argument("--insecure-http", action="store_true",
                   default=env_flag("--insecure-http"),
                   help="serve plain HTTP without a certificate (tests and demos only; the API server needs HTTPS)")
    p.add_argument("--max-cards-per-container", default=env_default("--max-cards-per-container", "16"), metavar="N",
                   help=f"refuse a container that asks more whole cards than this, 1 to {MAX_CARDS_CEILING} "
                   "(default 16; set it to the most cards any node of the cluster has)")
    p.add_argument("--header-timeout", default=env_default("--header-timeout", "5"), metavar="S",
                   help=f"seconds (at most {MAX_HEADER_TIMEOUT:g}) for a request's TLS handshake and headers, and "
                   "for idle connections (default 5)")
    p.add_argument("--max-connections", default=env_default("--max-connections", "256"), metavar="N",
                   help=f"open connections at once, 1 to {MAX_CONNECTIONS}; more are answered 503 and closed "
                   "(default 256)")
    p.add_argument("--memory-limit-bytes", default=env_default("--memory-limit-bytes", "0"), metavar="N",
                   help=MEMORY_LIMIT_HELP)
    p.add_argument("--log-level", default=env_default("--log-level", "info"), help="debug, info, warning, error")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpumgr.files.docfile import InputError

    host, port = parse_listen(args.listen)
    check_log_level(args.log_level)
    if not _NAME.match(args.scheduler_name or ""):
        raise InputError(f"--scheduler-name {args.scheduler_name!r}: expected a lower-case DNS name "
                         "such as gpumgr-scheduler")
    probe = parse_listen(args.probe_listen, "--probe-listen") if args.probe_listen else None
    limits = _limits(args)
    tls = _tls(args)
    import asyncio

    return asyncio.run(_serve(args.scheduler_name, tls, host, port, limits, probe))


def _limits(args: argparse.Namespace) -> dict[str, float]:
    """WebhookServer keyword arguments from the limit flags; InputError naming the flag otherwise."""
    return {"max_cards": whole_flag("--max-cards-per-container", args.max_cards_per_container, 1, MAX_CARDS_CEILING),
            "header_timeout": seconds_flag("--header-timeout", args.header_timeout, MAX_HEADER_TIMEOUT),
            "max_connections": whole_flag("--max-connections", args.max_connections, 1, MAX_CONNECTIONS),
            "memory_limit_bytes": memory_limit_flag(args.memory_limit_bytes)}


def _tls(args: argparse.Namespace) -> TlsFiles | None:
    """TlsFiles, or None with --insecure-http; InputError naming the flag and file otherwise."""
    import logging
    from pathlib import Path

    from gpumgr.files.docfile import InputError
    from gpumgr.serving.tls import TlsSettingsError
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
    except TlsSettingsError as e:
        raise InputError(f"cannot use {e}") from None
    return tls


async def _serve(scheduler_name: str, tls: TlsFiles | None, host: str, port: int, limits: dict[str, float],
                 probe: tuple[str, int] | None) -> int:
    import logging

    from gpumgr.webhook.server import WebhookServer

    log = logging.getLogger("gpumgr.webhook")
    server = WebhookServer(scheduler_name, tls, header_timeout=limits["header_timeout"],
                           max_connections=int(limits["max_connections"]), max_cards=int(limits["max_cards"]),
                           memory_limit_bytes=int(limits["memory_limit_bytes"]), probe=probe)
    stop = stop_on_signals()
    try:
        await server.start(host, port)
    except OSError as e:
        log.error("cannot listen on %s:%d%s: %s", host, port,
                  f" or {probe[0]}:{probe[1]} (--probe-listen)" if probe else "", e)
        return 1
    try:
        await stop.wait()
    finally:
        await server.stop()
        log.info("gpumgr webhook stopped")
    return 0
