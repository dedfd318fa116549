"""Documentation that must not drift from the code: the CLI reference is the commands' own --help, and the README
stays a short page for users."""

from __future__ import annotations

import subprocess
import sys

from support import ROOT


def test_cli_reference_matches_the_help():
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_cli_docs.py"), "--check"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def test_readme_is_short_and_starts_with_the_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.encode()) < 12 * 1024
    head = text.split("```", 2)[1]
    assert "make demo" in head and "make test" in head
    for link in ("docs/cli.md", "docs/design.md", "docs/benchmarks.md"):
        assert link in text and (ROOT / link).exists(), link


def test_the_desktop_app_example_runs(tmp_path):
    env = {**__import__("os").environ, "EDGESPEC_CACHE_DIR": str(tmp_path)}
    p = subprocess.run([sys.executable, str(ROOT / "docs" / "examples" / "desktop_app.py")], capture_output=True, text=True,
                       timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 3 and all("finish reason interrupted" in ln for ln in lines)
    third = lines[2]
    decoded = int(third.split("of which ")[1].split()[0])
    prompt = int(third.split("prompt ")[1].split()[0])
    assert decoded < prompt / 2  # tab A came back: its cache was restored, only the new message decoded


def test_the_module_map_names_every_module_and_only_modules():
    """docs/design.md's module map: every module of edgespec/ has a row, and every row's first column names files that
    exist. Modules of a wing are named `wing/NAME.py` (a wing's __init__.py only where it holds more than its
    docstring); cli/ and models/ are described at their folder."""
    import ast
    import re

    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    table = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    named = set()
    for line in table.splitlines():
        cells = line.split("|")
        if len(cells) > 2:
            named |= set(re.findall(r"`([\w./]+(?:\.py|/))`", cells[1]))
    pkg = ROOT / "edgespec"
    present = {p.name for p in pkg.glob("*.py") if not p.name.startswith("__")}
    for wing in sorted(p for p in pkg.iterdir() if (p / "__init__.py").exists()):
        if wing.name in ("cli", "models"):
            present.add(wing.name + "/")
            continue
        for p in wing.glob("*.py"):
            if p.name == "__init__.py" and len(ast.parse(p.read_text(encoding="utf-8")).body) <= 1:
                continue
            present.add(f"{wing.name}/{p.name}")
    assert present - named == set(), f"modules missing from docs/design.md's map: {sorted(present - named)}"
    assert named - present == set(), f"docs/design.md's map names what is not there: {sorted(named - present)}"
