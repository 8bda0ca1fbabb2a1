"""`gpumgr extender`: the kube-scheduler extender (filter, prioritize, bind) for vcuda resources."""

from __future__ import annotations

import argparse
from typing import Any

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
from gpumgr.dra.config import driver_name_problem
from gpumgr.files.docfile import InputError
from gpumgr.serving.body import (  # the defaults and bounds of Limits; a light module (no aiohttp at import)
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_MAX_BODY,
    DEFAULT_MAX_CONNECTIONS,
    MAX_BODY_BYTES,
    MAX_CONNECTIONS,
    MAX_TIMEOUT,
    MIN_BODY_BYTES,
)

ELECTION_MAX_S = 999_999.0  # what the grammar can write; settings_problem bounds each timing
DRA_CLAIMS = ("auto", "on", "off")  # gpumgr.extender.server.DRA_CLAIMS
DRA_DRIVER = "vgpu.gpumgr.io"
POLICIES = ("binpack", "spread")  # gpumgr.extender.score.POLICIES, without importing it at start-up
DEFAULT_SCHEDULER = "gpumgr-scheduler"  # gpumgr.extender.binder.DEFAULT_SCHEDULER
AUTH_FLAGS = "--tls-cert-file, --tls-key-file and --client-ca-file"
# gpumgr.extender.leader's defaults, without importing it at start-up
LEASE_NAME, LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = "gpumgr-extender", "15", "10", "2"
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
MAX_NAME = 253
# An RFC 1123 subdomain, as the API server checks object names (the same rule as gpumgr.sim.kubeapi.objects).
DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
READY_TIMEOUT = 600.0  # seconds for the first list of nodes and pods before giving up


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("extender", help="run the scheduler extender (filter, prioritize, bind)",
                       description="HTTP scheduler extender for tencent.com/vcuda-core and vcuda-memory. Every "
                       "flag can also be set with the environment variable GPUMGR_<FLAG> (e.g. GPUMGR_POLICY).")
    p.add_argument("--listen", default=env_default("--listen", "0.0.0.0:3456"), metavar="HOST:PORT",
                   help="address to serve on (default 0.0.0.0:3456)")
    p.add_argument("--url-prefix", default=env_default("--url-prefix", "/gpumgr"), metavar="PATH",
                   help="path prefix of the verbs: <prefix>/filter, /prioritize, /bind (default /gpumgr)")
    p.add_argument("--kubeconfig", default=env_default("--kubeconfig", ""), metavar="FILE",
                   help="kubeconfig of the API server (default: the in-cluster service account)")
    p.add_argument("--policy", default=env_default("--policy", "binpack"),
                   help="prioritize: binpack (fuller cards and nodes first, the default) or spread")
    p.add_argument("--log-level", default=env_default("--log-level", "info"), help="debug, info, warning, error")
    p.add_argument("--tls-cert-file", default=env_default("--tls-cert-file", ""), metavar="FILE",
                   help="serve HTTPS with this certificate (PEM); needs --tls-key-file")
    p.add_argument("--tls-key-file", default=env_default("--tls-key-file", ""), metavar="FILE",
                   help="private key (PEM) of --tls-cert-file")
    p.add_argument("--client-ca-file", default=env_default("--client-ca-file", ""), metavar="FILE",
                   help="require a client certificate signed by this CA (PEM) on every connection")
    p.add_argument("--insecure-serve-without-auth", action="store_true",
                   default=env_flag("--insecure-serve-without-auth"),
                   help="serve without client certificates (plain HTTP unless --tls-cert-file): anyone who can "
                   "reach the port can bind pods; demos and tests only. Logged as a warning")
    p.add_argument("--scheduler-name", default=env_default("--scheduler-name", DEFAULT_SCHEDULER), metavar="NAME",
                   help=f"bind only pods whose spec.schedulerName is NAME (default {DEFAULT_SCHEDULER})")
    p.add_argument("--max-body-bytes", default=env_default("--max-body-bytes", str(DEFAULT_MAX_BODY)), metavar="N",
                   help=f"largest request body, after decompression, {MIN_BODY_BYTES} to {MAX_BODY_BYTES} (64 MiB) "
                   f"(default {DEFAULT_MAX_BODY}: 1 MiB)")
    p.add_argument("--memory-limit-bytes", default=env_default("--memory-limit-bytes", "0"), metavar="N",
                   help=MEMORY_LIMIT_HELP + "; a --max-body-bytes that cannot fit in it is refused")
    p.add_argument("--header-timeout", default=env_default("--header-timeout", str(DEFAULT_HEADER_TIMEOUT)),
                   metavar="S", help=f"seconds (at most {MAX_TIMEOUT:g}) for a request's headers, and idle "
                   f"connections (default {DEFAULT_HEADER_TIMEOUT:g})")
    p.add_argument("--body-timeout", default=env_default("--body-timeout", str(DEFAULT_BODY_TIMEOUT)),
                   metavar="S", help=f"seconds (at most {MAX_TIMEOUT:g}) for a request's whole body, and for the "
                   f"caller to take the answer (default {DEFAULT_BODY_TIMEOUT:g})")
    p.add_argument("--max-connections", default=env_default("--max-connections", str(DEFAULT_MAX_CONNECTIONS)),
                   metavar="N", help=f"open connections at once, 1 to {MAX_CONNECTIONS}; more get 503 "
                   f"(default {DEFAULT_MAX_CONNECTIONS})")
    p.add_argument("--probe-listen", default=env_default("--probe-listen", ""), metavar="HOST:PORT",
                   help="also serve /healthz and /readyz (only) on plain HTTP here, for kubelet probes")
    p.add_argument("--leader-elect", action="store_true", default=env_flag("--leader-elect"),
                   help="run as one of several replicas: only the leader of a coordination.k8s.io Lease serves "
                   "and binds, and labels its own pod gpumgr.io/extender-leader=true (POD_NAME, POD_NAMESPACE) "
                   "for the Service to route to it; the others answer 503 until they take over")
    p.add_argument("--leader-elect-lease-name", default=env_default("--leader-elect-lease-name", LEASE_NAME),
                   metavar="NAME", help=f"name of the Lease (default {LEASE_NAME})")
    p.add_argument("--leader-elect-namespace", default=env_default("--leader-elect-namespace", ""), metavar="NS",
                   help="namespace of the Lease (default: the pod's own, from its service account or "
                   "POD_NAMESPACE; else default)")
    p.add_argument("--leader-elect-lease-duration", metavar="S",
                   default=env_default("--leader-elect-lease-duration", LEASE_DURATION),
                   help="whole seconds a standby waits, after the Lease last changed, before it takes over "
                   f"(default {LEASE_DURATION})")
    p.add_argument("--leader-elect-renew-deadline", metavar="S",
                   default=env_default("--leader-elect-renew-deadline", RENEW_DEADLINE),
                   help="seconds the leader may go without renewing before it stops serving and binding; at least "
                   f"1 s less than the lease duration (default {RENEW_DEADLINE})")
    p.add_argument("--leader-elect-retry-period", metavar="S",
                   default=env_default("--leader-elect-retry-period", RETRY_PERIOD),
                   help="seconds between renewals and attempts; the renew deadline is at least 1.2 times it "
                   f"(default {RETRY_PERIOD})")
    p.add_argument("--dra-claims", default=env_default("--dra-claims", "auto"), metavar="auto|on|off",
                   help="count allocated DRA ResourceClaims of --dra-driver-name on the cards (nodes that run "
                   "`gpumgr run --mode both`): auto (the default) watches resource.k8s.io/v1 resourceclaims and "
                   "stops, with one log line, when the API server does not serve them; on keeps retrying; off "
                   "does not watch them")
    p.add_argument("--dra-driver-name", default=env_default("--dra-driver-name", DRA_DRIVER), metavar="NAME",
                   help=f"the DRA driver whose claims are counted (default {DRA_DRIVER}; as `gpumgr run`)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    host, port = parse_listen(args.listen)
    if args.policy not in POLICIES:
        raise InputError(f"--policy {args.policy!r}: expected one of {', '.join(POLICIES)}")
    check_log_level(args.log_level)
    if args.dra_claims not in DRA_CLAIMS:
        raise InputError(f"--dra-claims {args.dra_claims[:40]!r}: expected one of {', '.join(DRA_CLAIMS)}")
    problem = driver_name_problem(args.dra_driver_name)  # the agent's rule: the two must name one driver
    if problem:
        raise InputError(problem)
    if args.kubeconfig:
        from pathlib import Path

        if not Path(args.kubeconfig).is_file():
            raise InputError(f"--kubeconfig {args.kubeconfig}: no such file")
    from gpumgr.extender.server import normalize_prefix

    try:
        prefix = normalize_prefix(args.url_prefix)
    except ValueError as e:
        raise InputError(str(e)) from None
    limits = _limits(args)
    tls = _tls(args)
    election = _election(args)
    probe = parse_listen(args.probe_listen, "--probe-listen") if args.probe_listen else None
    import asyncio

    return asyncio.run(_serve(args, prefix, host, port, limits, tls, probe, election))


def _limits(args: argparse.Namespace) -> Any:
    from gpumgr.serving.body import BodyBudgetError, Limits

    body = whole_flag("--max-body-bytes", args.max_body_bytes, MIN_BODY_BYTES, MAX_BODY_BYTES)
    memory = memory_limit_flag(args.memory_limit_bytes)
    try:
        return Limits(max_body_bytes=body, header_timeout=seconds_flag("--header-timeout", args.header_timeout,
                                                                       MAX_TIMEOUT),
                      body_timeout=seconds_flag("--body-timeout", args.body_timeout, MAX_TIMEOUT),
                      max_connections=whole_flag("--max-connections", args.max_connections, 1, MAX_CONNECTIONS),
                      memory_limit_bytes=memory)
    except BodyBudgetError as e:
        raise InputError(f"--max-body-bytes {body} with --memory-limit-bytes {memory}: {e}") from None


def _election(args: argparse.Namespace) -> Any:
    """The leader election's settings, or None without --leader-elect (its flags are checked either way)."""
    import os
    import re
    import secrets
    import socket

    from gpumgr.extender.leader import ElectionSettings, settings_problem

    times = []
    for flag in ("--leader-elect-lease-duration", "--leader-elect-renew-deadline", "--leader-elect-retry-period"):
        # the grammar here; the ranges (lease 1 to 3600 s, renew under it, retry under renew) in settings_problem
        times.append(seconds_flag(flag, getattr(args, flag[2:].replace("-", "_")), ELECTION_MAX_S, low=0))
    problem = settings_problem(*times)
    if problem:
        raise InputError(problem)
    name = args.leader_elect_lease_name
    if len(name) > MAX_NAME or not re.fullmatch(DNS_SUBDOMAIN, name):
        raise InputError(f"--leader-elect-lease-name {name[:60]!r}: expected a lowercase DNS name")
    if args.leader_elect_namespace and not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?",
                                                        args.leader_elect_namespace):
        raise InputError(f"--leader-elect-namespace {args.leader_elect_namespace[:70]!r}: expected a namespace name")
    if not args.leader_elect:
        return None
    namespace = args.leader_elect_namespace or _own_namespace()
    if len(namespace) > 63 or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", namespace):
        raise InputError(f"--leader-elect-namespace {namespace[:70]!r}: expected a namespace name")
    # Unique even when two processes share a pod name (a restart): the suffix is per process.
    base = os.environ.get("POD_NAME", "").strip() or socket.gethostname()
    identity = f"{base[:200]}_{secrets.token_hex(4)}"
    return ElectionSettings(identity=identity, namespace=namespace, lease_name=name, lease_duration=times[0],
                            renew_deadline=times[1], retry_period=times[2])


