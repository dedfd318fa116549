"""Options and helpers shared by the edgespec commands (generate, chat, bench): model and sampling options, engine
loading from them, and the one-line stats summary. No command is defined here, so every command module can import
it without import cycles."""

from __future__ import annotations

import os
from typing import Any, Callable

import click

from ..config import EdgespecError, ModelSpec, SamplingParams, SpecConfig

TARGET_ENV = "EDGESPEC_TARGET"
DRAFT_ENV = "EDGESPEC_DRAFT"


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
    from ..engine import Engine
    from ..models import resolve_model

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
            from ..models import ModelsError

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
