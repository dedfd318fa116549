"""`edgespec` command line: a thin layer over the library.

Exit codes: 0 success; 1 an error with a one-line message (bad model file, missing model, incompatible pair, bad
setting); 2 a usage error (unknown option, bad value type); 130 interrupted with Ctrl-C.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any, Callable

import click

from . import __version__
from .config import EdgespecError, ModelSpec, SamplingParams, SpecConfig

TARGET_ENV = "EDGESPEC_TARGET"
DRAFT_ENV = "EDGESPEC_DRAFT"


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


# --------------------------------------------------------------------------------------------- shared options
def model_options(f: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--target", "-m", envvar=TARGET_ENV, metavar="FILE|PAIR", help=f"Target GGUF (env {TARGET_ENV}; default: the default pair)."),
        click.option("--draft", "-d", envvar=DRAFT_ENV, metavar="FILE|PAIR|ngram", help=f"Draft GGUF, or 'ngram' for prompt lookup without a draft model (env {DRAFT_ENV})."),
        click.option("--no-draft", is_flag=True, help="Plain decoding with the target alone (same sampling code)."),
        click.option("--drafter", type=click.Choice(["auto", "model", "ngram", "model+ngram"]), default="auto", show_default=True, help="auto = model+ngram with a draft model, ngram without."),
        click.option("--draft-max", type=click.IntRange(0, 64), default=8, show_default=True, help="Most tokens drafted per cycle."),
        click.option("--fixed-k", is_flag=True, help="Always draft --draft-max tokens (no adaptive controller)."),
        click.option("--draft-temperature", type=click.FloatRange(min=0), default=None, help="Draft's own temperature (default: the target's)."),
        click.option("--n-gpu-layers", "-ngl", type=click.IntRange(min=-1), default=0, show_default=True, help="Target layers offloaded to the GPU (-1 = all)."),
        click.option("--draft-gpu-layers", type=click.IntRange(min=-1), default=None, help="Draft layers on the GPU (default: as --n-gpu-layers)."),
        click.option("--threads", "-t", type=click.IntRange(min=1), default=None, help="CPU threads (default: all available cores)."),
        click.option("--ctx", "n_ctx", type=click.IntRange(min=16), default=4096, show_default=True, help="Context window in tokens."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def sampling_options(f: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--temperature", "--temp", type=click.FloatRange(min=0), default=0.8, show_default=True, help="0 = greedy."),
        click.option("--top-k", type=click.IntRange(min=0), default=40, show_default=True, help="0 = off."),
        click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=0.95, show_default=True),
        click.option("--min-p", type=click.FloatRange(0, 1, max_open=True), default=0.05, show_default=True),
        click.option("--repeat-penalty", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True),
        click.option("--presence-penalty", type=float, default=0.0, show_default=True),
        click.option("--frequency-penalty", type=float, default=0.0, show_default=True),
        click.option("--seed", type=int, default=None, help="Random seed (default: fresh each run)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def make_sampling(kw: dict[str, Any]) -> SamplingParams:
    return SamplingParams(
        temperature=kw.pop("temperature"),
        top_k=kw.pop("top_k"),
        top_p=kw.pop("top_p"),
        min_p=kw.pop("min_p"),
        repeat_penalty=kw.pop("repeat_penalty"),
        presence_penalty=kw.pop("presence_penalty"),
        frequency_penalty=kw.pop("frequency_penalty"),
        seed=kw.pop("seed"),
    )


def load_engine(kw: dict[str, Any]) -> Any:
    """Build an Engine from the model options (popped from kw)."""
    from .engine import Engine
    from .models import resolve_model

    target, draft, no_draft = kw.pop("target"), kw.pop("draft"), kw.pop("no_draft")
    drafter = kw.pop("drafter")
    ngl, dgl = kw.pop("n_gpu_layers"), kw.pop("draft_gpu_layers")
    threads, n_ctx = kw.pop("threads"), kw.pop("n_ctx")
    spec = SpecConfig(
        draft_max=kw.pop("draft_max"),
        adaptive=not kw.pop("fixed_k"),
        draft_temperature=kw.pop("draft_temperature"),
    )
    tpath = resolve_model(target, "target")
    dspec = None
    if no_draft:
        drafter = "none"
    elif draft == "ngram":
        drafter = "ngram"
    elif drafter != "ngram":
        # An explicit --target without --draft means: that target, and the default draft only if none was given.
        if draft is None and target is not None and os.environ.get(DRAFT_ENV) is None:
            from .models import ModelsError

            try:
                dpath = resolve_model(None, "draft")
            except ModelsError:
                dpath = None
        else:
            dpath = resolve_model(draft, "draft")
        if dpath is not None:
            dspec = ModelSpec(dpath, n_gpu_layers=ngl if dgl is None else dgl, n_threads=threads, n_ctx=n_ctx)
        elif drafter in ("model", "model+ngram"):
            raise EdgespecError("no draft model: pass --draft FILE, --draft ngram or --no-draft")
        else:
            drafter = "none"
    tspec = ModelSpec(tpath, n_gpu_layers=ngl, n_threads=threads, n_ctx=n_ctx)
    return Engine.load(tspec, dspec, drafter=drafter, spec=spec)


def stats_line(stats: Any) -> str:
    s = stats
    t = s.timings
    parts = [f"{s.n_generated} tokens", f"{s.tokens_per_second:.1f} tok/s"]
    if s.n_drafted:
        parts.append(f"μ {s.mu:.2f} accepted/cycle")
        parts.append(f"acceptance {100 * s.acceptance:.0f}%")
    parts.append(f"draft {t.draft:.2f}s / target {t.target:.2f}s / overhead {t.overhead:.2f}s")
    parts.append(f"prefill {s.n_prefill} tok {t.prefill:.2f}s")
    if s.stop_reason:
        parts.append(f"stop: {s.stop_reason}")
    return " | ".join(parts)


# --------------------------------------------------------------------------------------------- commands
@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def info(files: tuple[str, ...], as_json: bool) -> None:
    """Describe a GGUF file; with two (TARGET DRAFT), say whether they can be paired."""
    from .gguf_check import check_pair, inspect_gguf

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


def _register() -> None:
    from .cli_models import models

    main.add_command(models)
    for mod, name in (("chat_cli", "chat"), ("bench", "bench")):
        try:
            m = __import__(f"edgespec.{mod}", fromlist=[name])
        except ImportError:
            continue
        main.add_command(getattr(m, name if mod != "chat_cli" else "chat"))


_register()


if __name__ == "__main__":  # pragma: no cover
    main()
