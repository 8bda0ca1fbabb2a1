"""`gpumgr place`: replay a workload of requests on an empty node and print the choices as JSON, one line per
step and per card (the whole output is one JSON document)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from gpumgr.commands.common import add_node_source, load_inventory
from gpumgr.files.docfile import Doc, load_doc

STEP_KINDS = ("pod", "release", "unhealthy", "healthy", "cordon")
MAX_POD_ANNOTATIONS = 64


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("place", help="replay pod requests on an empty node and print where they land")
    add_node_source(p)
    p.add_argument("--workload", required=True, metavar="W.json",
                   help='{"steps":[{"pod":"a","vcuda_core":200,"vcuda_memory":0},{"release":"a"},...]}; a pod '
                        'step may carry "annotations" (docs/scheduling-choices.md), {"cordon":"1,GPU-..."} sets '
                        'the node\'s cordon')
    p.add_argument("--memory-unit-mib", type=int, default=256, help="MiB per vcuda-memory unit (default 256)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpumgr.files.docfile import InputError

    if args.memory_unit_mib <= 0:
        raise InputError(f"--memory-unit-mib must be positive, got {args.memory_unit_mib}")
    doc = load_doc(args.workload)
    steps = parse_steps(doc)
    inv = load_inventory(args)
    check_cordons(doc, steps, inv.gpus)
    print(compact(replay(inv, steps, args.memory_unit_mib)))
    return 0


def compact(doc: dict[str, Any]) -> str:
    """`{"steps": [...], "cards": [...]}` with one step or card per line, as docs/configuration.md shows it."""
    out = []
    for i, key in enumerate(("steps", "cards")):
        items = [json.dumps(x) for x in doc[key]]
        lead = ("{" if i == 0 else " ") + json.dumps(key) + ": ["
        pad = " " * len(lead)
        body = (",\n" + pad).join(items)
        out.append(lead + body + ("]," if i == 0 else "]}"))
    return "\n".join(out)


def parse_steps(doc: Doc) -> list[dict[str, Any]]:
    data = doc.data
    if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
        raise doc.error((), 'expected an object {"steps": [...]}')
    out = []
    for i, step in enumerate(data["steps"]):
        at = ("steps", i)
        if not isinstance(step, dict):
            raise doc.error(at, "each step must be an object")
        kinds = [k for k in STEP_KINDS if k in step]
        if len(kinds) != 1:
            raise doc.error(at, f"a step needs exactly one of {', '.join(STEP_KINDS)}")
        kind = kinds[0]
        allowed = {"pod", "vcuda_core", "vcuda_memory", "annotations"} if kind == "pod" else {kind}
        extra = sorted(set(step) - allowed)
        if extra:
            raise doc.error((*at, extra[0]), f"unknown key in a {kind} step")
        if kind in ("pod", "release") and (not isinstance(step[kind], str) or not step[kind]):
            raise doc.error((*at, kind), "must be a non-empty string")
        if kind in ("unhealthy", "healthy") and (isinstance(step[kind], bool) or not isinstance(step[kind], int)):
            raise doc.error((*at, kind), "must be a card index (whole number)")
        if kind == "pod":
            for key in ("vcuda_core", "vcuda_memory"):
                v = step.get(key, 0)
                if isinstance(v, bool) or not isinstance(v, int):
                    raise doc.error((*at, key), f"must be a whole number, got {v!r}")
            _check_annotations(doc, at, step.get("annotations", {}))
        if kind == "cordon" and not isinstance(step[kind], str):
            raise doc.error((*at, kind), 'must be the text of the node annotation gpumgr.io/cordoned-gpus, '
                                         'e.g. "1,GPU-..." ("" lifts the cordon)')
        out.append(step)
    return out


def _check_annotations(doc: Doc, at: tuple[str | int, ...], ann: Any) -> None:
    from gpumgr.requests.choices import ChoiceError, pod_choices

    where = (*at, "annotations")
    if not isinstance(ann, dict) or len(ann) > MAX_POD_ANNOTATIONS:
        raise doc.error(where, f"must be an object of at most {MAX_POD_ANNOTATIONS} string annotations")
    for k, v in ann.items():
        if not isinstance(v, str):
            raise doc.error((*where, k), "an annotation value must be a string")
    try:
        pod_choices(ann)
    except ChoiceError as e:
        raise doc.error(where, str(e)) from None


def check_cordons(doc: Doc, steps: list[dict[str, Any]], gpus: Any) -> None:
    """Every cordon step names cards of this node (needs the node, so after `parse_steps`)."""
    from gpumgr.requests.choices import ChoiceError, resolve_cordon

    for i, step in enumerate(doc.data["steps"]):
        if isinstance(step, dict) and "cordon" in step:
            try:
                resolve_cordon(step["cordon"], gpus)
            except ChoiceError as e:
                raise doc.error(("steps", i, "cordon"), str(e)) from None


def replay(inv: Any, steps: list[dict[str, Any]], unit_mib: int) -> dict[str, Any]:
    from gpumgr.allocator import Allocation, InvalidRequest, Ledger, LedgerError, NoFit, Request, choose
    from gpumgr.requests.choices import NO_CORDON, Cordon, allowed_cards, pod_choices, resolve_cordon
    from gpumgr.topology.cost import Topology

    topo = Topology.of(inv)
    ledger = Ledger(g.memory_mib for g in inv.gpus)
    results: list[dict[str, Any]] = []
    cordon = NO_CORDON
    for step in steps:
        if "cordon" in step:
            cordon = Cordon(cards=resolve_cordon(step["cordon"], inv.gpus), text=step["cordon"], error="")
            results.append({"cordon": sorted(cordon.cards)})
        elif "release" in step:
            ledger.release(step["release"])
            results.append({"release": step["release"]})
        elif "unhealthy" in step or "healthy" in step:
            kind = "unhealthy" if "unhealthy" in step else "healthy"
            idx = step[kind]
            try:
                ledger.set_healthy(idx, kind == "healthy")
                results.append({kind: idx})
            except LedgerError as e:
                results.append({kind: idx, "error": str(e)})
        else:
            pod = step["pod"]
            req = Request(cores=step.get("vcuda_core", 0), memory_mib=step.get("vcuda_memory", 0) * unit_mib)
            held = ledger.held_by(pod)
            if held:
                results.append({"pod": pod, "error": f"{pod} already holds cards {list(held.cards)}"})
                continue
            choices = pod_choices(step.get("annotations", {}))
            allowed = allowed_cards(inv.gpus, choices, cordon)
            if not allowed.cards:
                results.append({"pod": pod, "error": f"no card may take {pod}: {allowed.why_none()}"})
                continue
            try:
                placed = choose(topo, ledger, req, allowed.cards if allowed.restricted else None, choices.policy)
                ledger.assign(Allocation(key=pod, cards=placed.cards, cores=req.cores, memory_mib=req.memory_mib))
                results.append({"pod": pod, "gpus": list(placed.cards), "evaluator": placed.evaluator})
            except (InvalidRequest, NoFit, LedgerError) as e:
                note = f"; {allowed.describe()}" if allowed.restricted and isinstance(e, NoFit) else ""
                results.append({"pod": pod, "error": f"{e}{note}"})
    cards = [
        {"index": c.index, "free_cores": c.free_cores, "free_memory_mib": c.free_memory_mib,
         "mode": c.mode, "healthy": c.healthy, **({"cordoned": True} if c.index in cordon.cards else {})}
        for c in ledger.cards
    ]
    return {"steps": results, "cards": cards}
