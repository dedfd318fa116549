"""The package's wings import only downwards (docs/design.md's module map): every import of an edgespec module,
at the top, inside a function or under TYPE_CHECKING, read from the source with ast."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "edgespec"
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


def _imports(path: Path, module: str) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    pkg = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("edgespec")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("edgespec"):
                continue
            if mod == "edgespec" or node.module is None:  # from edgespec import x / from . import x: x may be a module
                found += [f"{mod}.{a.name}" for a in node.names]
            else:
                found.append(mod)
    return found


def test_imports_go_down_the_wings_only():
    wrong = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
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
