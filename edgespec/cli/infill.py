"""`edgespec infill FILE`: fill in the code at a cursor marker (fill-in-the-middle), the middle to stdout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from edgespec.errors import EdgespecError
from edgespec.runtime.request import InfillPrompt
from .common import print_generation, read_corpus_file, load_engine, make_request, model_options, read_stdin_text, sampling_options

MARKER = "<CURSOR>"


@click.command()
@click.argument("file", required=False)
@click.option("--marker", default=MARKER, show_default=True, help="The text in FILE that marks the cursor.")
@click.option("--prefix", default=None, help="The code before the cursor (instead of FILE).")
@click.option("--suffix", default=None, help="The code after the cursor (with --prefix).")
@click.option("--extra", "extra", multiple=True, type=click.Path(exists=True, dir_okay=False), metavar="PATH",
              help="Another file given as context (repeatable); drafting copies from it too.")
@model_options
@sampling_options
@click.option("--max-tokens", "-n", type=click.IntRange(1, 1 << 20), default=256, show_default=True)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--json", "as_json", is_flag=True, help='Print one JSON object {"text", "token_ids", "finish_reason", "stats"}.')
def infill(file: str | None, **kw: Any) -> None:
    """Write the code that belongs at the cursor MARKER in FILE ('-': stdin), or between --prefix and --suffix.

    The model must know fill-in-the-middle (e.g. Qwen2.5-Coder); the code after the cursor and the --extra files
    are lookup material for drafting. Ctrl-C stops within one cycle and exits with 130."""
    marker, prefix, suffix, extra = kw.pop("marker"), kw.pop("prefix"), kw.pop("suffix"), kw.pop("extra")
    if file is not None and (prefix is not None or suffix is not None):
        raise click.UsageError("give FILE or --prefix/--suffix, not both")
    if file is None and prefix is None:
        raise click.UsageError("give a FILE with a cursor marker, or --prefix (and --suffix)")
    if file is not None:
        if file == "-":
            text = read_stdin_text()
        else:
            try:
                text = read_corpus_file(Path(file))
            except EdgespecError as e:
                raise click.UsageError(str(e).replace("lookup corpus", "file")) from None
        if not marker or text.count(marker) != 1:
            raise click.UsageError(f"FILE must contain the cursor marker {marker!r} exactly once (found {text.count(marker) if marker else 0})")
        prefix, suffix = text.split(marker)
    chunks = tuple((p, read_corpus_file(Path(p))) for p in extra)
    request = make_request(kw, infill=InfillPrompt(prefix or "", suffix or "", extra=chunks))
    as_json = kw.pop("as_json")
    with load_engine(kw) as eng:
        print_generation(eng.start(request), as_json)
