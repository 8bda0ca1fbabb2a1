"""The layout of gpumgr/ stays a map (docs/architecture.md): no import circle between its modules, and no new module
at the top of the package (each part has its folder).

Imports are read from the source (ast), every one of them: at the top, inside functions and under
`if TYPE_CHECKING:`, since a circle hidden in a function is still a circle a reader has to untangle. An import of
`gpumgr.a.b` counts as an edge to `gpumgr.a.b` only, not to the package `gpumgr.a` that Python runs first."""

from __future__ import annotations

import ast
from pathlib import Path

import gpumgr

ROOT = Path(gpumgr.__file__).parent
# the only modules that may sit at the top of gpumgr/: the package, the command line, and the demo
TOP_ALLOWED = {"__init__", "cli", "demo"}


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (by name, resolved to a module where one exists)."""
    files = {module_name(root, p): p for p in sorted(root.rglob("*.py"))}
    top = root.name

    def resolve(name: str) -> str | None:
        while name:
            if name in files:
                return name
            name = name.rpartition(".")[0]
        return None

    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            for t in targets:
                if t == top or t.startswith(top + "."):
                    found = resolve(t)
                    if found is not None and found != mod:
                        edges.add(found)
        graph[mod] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_between_modules_of_gpumgr():
    graph = import_graph(ROOT)
    assert len(graph) > 100  # the whole package was read
    assert circles(graph) == []


def test_the_top_of_gpumgr_holds_only_the_allowed_modules():
    top = {p.stem for p in ROOT.glob("*.py")}
    extra = sorted(top - TOP_ALLOWED)
    assert extra == [], (f"modules at the top of gpumgr/: {extra}; put each in the package of the part it serves "
                         "(docs/architecture.md)")


def test_a_circle_is_found_also_through_a_function_level_or_type_checking_import(tmp_path: Path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from pkg.sub.c import g\n")
    (pkg / "sub" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n")
    (pkg / "d.py").write_text("from . import a\nfrom .sub import b\n")  # into the circle, not part of it
    assert circles(import_graph(pkg)) == [["pkg.a", "pkg.sub.b", "pkg.sub.c"]]
    (pkg / "sub" / "c.py").write_text("import pkg.d\n")  # d -> a -> b -> c -> d
    assert circles(import_graph(pkg)) == [["pkg.a", "pkg.d", "pkg.sub.b", "pkg.sub.c"]]
