"""The server's layout (issue 33): the route modules are translations over one core, with no import circle between
the modules of edgespec/server and no private name used across them (read from the source, without importing it)."""

from __future__ import annotations

import ast
from pathlib import Path

import edgespec.server

PKG = Path(edgespec.server.__file__).parent


def _modules() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(PKG.glob("*.py"))}


def _imports(tree: ast.Module) -> list[tuple[str, list[str]]]:
    """(server module imported, the names taken from it) for each relative import of a sibling, wherever it stands."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [a.name for a in node.names]
            if node.module:
                out.append((node.module.split(".")[0], names))
            else:  # from . import a, b
                out.extend((n, []) for n in names)
    return out


def test_no_import_circle_between_server_modules():
    mods = _modules()
    graph = {m: {dep for dep, _ in _imports(t) if dep in mods} for m, t in mods.items()}
    graph.pop("__init__", None)  # the package imports its modules; none imports the package
    for deps in graph.values():
        deps.discard("__init__")
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        seen[m] = 1
        for d in sorted(graph.get(m, ())):
            assert seen.get(d) != 1, "import circle: " + " -> ".join(path + [m, d])
            if d not in seen:
                visit(d, path + [m])
        seen[m] = 2

    for m in sorted(graph):
        if m not in seen:
            visit(m, [])
    assert "core" in graph and not graph["core"] & {m for m in graph if m.startswith("routes_") or m in ("app", "responses")}


def test_no_private_name_across_server_modules():
    mods = _modules()
    found = []
    for m, tree in mods.items():
        siblings = {dep for dep, names in _imports(tree) if not names} | {n for dep, names in _imports(tree) if dep == "" for n in names}
        for dep, names in _imports(tree):
            found += [f"{m}: from .{dep} import {n}" for n in names if n.startswith("_") and not n.startswith("__")]
        for node in ast.walk(tree):  # module._name on a sibling module imported as a module
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in siblings & set(mods):
                if node.attr.startswith("_") and not node.attr.startswith("__"):
                    found.append(f"{m}: {node.value.id}.{node.attr}")
    assert not found, found


def test_tool_calls_are_read_by_one_parser():
    """Only responses.py reads tool calls out of generated text (structured.parse_tool_calls / ToolCallSplitter)."""
    users = sorted(m for m, tree in _modules().items()
                   if any(isinstance(n, ast.Name) and n.id in ("parse_tool_calls", "ToolCallSplitter") for n in ast.walk(tree)))
    assert users == ["responses"], users
