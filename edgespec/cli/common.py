"""Options and helpers shared by the edgespec commands: model and sampling options, engine loading from them,
reading a prompt from stdin, writing to stdout safely. No command is defined here, so every command module can
import it without import cycles."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import click

from edgespec.config import DEFAULT_SAMPLING, MAX_CTX, MAX_SEED, ModelSpec, SamplingParams, SpecConfig, check_rpc_endpoints, check_tensor_split
from edgespec.errors import EdgespecError
from edgespec.fsutil import read_regular_bytes
from edgespec.runtime.request import AUTO, DrafterKind, GenerationRequest, resolve_drafter

TARGET_ENV = "EDGESPEC_TARGET"
DRAFT_ENV = "EDGESPEC_DRAFT"
DETERMINISTIC_ENV = "EDGESPEC_DETERMINISTIC"
MAX_STDIN_BYTES = 64 * 1024 * 1024  # a prompt larger than this is certainly a mistake (a wrong file piped in)


# --------------------------------------------------------------------------------------------- shared options
def model_options(f: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--target", "-m", envvar=TARGET_ENV, metavar="FILE|PAIR|NAME",
                     help=f"Target GGUF: a path, a pair, or a model's name from `edgespec models list` (env {TARGET_ENV}; "
                          "default: the default pair)."),
        click.option("--draft", "-d", envvar=DRAFT_ENV, metavar="FILE|PAIR|NAME|auto|ngram",
                     help="Draft GGUF (a path, a pair or a model's name), 'auto' for the best discovered model that shares the "
                          "target's tokenizer (the default with a --target other than the default pair's), or 'ngram' for "
                          f"prompt lookup without a draft model (env {DRAFT_ENV})."),
        click.option("--no-draft", is_flag=True, help="Plain decoding with the target alone (same sampling code)."),
        click.option("--drafter", type=click.Choice([AUTO] + [k.value for k in DrafterKind if k is not DrafterKind.NONE]), default=AUTO,
                     show_default=True,
                     help="auto = model+ngram with a draft model (the lookup alone where the draft model cannot pay on this hardware); "
                          "with --target and no draft model, the lookup; plain decoding otherwise. suffix = token trees from a memory "
                          "of everything seen (see --lookup-corpus)."),
        click.option("--draft-max", type=click.IntRange(0, 64), default=8, show_default=True,
                     help="Most tokens the draft model drafts per cycle (0 = never speculate)."),
        click.option("--fixed-k", is_flag=True, help="Always draft --draft-max tokens (no adaptive controller), n-gram lookups included."),
        click.option("--draft-temperature", type=click.FloatRange(min=0), default=None, help="Draft's own temperature (default: the target's)."),
        click.option("--n-gpu-layers", "-ngl", type=click.IntRange(min=-1, max=100_000), default=0, show_default=True,
                     help="Target layers offloaded to the GPU (-1 = all)."),
        click.option("--draft-gpu-layers", type=click.IntRange(min=-1, max=100_000), default=None,
                     help="Draft layers on the GPU (default: as --n-gpu-layers)."),
        click.option("--rpc", metavar="HOST:PORT,...", default=None,
                     help="Put the target's layers on these llama.cpp RPC servers (`edgespec rpc-server` on each; "
                          "no authentication: trusted networks only)."),
        click.option("--tensor-split", "tensor_split", metavar="SHARES", default=None,
                     help="The target's layers over its devices in these shares, in device order (the --rpc servers' devices, "
                          "then this machine's GPUs): 3,1 puts three quarters on the first (default: by free memory)."),
        click.option("--draft-rpc", metavar="HOST:PORT,...", default=None,
                     help="RPC servers for the draft's layers (default: the draft runs on this machine)."),
        click.option("--threads", "-t", type=click.IntRange(1, 1024), default=None,
                     help="CPU threads, fixed (default: chosen while running by measured decode speed among all cores, "
                     "one fewer and half: it follows the machine's load)."),
        click.option("--ctx", "n_ctx", type=click.IntRange(16, MAX_CTX), default=4096, show_default=True, help="Context window in tokens."),
        click.option("--lookup-corpus", "lookup_corpus", multiple=True, type=click.Path(exists=True), metavar="PATH",
                     help=f"Files (at most {CORPUS_MAX_FILE // 2**20} MiB each) or folders of text files the suffix drafter may "
                          "copy from (repeatable)."),
        click.option("--no-memory", is_flag=True, help="Suffix drafter: keep the memory of what was seen for this run only."),
        click.option("--deterministic", is_flag=True, envvar=DETERMINISTIC_ENV,
                     help="Batch-invariant decoding: greedy (and seeded) output is token for token plain decoding's, whatever "
                          f"the drafts, slots or threads; slower, chain drafters only (env {DETERMINISTIC_ENV}; docs/determinism.md)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def sampling_options(f: Callable[..., Any]) -> Callable[..., Any]:
    d = DEFAULT_SAMPLING  # the library's default sampling too (llama.cpp's defaults; docs/api.md says why)
    opts = [
        click.option("--temperature", "--temp", type=click.FloatRange(0, 1e6), default=d.temperature, show_default=True,
                     help="0 = greedy. The sampling defaults are llama.cpp's, the library's too (edgespec.DEFAULT_SAMPLING)."),
        click.option("--top-k", type=click.IntRange(min=0), default=d.top_k, show_default=True, help="0 = off."),
        click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=d.top_p, show_default=True),
        click.option("--min-p", type=click.FloatRange(0, 1, max_open=True), default=d.min_p, show_default=True),
        click.option("--repeat-penalty", type=click.FloatRange(1e-6, 1e6), default=d.repeat_penalty, show_default=True),
        click.option("--presence-penalty", type=click.FloatRange(-1e6, 1e6), default=d.presence_penalty, show_default=True),
        click.option("--frequency-penalty", type=click.FloatRange(-1e6, 1e6), default=d.frequency_penalty, show_default=True),
        click.option("--seed", type=click.IntRange(-1, MAX_SEED), default=None, help="Random seed (default or -1: fresh each run)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def make_sampling(kw: dict[str, Any]) -> SamplingParams:
    seed = kw.pop("seed")
    return SamplingParams(
        temperature=kw.pop("temperature"),
        top_k=kw.pop("top_k"),
        top_p=kw.pop("top_p"),
        min_p=kw.pop("min_p"),
        repeat_penalty=kw.pop("repeat_penalty"),
        presence_penalty=kw.pop("presence_penalty"),
        frequency_penalty=kw.pop("frequency_penalty"),
        seed=None if seed is None or seed < 0 else seed,
    )


def make_request(kw: dict[str, Any], **prompt: Any) -> GenerationRequest:
    """The generation request of a command: its prompt (prompt=, messages= or infill=), the sampling options and
    --max-tokens/--stop (popped from kw). Checked now, before any model loads."""
    sampling = make_sampling(kw)
    return GenerationRequest(**prompt, sampling=sampling, max_tokens=kw.pop("max_tokens"), stop=kw.pop("stop"))


def load_engine(kw: dict[str, Any], **engine_kw: Any) -> Any:
    """Build an Engine from the model options (popped from kw)."""
    from edgespec.runtime.engine import Engine
    from edgespec.models import resolve_path

    target, draft, no_draft = kw.pop("target"), kw.pop("draft"), kw.pop("no_draft")
    drafter = kw.pop("drafter")
    ngl, dgl = kw.pop("n_gpu_layers"), kw.pop("draft_gpu_layers")
    threads, n_ctx = kw.pop("threads"), kw.pop("n_ctx")
    rpc, draft_rpc = check_rpc_endpoints(kw.pop("rpc")), check_rpc_endpoints(kw.pop("draft_rpc"))
    tensor_split = check_tensor_split(kw.pop("tensor_split"))
    spec = SpecConfig(
        draft_max=kw.pop("draft_max"),
        adaptive=not kw.pop("fixed_k"),
        draft_temperature=kw.pop("draft_temperature"),
    )
    tpath = resolve_path(target, "target")
    notes: list[str] = []  # said once the engine is ready (an error before it stays one line)
    dspec = None
    if no_draft and drafter != AUTO:
        click.echo(f"note: --no-draft wins over --drafter {drafter}: plain decoding with the target alone", err=True)
    if no_draft:
        drafter = DrafterKind.NONE
    elif draft == DrafterKind.NGRAM:  # --draft ngram: the lookup, not a file
        drafter = DrafterKind.NGRAM
    elif drafter != DrafterKind.NGRAM:
        dpath: Path | None = _choose_draft(target, draft, tpath, notes)
        if dpath is not None:
            dspec = ModelSpec(str(dpath), n_gpu_layers=ngl if dgl is None else dgl, n_threads=threads, n_ctx=n_ctx, rpc=draft_rpc)
        elif drafter != AUTO and DrafterKind(drafter).needs_draft_model:
            raise EdgespecError("no draft model: pass --draft FILE, --draft NAME, --draft ngram or --no-draft")
    # auto: model+ngram with a draft model; an explicit --target without one: the free n-gram lookup
    kind = resolve_drafter(drafter, draft_model=dspec is not None, lookup_without_draft=target is not None)
    if draft_rpc and dspec is None:
        click.echo("note: --draft-rpc is ignored: this run has no draft model", err=True)
    tspec = ModelSpec(str(tpath), n_gpu_layers=ngl, n_threads=threads, n_ctx=n_ctx, rpc=rpc, tensor_split=tensor_split)
    corpus, no_memory = kw.pop("lookup_corpus"), kw.pop("no_memory")
    if (corpus or no_memory) and not kind.uses_tree:
        what = "--lookup-corpus" if corpus else "--no-memory"
        click.echo(f"note: {what} is ignored: only the suffix drafters use a memory (--drafter suffix or model+suffix); "
                   f"this run uses {'plain decoding' if kind is DrafterKind.NONE else f'the {kind} drafter'}", err=True)
        corpus = ()
    engine_kw.setdefault("memory", not no_memory)
    engine_kw["deterministic"] = bool(kw.pop("deterministic"))  # a tree drafter with it: Engine.load's ConfigError, before any weights load
    with _sigint_deferred() as interrupted:  # a Ctrl-C in llama.cpp's log callback would be lost (ctypes drops it)
        eng = Engine.load(tspec, dspec, drafter=kind, spec=spec, **engine_kw)
    try:
        if interrupted:
            raise KeyboardInterrupt
        for path in corpus:
            for f in _corpus_files(path):
                eng.remember(read_corpus_file(f), source=str(f))
    except BaseException:
        eng.close()
        raise
    for note in notes:
        click.echo(note, err=True)
    return eng


def _choose_draft(target: str | None, draft: str | None, tpath: Path, notes: list[str]) -> Path | None:
    """The draft file for --draft `draft` with target `tpath`. An explicit --target without --draft: the default
    pair's draft when the target is the default pair's, else 'auto'. 'auto': the best discovered draft, or none
    (the n-gram lookup); which, in one line added to `notes`."""
    from edgespec.errors import ModelsError
    from edgespec.models import Catalog, resolve_path
    from edgespec.models.catalog import best_of

    if draft is None and target is not None and os.environ.get(DRAFT_ENV) is None:
        try:
            default_target = resolve_path(None, "target")
        except ModelsError:
            default_target = None
        draft = None if default_target is not None and os.path.realpath(default_target) == os.path.realpath(tpath) else AUTO
    if draft is None:  # the default pair's target: its draft, as always (none when it is not in the cache)
        try:
            return resolve_path(None, "draft")
        except ModelsError:
            return None
    if draft != AUTO:
        return resolve_path(draft, "draft")
    cat = Catalog()
    t = cat.find(str(tpath))
    ranked = cat.drafts_for(t)
    best = best_of(ranked)
    shown = os.path.basename(tpath) if t.source == "path" else t.name
    if best is not None:
        notes.append(f"note: --draft auto: {best.name} ({best.source}, expected x{ranked[0][1]:.2f}) drafts for {shown}")
        return best.path
    why = (f"the best, {ranked[0][0].name}, is expected x{ranked[0][1]:.2f} here" if ranked
           else "no model found on this machine shares its tokenizer and is smaller")
    notes.append(f"note: --draft auto: no draft model for {shown} ({why}); using the n-gram lookup")
    return None


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[list[bool]]:
    """Within the block (main thread, default Ctrl-C handling only), Ctrl-C is noted instead of raised; the caller
    raises it after the block. Loading runs C code that calls back into Python, where a KeyboardInterrupt vanishes.
    A second Ctrl-C ends the process at once (by SIGINT: nothing of the user's is being written while loading)."""
    seen: list[bool] = []
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield seen
        return

    def note(signum: int, frame: Any) -> None:
        if seen:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.raise_signal(signal.SIGINT)
        seen.append(True)

    old = signal.signal(signal.SIGINT, note)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, old)


