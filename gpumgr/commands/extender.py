"""`gpumgr extender`: the kube-scheduler extender (filter, prioritize, bind) for vcuda resources."""

from __future__ import annotations

import argparse

from gpumgr.commands.common import env_default

POLICIES = ("binpack", "spread")  # gpumgr.extender.score.POLICIES, without importing it at start-up
LOG_LEVELS = ("debug", "info", "warning", "error")
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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpumgr.docfile import InputError

    host, port = parse_listen(args.listen)
    if args.policy not in POLICIES:
        raise InputError(f"--policy {args.policy!r}: expected one of {', '.join(POLICIES)}")
    if str(args.log_level).lower() not in LOG_LEVELS:
        raise InputError(f"--log-level {args.log_level!r}: expected one of {', '.join(LOG_LEVELS)}")
    if args.kubeconfig:
        from pathlib import Path

        if not Path(args.kubeconfig).is_file():
            raise InputError(f"--kubeconfig {args.kubeconfig}: no such file")
    from gpumgr.extender.server import normalize_prefix

    try:
        prefix = normalize_prefix(args.url_prefix)
    except ValueError as e:
        raise InputError(str(e)) from None
    import asyncio

    return asyncio.run(_serve(args.kubeconfig, args.policy, prefix, host, port))


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT` or `[v6]:PORT` → (host, port); raises InputError naming the flag."""
    from gpumgr.docfile import InputError

    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"--listen {text!r}: expected HOST:PORT with a port from 1 to 65535")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


async def _serve(kubeconfig: str, policy: str, prefix: str, host: str, port: int) -> int:
    import asyncio
    import gc
    import logging
    import signal

    from gpumgr.extender.server import ExtenderServer

    log = logging.getLogger("gpumgr.extender")
    server = ExtenderServer(kubeconfig, policy=policy, prefix=prefix)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
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
            gc.freeze()  # the cluster view is long-lived: keep the collector off it
            log.info("cluster view synced: %d nodes", len(server.view.nodes))
        elif waiter.done():
            log.error("no list of nodes and pods within %.0f s; is the API server reachable?", READY_TIMEOUT)
            stopper.cancel()
            return 1
        else:
            waiter.cancel()
        await stopper
    finally:
        await server.stop()
        log.info("gpumgr extender stopped")
    return 0
