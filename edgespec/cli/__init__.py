"""`edgespec` command line: a thin layer over the library.

Exit codes: 0 success; 1 an error with a one-line message (bad model file, missing model, incompatible pair, bad
setting); 2 a usage error (unknown option, bad value type); 130 interrupted with Ctrl-C.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from .. import __version__
from .common import (  # noqa: F401  (re-exported for library users and older imports)
    DRAFT_ENV,
    TARGET_ENV,
    load_engine,
    make_sampling,
    model_options,
    sampling_options,
    stats_line,
)
from ..config import EdgespecError


class Group(click.Group):
    """Turns library errors into one line on stderr and exit code 1, Ctrl-C into 130: never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except EdgespecError as e:
            raise click.ClickException(str(e)) from None
        except KeyboardInterrupt:
            click.echo("\ninterrupted", err=True)
            ctx.exit(130)
        except BrokenPipeError:  # `edgespec generate ... | head`
            sys.stderr.close()
            ctx.exit(0)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", "-V", prog_name="edgespec")
def main() -> None:
    """edgespec: exact speculative decoding for local GGUF models (llama.cpp backend).

    A small draft model (or an n-gram lookup) proposes tokens, the target verifies them in one batched pass, and
    an exact acceptance rule keeps the output distribution identical to the target's alone.

    Models: --target/--draft take a GGUF path or a known pair name; defaults come from $EDGESPEC_TARGET and
    $EDGESPEC_DRAFT, else the default pair in the model cache (`edgespec models pull`).
    """


# --------------------------------------------------------------------------------------------- commands
@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def info(files: tuple[str, ...], as_json: bool) -> None:
    """Describe a GGUF file; with two (TARGET DRAFT), say whether they can be paired."""
    from ..gguf_check import check_pair, inspect_gguf

    if len(files) > 2:
        raise click.UsageError("give one file, or two (target then draft)")
    infos = [inspect_gguf(f) for f in files]
    out: dict[str, Any] = {"files": [i.summary() for i in infos]}
    if len(infos) == 2:
        c = check_pair(infos[0], infos[1])
        out["compatible"] = c.ok
        out["problems"] = list(c.problems)
    if as_json:
        click.echo(json.dumps(out, indent=2))
    else:
        for i in infos:
            s = i.summary()
            click.echo(f"{s['path']}")
            click.echo(f"  name          {s['name']}")
            click.echo(f"  architecture  {s['architecture']}")
            click.echo(f"  parameters    {s['parameters'] / 1e9:.3f} B ({s['parameters']:,})")
            click.echo(f"  quantization  {s['quantization']}  ({', '.join(f'{k}×{v}' for k, v in sorted(s['tensor_types'].items()))})")
            click.echo(f"  file size     {s['file_size'] / 2**20:.1f} MiB")
            click.echo(f"  context       {s['context_length']}")
            click.echo(f"  vocabulary    {s['vocab_size']} tokens ({s['tokenizer']}, pre {s['tokenizer_pre']}), bos {s['bos_token_id']}, eos {s['eos_token_id']}, add_bos {s['add_bos_token']}")
            click.echo(f"  chat template {'yes' if s['chat_template'] else 'no (ChatML fallback)'}")
        if len(infos) == 2:
            click.echo("pair: " + ("compatible" if out["compatible"] else "INCOMPATIBLE: " + "; ".join(out["problems"])))
    if len(infos) == 2 and not out["compatible"]:
        sys.exit(1)


@main.command()
@click.argument("prompt", required=False)
@model_options
@sampling_options
@click.option("--chat/--raw", default=True, show_default=True, help="Apply the model's chat template, or send the prompt as is.")
@click.option("--system", default=None, help="System message (with --chat).")
@click.option("--max-tokens", "-n", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--json", "as_json", is_flag=True, help='Print one JSON object {"text", "token_ids", "stats"}.')
def generate(prompt: str | None, **kw: Any) -> None:
    """Generate text for PROMPT (or '-' / nothing to read it from stdin)."""
    if prompt is None or prompt == "-":
        if sys.stdin.isatty() and prompt is None:
            raise click.UsageError("give a PROMPT or pipe one on stdin")
        prompt = sys.stdin.read()
    if not prompt.strip():
        raise click.UsageError("the prompt is empty")
    sampling = make_sampling(kw)
    chat, system, max_tokens = kw.pop("chat"), kw.pop("system"), kw.pop("max_tokens")
    stop, as_json = kw.pop("stop"), kw.pop("as_json")
    with load_engine(kw) as eng:
        if chat:
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
            gen = eng.stream(messages=messages, sampling=sampling, max_tokens=max_tokens, stop=stop)
        else:
            gen = eng.stream(prompt, sampling=sampling, max_tokens=max_tokens, stop=stop)
        if as_json:
            r = gen.result()
            d = r.as_dict()
            d["controller"] = eng.last_controller_stats
            click.echo(json.dumps(d, ensure_ascii=False))
        else:
            for chunk in gen:
                click.echo(chunk.text, nl=False)
                sys.stdout.flush()
            click.echo("")
        click.echo(stats_line(gen.stats), err=True)


from .bench import bench  # noqa: E402
from .chat import chat  # noqa: E402
from .models import models  # noqa: E402

main.add_command(models)
main.add_command(chat)
main.add_command(bench)