CORPUS_MAX_FILE = 4 * 1024 * 1024
CORPUS_SUFFIXES = {".txt", ".md", ".rst", ".py", ".js", ".ts", ".java", ".c", ".h", ".cpp", ".rs", ".go", ".json", ".yaml", ".yml",
                   ".toml", ".html", ".css", ".sh", ".sql"}


def _corpus_files(path: str) -> list[Path]:
    """A file, or the text files under a folder (by suffix, each at most CORPUS_MAX_FILE bytes; others skipped)."""
    p = Path(path)
    try:
        if not p.is_dir():
            return [p]  # a file named on purpose: checked when read
        return sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in CORPUS_SUFFIXES and f.stat().st_size <= CORPUS_MAX_FILE)
    except OSError as e:
        raise EdgespecError(f"cannot read the lookup corpus {path}: {e.strerror or e}") from None


def read_corpus_file(f: Path) -> str:
    """A corpus file's text: a regular file of at most CORPUS_MAX_FILE bytes, else one clear error."""
    try:
        data = read_regular_bytes(f, CORPUS_MAX_FILE)  # a FIFO is refused before any read: nothing waits for a writer
    except OSError as e:
        if e.errno == errno.EFBIG:
            raise EdgespecError(f"the lookup corpus {f} is larger than {CORPUS_MAX_FILE // 2**20} MiB; "
                                "split it, or point at its folder (larger files there are skipped)") from None
        if e.errno == errno.EINVAL and e.strerror == "not a regular file":
            raise EdgespecError(f"the lookup corpus {f} is not a regular file") from None
        raise EdgespecError(f"cannot read the lookup corpus {f}: {e.strerror or e}") from None
    return data.decode("utf-8", "replace")


