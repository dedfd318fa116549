#!/usr/bin/env python3
"""Write docs/cli.md from the commands' own --help (the reference cannot drift: tests/base/test_docs.py fails when the
file differs from what this script would write).

    .venv/bin/python scripts/gen_cli_docs.py           # rewrite docs/cli.md
    .venv/bin/python scripts/gen_cli_docs.py --check   # exit 1 if it is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "cli.md"


def _walk(cmd: click.Command, path: list[str]) -> list[tuple[list[str], click.Command]]:
    out = [(path, cmd)]
    if isinstance(cmd, click.Group):
        for name in sorted(cmd.commands):
            out += _walk(cmd.commands[name], path + [name])
    return out


def render() -> str:
    sys.path.insert(0, str(ROOT))
    from edgespec.cli import main

    parts = [
        "# CLI reference",
        "",
        "Generated from the commands' `--help` by `scripts/gen_cli_docs.py` (`make docs`); a test fails when it drifts.",
        "",
    ]
    for path, cmd in _walk(main, ["edgespec"]):
        ctx = click.Context(cmd, info_name=" ".join(path), terminal_width=100, max_content_width=100)
        parts += [f"## {' '.join(path)}", "", "```text", cmd.get_help(ctx).rstrip(), "```", ""]
    return "\n".join(parts)


def main() -> int:
    text = render()
    if "--check" in sys.argv[1:]:
        current = OUT.read_text(encoding="utf-8") if OUT.exists() else ""
        if current != text:
            print(f"{OUT.relative_to(ROOT)} is out of date: run `make docs`", file=sys.stderr)
            return 1
        return 0
    from edgespec.fsutil import atomic_write_text

    OUT.parent.mkdir(exist_ok=True)
    atomic_write_text(OUT, text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
