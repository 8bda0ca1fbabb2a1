"""`gpumgr status`: what a running agent holds and uses, read from its `/usage` and `/graph`, as tables."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gpumgr.commands.common import env_default
from gpumgr.files.docfile import InputError

DEFAULT_ADDR = "http://127.0.0.1:5678"


class AgentUnreachable(Exception):
    """The agent did not answer, or answered something that is not its JSON."""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("status", help="show a running agent's cards, holders, usage and free capacity")
    p.add_argument("--addr", default=env_default("--addr", DEFAULT_ADDR), metavar="URL",
                   help=f"the agent's metrics address (env GPUMGR_ADDR; default {DEFAULT_ADDR})")
    p.add_argument("--timeout", type=float, default=5.0, metavar="S", help="seconds to wait for the agent")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    base = agent_url(args.addr)
    if args.timeout <= 0:
        raise InputError(f"--timeout must be positive, got {args.timeout}")
    try:
        usage = fetch_json(base + "/usage", args.timeout)
        graph = fetch_json(base + "/graph", args.timeout)
        if args.format == "json":
            print(json.dumps({"usage": usage, "graph": graph}, indent=1))
        else:
            print(render_status(usage, graph))
    except AgentUnreachable as e:
        print(f"gpumgr status: {e}", file=sys.stderr)
        return 1
    return 0


def agent_url(addr: str) -> str:
    text = addr.strip().rstrip("/")
    if "://" not in text:
        text = "http://" + text
    if not text.startswith("http://") or len(text) <= len("http://"):
        raise InputError(f"--addr {addr!r}: expected http://host:port")
    return text


def fetch_json(url: str, timeout: float) -> dict[str, Any]:
    import http.client
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = resp.read()
    except urllib.error.HTTPError as e:
        raise AgentUnreachable(f"{url} answered HTTP {e.code} {e.reason}") from None
    except (http.client.HTTPException, ValueError) as e:  # a bad address, or a peer that does not speak HTTP
        raise AgentUnreachable(f"cannot talk HTTP to {url}: {type(e).__name__}: {e}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise AgentUnreachable(
            f"cannot reach the agent at {url}: {reason} (is `gpumgr run` up, with --metrics-addr at this address?)"
        ) from None
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise AgentUnreachable(f"{url} did not answer JSON (is this a gpumgr agent?)") from None
    if not isinstance(doc, dict):
        raise AgentUnreachable(f"{url} answered {type(doc).__name__}, expected an object")
    return doc


def render_status(usage: dict[str, Any], graph: dict[str, Any]) -> str:
    try:
        parts = [
            f"Node {usage.get('node', '?')}",
            "",
            cards_table(usage["cards"]) + cordon_note(usage),
            "",
            holders_table(usage["holders"]),
            "",
            tree_table(graph["tree"]),
        ]
        if usage.get("mig"):
            parts += ["", mig_table(usage["mig"])]
    except (KeyError, TypeError, IndexError, ValueError) as e:
        raise AgentUnreachable(f"the agent's answer lacks {e} (agent and CLI versions differ?)") from None
    return "\n".join(parts)


def mig_table(instances: list[dict[str, Any]]) -> str:
    from gpumgr.topology.render import table

    rows: list[tuple[str, ...]] = [("GPU", "MIG PROFILE", "SLICES", "MEMORY", "MIG UUID", "ORIGIN", "HOLDERS")]
    for i in instances:
        start, size = int(i["start"]), int(i["size"])
        rows.append((str(i["card"]), str(i["profile"]), f"{start}-{start + size - 1}", f"{i['memory_mib']} MiB",
                     str(i["uuid"]) or "(being created)", str(i["origin"]), _mig_holders(i)))
    return table(rows)


def _mig_holders(i: dict[str, Any]) -> str:
    """The instance's holders by name (pod or claim when known); a share inside it with its cores and memory."""
    named = {str(h.get("key")): h for h in i.get("held_by") or [] if isinstance(h, dict)}
    out = []
    for key in i.get("holders") or []:
        h = named.get(str(key), {})
        name = str(h.get("holder") or key)
        cores = h.get("cores")
        out.append(f"{name} ({cores}%, {h.get('memory_mib')} MiB)" if isinstance(cores, int) and cores < 100
                   else name)
    return ", ".join(out) or "-"