# --------------------------------------------------------------------------------------------- stdin / stdout
def read_stdin_text() -> str:
    """All of stdin as text: invalid UTF-8 becomes U+FFFD (never a traceback); a closed or unreadable stdin, or
    more than MAX_STDIN_BYTES, is a one-line error."""
    stream = sys.stdin
    if stream is None:
        raise click.UsageError("no PROMPT given and stdin is closed")
    try:
        raw = stream.buffer.read(MAX_STDIN_BYTES + 1) if hasattr(stream, "buffer") else stream.read(MAX_STDIN_BYTES + 1)
    except (OSError, ValueError) as e:
        raise click.UsageError(f"cannot read the prompt from stdin ({getattr(e, 'strerror', None) or e})") from None
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogateescape")
    if len(raw) > MAX_STDIN_BYTES:
        raise click.UsageError(f"the prompt on stdin is larger than {MAX_STDIN_BYTES // 2**20} MiB")
    return raw.decode("utf-8", "replace")


def print_generation(gen: Any, as_json: bool) -> None:
    """Print a running generation: its text as it comes (or, with as_json, the whole result as JSON), then its stats
    line on stderr. Ctrl-C cancels it (the engine stops within a cycle or a prefill chunk); then KeyboardInterrupt."""
    import json

    from edgespec.stats import summary_line

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


def out(text: str, *, nl: bool = True, err: bool = False) -> None:
    """Write to stdout/stderr and flush: a write error (full disk, closed pipe) surfaces here, not at exit."""
    click.echo(text, nl=nl, err=err)
    (sys.stderr if err else sys.stdout).flush()


__all__ = [
    "TARGET_ENV",
    "DRAFT_ENV",
    "model_options",
    "sampling_options",
    "make_sampling",
    "make_request",
    "load_engine",
    "read_stdin_text",
    "read_corpus_file",
    "out",
]