def _own_namespace() -> str:
    import os
    from pathlib import Path

    try:
        text = Path(SA_NAMESPACE_FILE).read_text().strip()
    except OSError:
        text = ""
    return text or os.environ.get("POD_NAMESPACE", "").strip() or "default"


def _tls(args: argparse.Namespace) -> Any:
    """The server's SSL context, or None (only with --insecure-serve-without-auth)."""
    cert, key, ca = args.tls_cert_file, args.tls_key_file, args.client_ca_file
    if bool(cert) != bool(key):
        raise InputError("--tls-cert-file and --tls-key-file go together")
    if not args.insecure_serve_without_auth and not (cert and ca):
        raise InputError(f"refusing to serve without client authentication: give {AUTH_FLAGS} "
                         "(or --insecure-serve-without-auth for a demo or a test)")
    if ca and not cert:
        raise InputError("--client-ca-file needs --tls-cert-file and --tls-key-file")
    if not cert:
        return None
    from gpumgr.serving.tls import TlsSettingsError, server_context

    try:
        return server_context(cert, key, ca)
    except TlsSettingsError as e:
        raise InputError(str(e)) from None


async def _serve(args: argparse.Namespace, prefix: str, host: str, port: int, limits: Any, tls: Any,
                 probe: tuple[str, int] | None, election: Any) -> int:
    import asyncio
    import logging

    from gpumgr.extender.server import ExtenderServer

    log = logging.getLogger("gpumgr.extender")
    kubeconfig = args.kubeconfig
    server = ExtenderServer(kubeconfig, policy=args.policy, prefix=prefix, limits=limits, tls=tls,
                            insecure=args.insecure_serve_without_auth, scheduler_name=args.scheduler_name,
                            probe=probe, election=election, dra_claims=args.dra_claims,
                            dra_driver=args.dra_driver_name)
    stop = stop_on_signals()
    try:
        await server.start(host, port)
    except OSError as e:
        log.error("cannot listen on %s:%d: %s", host, port, e)
        await server.stop()
        return 1
    except Exception as e:  # noqa: BLE001 - a kubeconfig the client cannot use, no service account, ...
        hint = "" if kubeconfig else " (outside a cluster, give --kubeconfig)"
        log.error("cannot start the extender: %s: %s%s", type(e).__name__, e, hint)
        await server.stop()
        return 1
    try:
        waiter = asyncio.ensure_future(server.wait_ready(READY_TIMEOUT))
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if waiter.done() and waiter.exception() is None:
            log.info("cluster view synced: %d nodes", len(server.view.nodes))
        elif waiter.done():
            log.error("no list of nodes, pods (and claims) within %.0f s; is the API server reachable?", READY_TIMEOUT)
            stopper.cancel()
            return 1
        else:
            waiter.cancel()
        await stopper
    finally:
        await server.stop()
        log.info("gpumgr extender stopped")
    return 0
