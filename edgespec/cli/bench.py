"""`edgespec bench`: the command over edgespec.bench (the library does the work)."""

from __future__ import annotations

import json
from typing import Any

import click

from edgespec.bench import (
    BenchError,
    format_report,
    load_prompts_jsonl,
    load_suites,
    plot_format,
    plot_report,
    public_report,
    run_bench,
)
from edgespec.config import DEFAULT_SAMPLING, SamplingParams
from edgespec.config import DrafterKind
from .common import load_engine, model_options


def _suite_names() -> list[str]:
    try:
        return list(load_suites())
    except BenchError:
        return []


_SUITE_NAMES = _suite_names()


@click.command("bench")
@model_options
@click.option("--suite", "suites", multiple=True, type=click.Choice(_SUITE_NAMES) if _SUITE_NAMES else str,
              help="Built-in suite to run (repeatable; default: all, or none with --prompts).")
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False), default=None,
              help='JSONL file, one {"prompt": ...} or {"messages": [...]} per line (optional "suite", "name").')
@click.option("--temperature", "--temp", type=click.FloatRange(min=0), default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-k", type=click.IntRange(min=0), default=DEFAULT_SAMPLING.top_k, show_default=True)
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=DEFAULT_SAMPLING.top_p, show_default=True)
@click.option("--min-p", type=click.FloatRange(0, 1, max_open=True), default=DEFAULT_SAMPLING.min_p, show_default=True)
@click.option("--max-tokens", "-n", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--seed", type=int, default=None, help="Sampling seed, the same for both sides (a seeded run plans with frozen calibrated costs).")
@click.option("--repeats", "-r", type=click.IntRange(min=1), default=1, show_default=True, help="Runs per prompt and side.")
@click.option("--cold-draft", is_flag=True, help="Count the draft's prompt processing in decode time (as a one-shot generate pays it).")
@click.option("--no-warmup", is_flag=True, help="Skip the unrecorded warm-up generation.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with every prompt and the summaries.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write a plot (PNG, or another format by the suffix), atomically: speedup per prompt and acceptance by position.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines on stderr.")
def bench(**kw: Any) -> None:
    """Benchmark plain vs speculative decoding on prompt suites (same engine, interleaved runs)."""
    suites_opt, prompts_file = kw.pop("suites"), kw.pop("prompts_file")
    as_json, plot_path, quiet = kw.pop("as_json"), kw.pop("plot_path"), kw.pop("quiet")
    if kw["no_draft"]:
        raise click.UsageError("bench compares plain and speculative decoding: --no-draft leaves nothing to compare")
    if plot_path:
        plot_format(plot_path)  # no matplotlib, or a path that cannot take the plot: fails now, not after the benchmark
    selected: dict[str, list[dict[str, Any]]] = {}
    if suites_opt or not prompts_file:
        builtin = load_suites()
        for name in suites_opt or builtin:
            selected[name] = builtin[name]
    if prompts_file:
        for name, entries in load_prompts_jsonl(prompts_file).items():
            selected.setdefault(name, []).extend(entries)
    sampling = SamplingParams(
        temperature=kw.pop("temperature"), top_k=kw.pop("top_k"), top_p=kw.pop("top_p"), min_p=kw.pop("min_p"),
        seed=kw.pop("seed"),
    )
    max_tokens, repeats = kw.pop("max_tokens"), kw.pop("repeats")
    cold_draft, warmup = kw.pop("cold_draft"), not kw.pop("no_warmup")
    progress = None if quiet else (lambda s: click.echo(s, err=True))
    with load_engine(kw, memory=False) as eng:  # nothing remembered from earlier runs (and nothing saved)
        if eng.drafter_kind is DrafterKind.NONE:
            raise click.UsageError("bench needs a drafter: give --draft FILE or --draft ngram")
        report = run_bench(eng, selected, sampling, max_tokens=max_tokens, repeats=repeats, warmup=warmup,
                           cold_draft=cold_draft, progress=progress)
    if as_json:  # the results first: a plot that fails to write must not lose them
        click.echo(json.dumps(public_report(report), ensure_ascii=False))
    else:
        click.echo(format_report(report))
    if plot_path:
        plot_report(report, plot_path)
        if not quiet:
            click.echo(f"plot written to {plot_path}", err=True)