def cards_table(cards: list[dict[str, Any]]) -> str:
    from gpumgr.topology.render import table

    rows: list[tuple[str, ...]] = [("GPU", "MODEL", "HEALTH", "MODE", "CORES USED", "MEMORY ALLOCATED", "MEMORY USED",
                                    "UTIL", "TEMP", "HOLDERS", "CORDONED")]
    for c in sorted(cards, key=lambda c: int(c["index"])):
        health = "ok" if c["healthy"] else "UNHEALTHY " + ",".join(c.get("unhealthy_reasons") or [])
        rows.append((
            str(c["index"]), str(c["model"]), health.strip(), str(c["mode"]),
            f"{c['allocated_cores']}/100", f"{c['allocated_memory_mib']}/{c['memory_mib']} MiB",
            _opt(c.get("used_memory_mib"), " MiB"), _opt(c.get("utilization"), "%"),
            _opt(c.get("temperature_c"), " C"), str(len(c.get("holders") or [])), _cordoned(c.get("cordoned")),
        ))
    return table(rows)


def cordon_note(usage: dict[str, Any]) -> str:
    """Below the card table: what a cordon means, or why the cordon annotation was not understood."""
    from gpumgr.requests.choices import ANN_CORDON

    error = usage.get("cordon_error")
    if error:
        return (f"\nCORDONED yes on every card: the node annotation {ANN_CORDON} is not understood, so no card takes "
                f"new pods until it is fixed: {str(error)[:300]}")
    if any(c.get("cordoned") is True for c in usage["cards"]):
        return f"\nCORDONED yes: the card takes no new pods ({ANN_CORDON}); its holders keep running"
    return ""


def _cordoned(value: Any) -> str:
    if value is None:
        return "-"  # the agent does not follow the cordon annotation (or predates it)
    return "yes" if value else "no"


def holders_table(holders: list[dict[str, Any]]) -> str:
    from gpumgr.topology.render import table

    if not holders:
        return "No holders."
    rows: list[tuple[str, ...]] = [("NAMESPACE", "POD", "CONTAINER", "GPUS", "CORES", "MEMORY", "VERIFIED", "PIDS",
                                    "MEMORY USED", "UTIL")]
    waiting = False
    for h in sorted(holders, key=_holder_order):
        u = h.get("usage") or {}
        pids = str(len(h["pids"])) if h.get("pids") else "-"
        waiting = waiting or pids == "-"
        rows.append((
            h["namespace"] or "-", h["pod"], h["container"] or "-", ",".join(str(i) for i in h["cards"]),
            str(h["cores"]), f"{h['request_memory_mib']} MiB", "yes" if h["verified"] else "no", pids,
            _opt(u.get("used_memory_mib"), " MiB"), _opt(u.get("utilization"), "%"),
        ))
    note = f"\n{NO_PROCESS}" if waiting else ""
    unenforced = [f"{h['namespace'] or '-'}/{h['pod']}/{h['container'] or '-'} on {uuid}"
                  for h in sorted(holders, key=_holder_order)
                  for uuid, how in sorted((h.get("compute_enforcement") or {}).items()) if how == "none"]
    if unenforced:
        note += f"\n{NOT_ENFORCED}: " + ", ".join(unenforced)
    return table(rows) + note


NOT_ENFORCED = ("compute limit not enforced (a share inside a MIG instance of a card without GPM; its memory is "
                "limited)")
NO_PROCESS = ("PIDS -: no process found yet (the container is not started, or its cgroup was not found); "
              "`--format json` gives the reason in pids_error")


def _holder_order(h: dict[str, Any]) -> tuple[Any, ...]:
    cards = [int(i) for i in h.get("cards") or []]
    return (min(cards, default=-1), cards, str(h.get("namespace") or ""), str(h.get("pod") or ""),
            str(h.get("container") or ""))


def tree_table(tree: dict[str, Any]) -> str:
    from gpumgr.topology.render import table

    rows: list[tuple[str, ...]] = [("GROUP", "GPUS", "FREE WHOLE", "FREE CORES", "FREE MEMORY")]

    def walk(n: dict[str, Any], depth: int) -> None:
        f = n["free"]
        label = "  " * depth + (f"GPU{n['gpus'][0]}" if n["level"] == "GPU" else str(n["level"]))
        if n["level"] == "GPU" and not n.get("card", {}).get("healthy", True):
            label += " (unhealthy)"
        if n["level"] == "GPU" and n.get("card", {}).get("cordoned") is True:
            label += " (cordoned)"
        rows.append((label, ",".join(str(g) for g in n["gpus"]), f"{f['whole_cards']}/{len(n['gpus'])}",
                     str(f["cores"]), f"{f['memory_mib']} MiB"))
        for ch in n["children"]:
            walk(ch, depth + 1)

    walk(tree, 0)
    return table(rows)


def _opt(value: Any, unit: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value}{unit}"
