"""The package's structure (docs/design.md's module map), read from the source with ast: the wings import only
downwards (every import: top level, in a function, under TYPE_CHECKING), no import circle, no private name imported
across modules, at most 12 modules at the top level, no module over 600 lines or function over 80, and tests/ in
a folder per wing with its helpers in tests/support/."""

from __future__ import annotations

import ast
from pathlib import Path

from support import ROOT

PKG = ROOT / "edgespec"
BASE = {"config", "errors", "stats", "paths", "fsutil", "untrusted"}
# what each wing may import besides itself and the base modules
MAY_IMPORT = {
    "base": set(),
    "prompts": set(),
    "decoding": {"prompts"},
    "llama": {"prompts", "decoding"},
    "drafting": {"prompts", "decoding"},
    "runtime": {"prompts", "decoding", "llama", "drafting"},
    "models": {"llama"},
    "bench": {"prompts", "decoding", "llama", "drafting", "runtime"},
    "server": {"prompts", "decoding", "llama", "drafting", "runtime", "models"},
    "cli": {"prompts", "decoding", "llama", "drafting", "runtime", "models", "bench", "server"},
}


def _wing(module: str) -> str:
    parts = module.split(".")
    if len(parts) < 2 or parts[1] in ("__main__", "__init__"):
        return "top"
    return "base" if parts[1] in BASE else parts[1]


def _package(path: Path, module: str) -> str:
    """The package a module's relative imports start from."""
    return module if path.name == "__init__.py" else module.rsplit(".", 1)[0]


def _source(node: ast.ImportFrom, pkg: str) -> str:
    """The module a `from ... import` takes its names from, relative imports resolved against `pkg`."""
    if not node.level:
        return node.module or ""
    base = pkg.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(path: Path, module: str) -> list[str]:
    pkg = _package(path, module)
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("edgespec")]
        elif isinstance(node, ast.ImportFrom):
            mod = _source(node, pkg)
            if not mod.startswith("edgespec"):
                continue
            if mod == "edgespec" or node.module is None:  # from edgespec import x / from . import x: x may be a module
                found += [f"{mod}.{a.name}" for a in node.names]
            else:
                found.append(mod)
    return found


def test_imports_go_down_the_wings_only():
    wrong = []
    for module, path in _modules().items():
        wing = _wing(module)
        if wing == "top":  # the package's __init__ (the public API) and __main__
            continue
        allowed = MAY_IMPORT[wing] | {wing, "base"}
        for target in _imports(path, module):
            tw = _wing(target)
            if tw == "top" and target == "edgespec":
                continue
            if tw.startswith("__"):  # from edgespec import __version__
                continue
            if tw not in allowed:
                wrong.append(f"{module} ({wing}) imports {target} ({tw})")
    assert wrong == [], "imports that go up or sideways:\n" + "\n".join(wrong)


def test_the_top_level_is_the_base_and_the_wings():
    modules = sorted(p.stem for p in PKG.glob("*.py"))
    assert len(modules) <= 12, modules
    assert set(modules) == BASE | {"__init__", "__main__"}
    wings = sorted(p.name for p in PKG.iterdir() if (p / "__init__.py").exists())
    assert set(wings) == set(MAY_IMPORT) - {"base"}
    for w in wings:
        doc = ast.get_docstring(ast.parse((PKG / w / "__init__.py").read_text(encoding="utf-8")))
        assert doc and "May import" in doc or w in ("cli", "models", "server", "bench"), f"{w}/__init__.py says what it may import"


def _top_level_imports(path: Path, module: str) -> set[str]:
    """The edgespec modules a module imports when it is imported: its top-level statements (TYPE_CHECKING blocks and
    function bodies excluded), each `from X import name` counted as X.name where that is a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    pkg = _package(path, module)
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for h in getattr(node, "handlers", []):
                    visit(h.body)
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _imports_of(node, pkg):
                    found.add(target)

    visit(tree.body)
    return found


def _imports_of(node: ast.Import | ast.ImportFrom, pkg: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.startswith("edgespec")]
    mod = _source(node, pkg)
    if not mod.startswith("edgespec"):
        return []
    return [mod] + [f"{mod}.{a.name}" for a in node.names]


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        out[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    return out


def test_no_import_circle():
    """No module imports, at import time, a module that imports it back (directly or around a longer circle); a
    package counts as importing its parents' __init__ too, as Python runs them first."""
    mods = _modules()
    graph = {m: {t for t in _top_level_imports(p, m) if t in mods and t != m} for m, p in mods.items()}
    for m in mods:  # importing a.b.c runs a/__init__ and a.b/__init__ first
        parts = m.split(".")
        graph[m] |= {".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in mods and ".".join(parts[:i]) != m}
    graph = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}  # a module's own parents: not a circle
    state: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def walk(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                circles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                walk(t)
        stack.pop()
        state[m] = 2

    for m in sorted(mods):
        if m not in state:
            walk(m)
    assert circles == [], "\n".join(" -> ".join(c) for c in circles)


def test_no_private_name_is_imported_from_another_module():
    mods = _modules()
    wrong = []
    for m, path in mods.items():
        pkg = _package(path, m)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and _imports_of(node, pkg):
                wrong += [f"{m}: {a.name} from {_imports_of(node, pkg)[0]}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert wrong == [], "\n".join(wrong)


MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def test_modules_and_functions_stay_readable():
    """No module of the package over 600 lines, no function over 80 (docstring and comments included)."""
    long_modules, long_functions = [], []
    for m, path in _modules().items():
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > MAX_MODULE_LINES:
            long_modules.append(f"{m}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long_functions.append(f"{m}.{node.name}: {n} lines")
    assert long_modules == [] and long_functions == [], "\n".join(long_modules + long_functions)


def test_the_tests_mirror_the_wings():
    """tests/: a folder per wing (base/ for the base modules and whole-package checks), shared helpers in support/;
    no test imports another test file or puts a folder on sys.path (bench/, research/, scripts/ included)."""
    tests = PKG.parent / "tests"
    wings = set(MAY_IMPORT) - {"base"} | {"base", "support"}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    assert folders <= wings, sorted(folders - wings)
    assert not list(tests.glob("test_*.py")), "test files at the top of tests/"
    wrong = []
    for path in tests.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0].startswith("test_"):
                wrong.append(f"{path.relative_to(tests)} imports {node.module}")
            if isinstance(node, ast.Import) and any(a.name.split(".")[0].startswith("test_") for a in node.names):
                wrong.append(f"{path.relative_to(tests)} imports a test file")
        if "sys.path" in text and path.name != "test_layers.py":
            wrong.append(f"{path.relative_to(tests)} touches sys.path")
    assert wrong == [], "\n".join(wrong)
