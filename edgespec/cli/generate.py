"""`edgespec generate PROMPT`: one generation, text to stdout, a stats line to stderr."""

from __future__ import annotations

import json
import signal
from typing import Any

import click

from ..stats import summary_line
from .common import load_engine, make_sampling, model_options, out, read_stdin_text, sampling_options


@click.command()
@click.argument("prompt", required=False)
@model_options
@sampling_options
@click.option("--chat/--raw", default=True, show_default=True, help="Apply the model's chat template, or send the prompt as is.")
@click.option("--system", default=None, help="System message (with --chat).")
@click.option("--max-tokens", "-n", type=click.IntRange(1, 1 << 20), default=256, show_default=True)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--json", "as_json", is_flag=True, help='Print one JSON object {"text", "token_ids", "finish_reason", "stats"}.')
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
    sampling = make_sampling(kw)
    chat, system, max_tokens = kw.pop("chat"), kw.pop("system"), kw.pop("max_tokens")
    stop, as_json = kw.pop("stop"), kw.pop("as_json")
    if system is not None and not chat:
        click.echo("note: --system is ignored with --raw (the prompt is sent as is; --chat applies the template and the system message)",
                   err=True)
    with load_engine(kw) as eng:
        if chat:
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
            gen = eng.stream(messages=messages, sampling=sampling, max_tokens=max_tokens, stop=stop)
        else:
            gen = eng.stream(prompt, sampling=sampling, max_tokens=max_tokens, stop=stop)
        # Ctrl-C: cancel the generation (the engine stops within a cycle or a prefill chunk), then leave with 130
        interrupted = []

        def on_sigint(signum: int, frame: Any) -> None:
            interrupted.append(True)
            gen.cancel()

        old = signal.signal(signal.SIGINT, on_sigint)
        try:
            if as_json:
                r = gen.result()
                if not interrupted:
                    out(json.dumps(r.as_dict(), ensure_ascii=False))
            else:
                for chunk in gen:
                    out(chunk.text, nl=False)
                gen.wait()
                out("")
        finally:
            signal.signal(signal.SIGINT, old)
        out(summary_line(gen.stats), err=True)
        if interrupted:
            raise KeyboardInterrupt
