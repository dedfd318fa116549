"""`edgespec generate PROMPT`: one generation, text to stdout, a stats line to stderr."""

from __future__ import annotations

import errno
from typing import Any

import click

from edgespec.decoding.constraint import Constraint
from edgespec.fsutil import read_regular_bytes
from .common import print_generation, load_engine, make_request, model_options, read_stdin_text, sampling_options


MAX_CONSTRAINT_FILE = 16 * 2**20  # a --json-schema or --grammar file (a real 5 MB schema fits)


@click.command()
@click.argument("prompt", required=False)
@model_options
@sampling_options
@click.option("--chat/--raw", default=True, show_default=True, help="Apply the model's chat template, or send the prompt as is.")
@click.option("--system", default=None, help="System message (with --chat).")
@click.option("--max-tokens", "-n", type=click.IntRange(1, 1 << 20), default=256, show_default=True)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--json", "as_json", is_flag=True, help='Print one JSON object {"text", "token_ids", "finish_reason", "stats"}.')
@click.option("--json-schema", "json_schema", type=click.Path(dir_okay=False), metavar="FILE",
              help=f"Constrain the output to JSON valid for this JSON Schema file (at most {MAX_CONSTRAINT_FILE // 2**20} MiB).")
@click.option("--json-object", is_flag=True, help="Constrain the output to one JSON object.")
@click.option("--regex", default=None, metavar="REGEX", help="Constrain the output to match this regular expression.")
@click.option("--choice", default=None, metavar="A,B,C", help="Constrain the output to one of these comma-separated strings.")
@click.option("--grammar", type=click.Path(dir_okay=False), metavar="FILE",
              help="Constrain the output to this grammar file (Lark as llguidance reads it, or llama.cpp GBNF; at most "
                   f"{MAX_CONSTRAINT_FILE // 2**20} MiB).")
def generate(prompt: str | None, **kw: Any) -> None:
    """Generate text for PROMPT (or '-' / nothing to read it from stdin).

    Ctrl-C stops the generation within one cycle (or one prefill chunk) and exits with 130."""
    import sys

    if prompt is None or prompt == "-":
        if prompt is None and sys.stdin is not None and sys.stdin.isatty():
            raise click.UsageError("give a PROMPT or pipe one on stdin")
        prompt = read_stdin_text()
    if not prompt.strip():
        raise click.UsageError("the prompt is empty")
    constraint = _constraint(kw)  # before loading: a bad schema costs no model load
    chat, system, as_json = kw.pop("chat"), kw.pop("system"), kw.pop("as_json")
    if system is not None and not chat:
        click.echo("note: --system is ignored with --raw (the prompt is sent as is; --chat applies the template and the system message)",
                   err=True)
    if chat:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        request = make_request(kw, messages=messages, constraint=constraint)
    else:
        request = make_request(kw, prompt=prompt, constraint=constraint)
    with load_engine(kw) as eng:
        gen = eng.start(request)
        # Ctrl-C: cancel the generation (the engine stops within a cycle or a prefill chunk), then leave with 130
        print_generation(gen, as_json)


def _read(path: str, what: str) -> str:
    """A constraint file's text, whole: a regular file (a FIFO or a device is refused before any read, so nothing
    waits for a writer) of at most MAX_CONSTRAINT_FILE bytes of UTF-8; else one clear line."""
    try:
        data = read_regular_bytes(path, MAX_CONSTRAINT_FILE)
    except OSError as e:
        why = e.strerror or str(e)
        if e.errno == errno.EFBIG:
            why = f"larger than {MAX_CONSTRAINT_FILE // 2**20} MiB (the limit)"
        raise click.UsageError(f"cannot read the {what} file {path}: {why}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise click.UsageError(f"cannot read the {what} file {path}: not UTF-8 text (byte {e.start})") from None


def _constraint(kw: dict[str, Any]) -> Constraint | None:
    """The one constraint the options ask for (popped from kw), checked."""
    schema, obj, regex, choice, grammar = (kw.pop(k) for k in ("json_schema", "json_object", "regex", "choice", "grammar"))
    given = [n for n, v in (("--json-schema", schema), ("--json-object", obj), ("--regex", regex), ("--choice", choice), ("--grammar", grammar)) if v]
    if len(given) > 1:
        raise click.UsageError(f"give at most one of {', '.join(given)}")
    if schema:
        return Constraint.json_schema(_read(schema, "JSON schema"))
    if obj:
        return Constraint.json_object()
    if regex is not None:
        return Constraint.regex(regex)
    if choice is not None:
        return Constraint.choice([c for c in choice.split(",") if c])
    if grammar:
        return Constraint.grammar(_read(grammar, "grammar"))
    return None
