"""The public engine: load a target (and a draft) once, then generate from any thread, sync or async.

    from edgespec import Engine, ModelSpec, SamplingParams
    with Engine.load(ModelSpec("target.gguf"), ModelSpec("draft.gguf")) as eng:
        r = eng.generate("Write a haiku", sampling=SamplingParams(temperature=0))
        for chunk in eng.stream(messages=[{"role": "user", "content": "hi"}]):
            print(chunk.text, end="")

One worker thread owns the llama.cpp contexts, which hold `parallel` slots (one sequence each, in each model). `stream()`
queues a generation and returns a `Generation` handle at once: iterate it (or `async for`), `cancel()` it from any
thread (it stops within one speculative cycle, or between prefill chunks), `close()` it, or ask for its `result()`.
Up to `parallel` generations run at once, each in its own slot, advanced cycle by cycle together (generation.Worker):
their verify decodes go to the target in ONE llama_decode where the live cost curve says that costs less than
separate ones (_Slots.execute), each with its own acceptance, sampler, RNG and constraint. A short generation (an
infill, or at most SHORT_TOKENS tokens) is admitted first, takes four turns to a long one's one, and when every slot is
busy it displaces the long generation with the most to go, whose cache is set aside in host memory and restored
after (its output is unchanged). Conversations keep their KV cache: a generation goes to the free slot that already
holds most of its prompt, and a snapshot of what a conversation left is kept in host memory (backend.PromptCache)
and restored when it comes back, so only its new tokens are decoded.

Plain decoding (no draft) goes through the same loop and the same sampling code with no speculator.
"""

from __future__ import annotations

import math
import os
import time
import weakref
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generator, Iterator, Mapping, Sequence

import numpy as np

from edgespec.drafting import calibration as cal
from edgespec.prompts import chat_template
from edgespec.llama import rpc
from edgespec.llama.backend import DecodePart, Model, default_threads
from edgespec.config import DEFAULT_SAMPLING, ModelSpec, SamplingParams, SpecConfig, check_tree_fits
from edgespec.config import MAX_PARALLEL
from edgespec.config import check_int as _check_int
from edgespec.decoding.constraint import Constraint, Matcher
from edgespec.decoding.structured import Tool, constraint_from_response_format, prompt_messages
from edgespec.drafting.costs import VerifyCurve
from edgespec.decoding.detok import StreamingDetokenizer
from edgespec.fsutil import clear_odd_file
from edgespec.errors import BackendError, BackendLostError, ConfigError, ContextFullError, EdgespecError, EngineClosedError
from edgespec.drafting.learning import LearningState
from .generation import Worker, shutdown
from .handle import Generation, Result
from .job import Chunk, Job
from edgespec.llama.gguf_check import inspect_gguf, require_compatible
from edgespec.prompts.infill import FILE_NAME, MAX_EXTRA_CHUNKS, REPO_NAME, ExtraChunk, FimTokens, fim_layout
from .request import AUTO, DrafterKind, GenerationRequest, InfillPrompt, parse_drafter, resolve_drafter
from edgespec.decoding.sampling import PositionalUniforms
from .speculate import Step, Verify, speculate_steps
from edgespec.drafting import KINDS, tree_paths_for
from edgespec.drafting.suffix_index import SuffixIndex
from edgespec.drafting.suffix_index import default_path as suffix_default_path
from edgespec.stats import GenerationStats

DRAFTER_KINDS = KINDS
# A generation of at most this many tokens (or any infill) is short: it is admitted before longer ones, gets four turns
# to their one, and may displace a long one when every slot is busy (an editor's completion, a chat's title).
SHORT_TOKENS = 64
# Slots when the caller does not say (Engine.load parallel=None): at most this many, fewer where the sequences or the
# machine's memory do not allow them (backend.fit_parallel).
DEFAULT_PARALLEL = 4
# Several generations' verify rows go to the target in one llama_decode when the live curve says that takes less than
# this share of their separate decodes (a margin over the curve's noise).
BATCH_GAIN = 0.97
# Costs are measured once, at load (cached per machine), and then learnt from the decodes generation does anyway
# (costs.VerifyCurve follows a change of the machine's load within a few cycles): nothing is measured inside a
# request. The thread count of each model follows the load the same way (threads.py, in the backend).


# --------------------------------------------------------------------------------------------- checks
def _as_spec(m: ModelSpec | str | os.PathLike[str]) -> ModelSpec:
    if isinstance(m, ModelSpec):
        return m
    if not isinstance(m, (str, os.PathLike)):
        raise ConfigError(f"a model must be a path or a ModelSpec, got {type(m).__name__}")
    return ModelSpec(os.fspath(m))


# --------------------------------------------------------------------------------------------- engine

def _shutdown(unhook: Callable[[], None] | None, worker: Worker, models: list[Model], memory: Any, memory_path: str | None) -> None:
    if unhook is not None:
        unhook()  # a lost server no longer concerns this engine
    shutdown(worker, models, memory, memory_path)

class Engine:
    """A loaded target (+ optional draft) and the worker that generates from it (see the module docstring)."""

    def __init__(
        self,
        target: Model,
        draft: Model | None = None,
        *,
        drafter: DrafterKind | str = AUTO,
        spec: SpecConfig | None = None,
        calibration: cal.Calibration | None = None,
        max_queue: int | None = None,
        memory: SuffixIndex | None = None,
        memory_path: str | os.PathLike[str] | None = None,
    ) -> None:
        kind = resolve_drafter(drafter, draft_model=draft is not None)
        if max_queue is not None:
            _check_int("max_queue", max_queue, 1)
        if memory is not None and not isinstance(memory, SuffixIndex):
            raise ConfigError(f"memory must be a SuffixIndex (Engine.load takes a path), got {type(memory).__name__}")
        if memory_path is not None and not isinstance(memory_path, (str, os.PathLike)):
            raise ConfigError(f"memory_path must be a path, got {type(memory_path).__name__}")
        self.target = target
        self.draft = draft
        # the loop samples every row it reads and that checks it (NaN / +inf: the model's BackendError), so the
        # models skip their own pass over each row (one cold read of 151,936 floats a row, after a CPU decode)
        for m in (target, draft):
            if m is not None:
                m.check_logits = False
        self.spec = spec or SpecConfig()
        self.drafter_kind = kind
        if kind.uses_tree and target.tree_paths < self.spec.tree_nodes:
            raise ConfigError(f"drafter '{kind}' needs the target loaded with tree_paths >= {self.spec.tree_nodes}")
        # what the engine learns across generations (learning.LearningState: costs, gate, estimators, guards), with the
        # suffix drafter's memory of everything seen (saved to memory_path when the engine closes)
        if memory is None and kind.uses_tree:
            memory = SuffixIndex(vocab=vocab_fingerprint(target))
        self.learning = LearningState.from_costs({1: 1.0}, memory=memory)
        # costs: a GPU-like flat curve when nothing was measured (tests, fixed setups)
        self.set_calibration(calibration or cal.Calibration({1: 1.0, 64: 1.0}, 0.0, "fixed"))
        self._entropy = np.random.SeedSequence()
        self._specials: list[str] | None = None
        self._max_token_bytes: int | None = None
        self._fim: FimTokens | None = None
        self._closed = False
        self.memory_path = os.fspath(memory_path) if memory_path is not None else None
        if draft is not None and draft.parallel < target.parallel:
            raise ConfigError(f"the draft holds {draft.parallel} slots and the target {target.parallel}: load both with the same parallel")
        self.slots = _Slots(target, draft, self.learning)
        self._worker = Worker(
            max_queue, parallel=target.parallel, execute=self.slots.execute, choose_slot=self.slots.choose,
            park=self.slots.park, unpark=self.slots.unpark,
        )
        models = [m for m in (target, draft) if m is not None]
        self.lost: str | None = None  # why an RPC server this engine runs on is gone (it cannot go on: rpc.lost)
        unhook = None
        if any(m.spec.rpc for m in models):
            me = weakref.ref(self)
            worker = self._worker

            def on_lost(message: str) -> None:  # from the thread that noticed, while the process ends (rpc.lost)
                eng = me()
                if eng is not None:
                    eng.lost = message
                worker.fail_all(BackendLostError(message))

            unhook = rpc.on_lost(on_lost)
        self._finalizer = weakref.finalize(self, _shutdown, unhook, self._worker, models, self.memory, self.memory_path)

    @classmethod
    def load(
        cls,
        target: ModelSpec | str | os.PathLike[str],
        draft: ModelSpec | str | os.PathLike[str] | None = None,
        *,
        drafter: DrafterKind | str = AUTO,
        spec: SpecConfig | None = None,
        calibrate_costs: bool = True,
        prompt_cache_mb: float = 256,
        max_queue: int | None = None,
        memory: str | os.PathLike[str] | bool | None = True,
        parallel: int | None = None,
    ) -> "Engine":
        """Validate both files, check that they share a tokenizer (before any weights load), load them and
        measure decode costs (cached per machine, checked at every load; calibrate_costs=False measures nothing and
        plans with a fixed flat, GPU-like curve: drafting always looks cheap). prompt_cache_mb: host memory for KV
        snapshots of conversations the engine left (0 = none), per model. memory (suffix drafters only): True keeps
        the memory of everything seen in the user cache across runs, a path keeps it there, False/None keeps it in
        this process only. parallel: slots, generations that run at once (None: up to DEFAULT_PARALLEL, as many
        as the sequences and a quarter of the available memory allow); each slot holds a whole context of
        n_ctx tokens in both models (ConfigError at load when their caches cannot fit the machine)."""
        if not isinstance(prompt_cache_mb, (int, float)) or isinstance(prompt_cache_mb, bool) or not (0 <= prompt_cache_mb < math.inf):
            raise ConfigError(f"prompt_cache_mb must be a number >= 0, got {prompt_cache_mb!r}")
        if spec is not None and not isinstance(spec, SpecConfig):
            raise ConfigError("spec must be a SpecConfig")
        if memory is not None and not isinstance(memory, (bool, str, os.PathLike)):
            raise ConfigError(f"memory must be True, False, None or a path, got {type(memory).__name__}")
        if isinstance(memory, (str, os.PathLike)) and not os.fspath(memory):
            raise ConfigError("memory must be a path, got an empty string")
        if not isinstance(calibrate_costs, bool):
            raise ConfigError("calibrate_costs must be True or False")
        if parallel is not None:
            _check_int("parallel", parallel, 1, MAX_PARALLEL)
        choice = drafter if drafter == AUTO else parse_drafter(drafter)
        tspec = _as_spec(target)
        tinfo = inspect_gguf(tspec.path)
        dspec = dinfo = None
        if draft is not None and choice not in (DrafterKind.NGRAM, DrafterKind.NONE):
            dspec = _as_spec(draft)
            dinfo = inspect_gguf(dspec.path)
            require_compatible(tinfo, dinfo)
        cache_bytes = int(prompt_cache_mb * 2**20)
        kind = resolve_drafter(choice, draft_model=dspec is not None)  # before any weights load
        # tree sequences: the suffix drafters' trees, or a draft model's siblings (draft-model trees)
        paths = tree_paths_for(kind, spec or SpecConfig(), dspec is not None, min(tspec.n_batch, tspec.n_ctx))
        if paths:
            check_tree_fits(tspec, paths)  # before any weights load (llama.cpp would abort the process)
        t = Model(tspec, tinfo, prompt_cache_bytes=cache_bytes, tree_paths=paths, parallel=parallel or -DEFAULT_PARALLEL)
        d = None
        try:
            if dspec is not None:
                d = Model(dspec, dinfo, prompt_cache_bytes=cache_bytes, parallel=t.parallel)
            index, where = None, None
            if kind.uses_tree and memory:
                vocab = vocab_fingerprint(t)
                where = suffix_default_path(vocab) if memory is True else Path(os.fspath(memory))
                if memory is not True and os.path.lexists(where) and not where.is_file():
                    raise ConfigError(f"the memory file {where} is not a regular file")  # the user's path: refused
                index = SuffixIndex.load(where, vocab=vocab)  # an empty one when there is no file yet (a warning if bad)
                if memory is True:
                    clear_odd_file(where)  # the cache's own path held a FIFO, a loop, an empty folder: rebuilt at close
            eng = cls(t, d, drafter=kind, spec=spec, max_queue=max_queue, memory=index, memory_path=where)
        except BaseException:
            t.close()
            if d is not None:
                d.close()
            raise
        if calibrate_costs:
            # In the engine's own thread, like every other computation: llama.cpp's CPU backend runs OpenMP, and a
            # second thread that ever computed keeps a second OpenMP pool; with more pool threads than cores,
            # libgomp stops spinning at its barriers and every decode got ~40% slower (measured, docs/benchmarks.md).
            try:
                eng.set_calibration(eng.submit(lambda e: _calibrate(e.target, e.draft)).result())
            except BaseException:
                eng.close()
                raise
        return eng

    def set_calibration(self, calibration: cal.Calibration) -> None:
        """Plan with these measured costs from now on (the live curve starts over from them)."""
        self.calibration = calibration
        # live (every generation refines it, a level shift rescales it) for measured costs; frozen for costs the caller
        # fixed (source "fixed": they are what it plans with, whatever the clock says)
        self.learning.set_costs(calibration.verify, calibration.draft, frozen=calibration.source == "fixed")

    @property
    def memory(self) -> SuffixIndex | None:
        """The suffix drafters' memory of everything seen (None without a suffix drafter)."""
        return self.learning.memory

    @property
    def curve(self) -> VerifyCurve:
        """The target's live verify curve."""
        return self.learning.curve

    @property
    def draft_cost(self) -> float:
        """The draft's seconds per token, as learnt so far."""
        return self.learning.draft_cost

    @property
    def draft_gate_open(self) -> bool:
        """The draft model's hardware gate at the end of the last generation (its hysteresis spans generations)."""
        return self.learning.draft_gate_open

    def close(self) -> None:
        """Stop the worker (a running generation is cancelled, queued ones never start) and free the models."""
        self._closed = True
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _live(self) -> None:
        if self.lost is not None:
            raise BackendLostError(self.lost)
        if self._closed:
            raise EngineClosedError("the engine is closed; load a new one")

    @property
    def pending(self) -> int:
        """Generations waiting for a slot (not counting the ones running)."""
        return self._worker.pending

    @property
    def parallel(self) -> int:
        """Slots: how many generations run at once."""
        return self.target.parallel

    def slot_state(self) -> dict[str, int]:
        """{"parallel": slots, "busy": generating now, "queued": waiting for a slot}."""
        return {"parallel": self.parallel, "busy": self._worker.busy, "queued": self._worker.pending}

    # ----------------------------------------------------------------------------- prompts (any thread)
    @property
    def chat_template(self) -> str | None:
        self._live()
        return self.target.chat_template

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        self._live()
        return chat_template.render(self.chat_template, messages, add_generation_prompt=add_generation_prompt)

    def special_texts(self) -> list[str]:
        """The text of every control token of the vocabulary (computed once)."""
        if self._specials is None:
            self._live()
            ids = self.target.control_tokens()  # EngineClosedError if another thread closed it meanwhile
            self._specials = sorted({self.target.token_bytes(i, special=True).decode("utf-8", "replace") for i in ids} - {""})
        return self._specials

    def max_token_bytes(self) -> int:
        """The most bytes one token of the target's vocabulary stands for (computed once)."""
        if self._max_token_bytes is None:
            self._max_token_bytes = max((len(t.encode("utf-8", "surrogateescape")) for t in self.target.info.tokens), default=0) or 256
        return self._max_token_bytes

    def check_prompt_size(self, n_bytes: int) -> None:
        """ContextFullError, before any tokenization, for a text that cannot fit in the context whatever its tokens:
        no token of the vocabulary stands for more than max_token_bytes bytes. Bounds the memory a huge prompt takes
        (a 32 MB body would be tens of millions of token ids, a Python int each)."""
        limit = self.target.n_ctx * self.max_token_bytes()
        if n_bytes > limit:
            raise ContextFullError(
                f"the prompt is {n_bytes} bytes: far more than a context of {self.target.n_ctx} tokens holds (no token of "
                f"this vocabulary is longer than {self._max_token_bytes} bytes); shorten it or use a larger context"
            )

    def segment_tokens(self, segments: Sequence[tuple[str, bool]], *, add_bos: bool) -> list[int]:
        """Token ids for rendered segments: markup with control tokens parsed, contents as plain text."""
        self._live()
        out: list[int] = []
        for i, (text, is_content) in enumerate(segments):
            out += self.target.tokenize(text, add_special=add_bos and i == 0, parse_special=not is_content)
        if add_bos and not segments:
            out = self.target.tokenize("", add_special=True)
        return out

    def chat_segments(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, tools: Sequence[Tool] = ()
    ) -> list[tuple[str, bool]]:
        """The rendered conversation (chat_template.render_segments). Tools, tool calls and tool results go to the
        model's template where it renders them, else into plain messages (structured.prompt_messages)."""
        self._live()
        template = self.chat_template
        msgs, tool_list = prompt_messages(template, messages, tools) if isinstance(messages, Sequence) else (messages, None)
        return chat_template.render_segments(
            template, msgs, add_generation_prompt=add_generation_prompt, specials=_LazySpecials(self), tools=tool_list
        )

    def prompt_tokens(
        self, prompt: str | None = None, *, messages: Sequence[Mapping[str, Any]] | None = None, tools: Sequence[Tool] = ()
    ) -> list[int]:
        """Token ids for a raw prompt (BOS added if the model wants it; control-token text stays text) or for chat
        messages (rendered with the model's template: the template's markup becomes control tokens, message
        contents never do), with the `tools` offered (structured.check_tools)."""
        self._live()
        if (prompt is None) == (messages is None):
            raise ConfigError("give exactly one of prompt or messages")
        if prompt is not None:
            if not isinstance(prompt, str):
                raise ConfigError(f"prompt must be a string, got {type(prompt).__name__}")
            self.check_prompt_size(len(prompt))  # characters: at most the bytes
            toks = self.target.tokenize(prompt, add_special=True, parse_special=False)
        else:
            if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
                raise ConfigError(f"messages must be a list of {{'role', 'content'}} objects, got {type(messages).__name__}")
            if not messages:
                raise ConfigError("messages must not be empty")
            segments = self.chat_segments(messages, tools=tools)
            self.check_prompt_size(sum(len(text) for text, _ in segments))  # characters: at most the bytes
            toks = self.segment_tokens(segments, add_bos=True)
        if not toks:
            raise ConfigError("the prompt is empty")
        return toks

    # ----------------------------------------------------------------------------- fill-in-the-middle
    def fim_tokens(self) -> FimTokens:
        """The target vocabulary's FIM tokens (see edgespec.prompts.infill)."""
        if self._fim is None:
            self._live()
            self._fim = self.target.fim_tokens()
        return self._fim

    def infill_tokens(
        self,
        prefix: str,
        suffix: str = "",
        *,
        extra: Sequence[ExtraChunk | tuple[str, str] | Mapping[str, Any] | str] = (),
        prompt: str = "",
        reserve: int = 0,
    ) -> list[int]:
        """Token ids of the fill-in-the-middle prompt for the code around a cursor (layout: infill.fim_layout).
        extra: other files' text as context (ExtraChunk, (filename, text), {"filename", "text"} or a text); prompt:
        text typed after the prefix; reserve: tokens to leave free in the context for the middle (what does not fit
        is cut: extra chunks first, then the prefix's start, then the suffix's end). ConfigError when the model has no
        FIM tokens."""
        fim = self.fim_tokens()
        if fim.missing:
            raise ConfigError(
                f"{os.path.basename(self.target.spec.path)} cannot fill in the middle: its vocabulary has no FIM "
                f"{'/'.join(fim.missing)} token (use a code model trained for infill, e.g. Qwen2.5-Coder)"
            )
        for name, v in (("prefix", prefix), ("suffix", suffix), ("prompt", prompt)):
            if not isinstance(v, str):
                raise ConfigError(f"{name} must be a string, got {type(v).__name__}")
        if len(extra) > MAX_EXTRA_CHUNKS:
            raise ConfigError(f"extra has {len(extra)} chunks; at most {MAX_EXTRA_CHUNKS} are taken (send the files nearest the cursor)")
        chunks = [_extra_chunk(c, i) for i, c in enumerate(extra)]
        _check_int("reserve", reserve, 0)
        budget = max(4, self.target.n_ctx - reserve)
        # Nothing far past what the budget keeps is tokenized (a 27 MB suffix was ~7M ids, 1-2 GiB): a long text is
        # clipped at a line start, from the end the layout drops, to a part that has twice the tokens the budget
        # keeps (tried growing: the most bytes a token stands for bounds the last try); extra chunks are tokenized
        # from the cursor's side until they alone fill the budget (the layout drops the farther ones whole).
        need = 2 * (budget + 8)
        most = need * self.max_token_bytes()

        def tok(text: str) -> list[int]:
            return self.target.tokenize(text, parse_special=False) if text else []

        def clipped(text: str, keep_end: bool, want: int = need) -> list[int]:
            cap = 16 * want
            while True:
                part = _clip(text, cap, keep_end=keep_end)
                ids = tok(part)
                if len(part) == len(text) or len(ids) >= want or cap >= most:
                    return ids
                cap = min(most, 4 * cap)

        pairs: list[tuple[list[int], list[int]]] = []
        n_extra = 0
        for c in reversed(chunks):
            if n_extra > budget:
                break
            pair = (clipped(c.filename + "\n", False), clipped(c.text, True))
            n_extra += (fim.sep is not None) + len(pair[0]) + len(pair[1])
            pairs.append(pair)
        pairs.reverse()
        typed = clipped(prompt, True)
        before = clipped(prefix, True, need - len(typed)) if len(typed) < need else []
        return fim_layout(
            fim, before, clipped(suffix, False), prompt=typed,
            extra=pairs,
            repo=tok(REPO_NAME + "\n"), current_file=tok(FILE_NAME + "\n"),
            bos=self.target.bos if self.target.add_bos and self.target.bos >= 0 else None,
            budget=budget,
        )

    def infill_stream(
        self,
        prefix: str,
        suffix: str = "",
        *,
        extra: Sequence[ExtraChunk | tuple[str, str] | Mapping[str, Any] | str] = (),
        prompt: str = "",
        max_tokens: int = 256,
        **kwargs: Any,
    ) -> Generation:
        """Queue the generation of the code between `prefix` and `suffix` (the keywords of stream()); the handle
        yields the middle. Drafting looks up the suffix and the extra chunks too: they are part of the prompt. The
        same as start(GenerationRequest(infill=InfillPrompt(prefix, suffix, extra, prompt), ...))."""
        self._live()
        return self.start(GenerationRequest(infill=InfillPrompt(prefix, suffix, extra, prompt), max_tokens=max_tokens, **kwargs))

    def infill(self, prefix: str, suffix: str = "", **kwargs: Any) -> Result:
        """infill_stream(), waited for: the middle's text, token ids, stats and finish reason."""
        return self.infill_stream(prefix, suffix, **kwargs).result()

    # ----------------------------------------------------------------------------- generation
    def model_draft_used(self, drafter: str | None = None) -> bool:
        """Whether a generation with `drafter` (default: the engine's) would run the draft model at all: False without
        one, or where the hardware gate (costs.draft_model_pays on the live costs) says it cannot pay;
        "model+ngram" then runs the lookup alone."""
        if self.draft is None:
            return False
        return self.learning.model_draft_used(drafter or self.drafter_kind, self.spec)

    def stream(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        tokens: Sequence[int] | None = None,
        sampling: SamplingParams | None = None,
        max_tokens: int = 512,
        stop: str | Sequence[str] | None = (),
        speculative: bool = True,
        drafter: DrafterKind | str | None = None,
        spec: SpecConfig | None = None,
        on_prefill: Callable[[int, int], None] | None = None,
        constraint: Constraint | Mapping[str, Any] | None = None,
        logprobs: int | None = None,
    ) -> Generation:
        """Queue a generation and return its handle at once (see Generation): start() with the GenerationRequest
        these keywords describe. Exactly one of prompt, messages or tokens. sampling: SamplingParams (default
        DEFAULT_SAMPLING, llama.cpp's defaults). speculative=False decodes plainly; drafter picks another drafter kind
        for this request (one this engine can run) and spec other speculation settings (e.g. a lower draft_max).
        on_prefill(done, total) is called from the engine's thread after each prefill chunk.

        constraint: what the output must look like (constraint.Constraint: a JSON schema, any JSON object, a regex, a
        choice, a grammar), or an OpenAI `response_format` object ({"type": "json_object"} / {"type": "json_schema",
        "json_schema": {"schema": ...}} / {"type": "text"}). Checked here (ConstraintError before anything is
        queued). The target's distribution is then the masked one on every path, speculative or not; with
        speculative=True the tokens the grammar forces are drafted for free. A generation whose constraint
        dead-ends stops with finish reason "constraint".

        logprobs: None, or how many most likely alternatives (0-20) to report with each token: every Chunk then
        carries `logprobs` (speculate.TokenLogprob per token: the target's log-probability of the token under the
        distribution it was sampled from, the same whether the token came from a draft)."""
        self._live()
        return self.start(GenerationRequest(
            prompt=prompt, messages=messages, tokens=tokens, sampling=sampling if sampling is not None else DEFAULT_SAMPLING,
            max_tokens=max_tokens, stop=stop, speculative=speculative, drafter=drafter, spec=spec,
            on_prefill=on_prefill, constraint=constraint, logprobs=logprobs,
        ))

    def start(self, request: GenerationRequest) -> Generation:
        """Queue the generation a GenerationRequest describes and return its handle at once (see Generation).
        What needs this engine is checked here, before anything is queued: the prompt's tokens (they fit the
        vocabulary), a drafter this engine can run, the constraint against its vocabulary (ConstraintError)."""
        self._live()
        if not isinstance(request, GenerationRequest):
            raise ConfigError(f"start takes a GenerationRequest, got {type(request).__name__}")
        kind = self._check_drafter(request.drafter) if request.speculative else DrafterKind.NONE
        spec = request.spec
        if spec is not None and kind.uses_tree and spec.tree_nodes > self.target.tree_paths:
            raise ConfigError(f"tree_nodes {spec.tree_nodes} exceeds what this engine was loaded for ({self.target.tree_paths})")
        ctx = self._request_tokens(request)
        matcher = self.matcher(request.constraint) if request.constraint is not None else None
        if request.sampling.infill:
            if matcher is not None:  # its end-the-completion token may be one the grammar forbids
                raise ConfigError("the infill sampler (SamplingParams.infill) cannot be combined with a constraint")
            try:
                self.target.infill_vocab()  # built once per model, here rather than in the engine's thread
            except BackendError as e:
                raise ConfigError(str(e)) from None
        plan = _Plan(request, ctx, kind, spec or self.spec, matcher)
        stats = GenerationStats()
        ids: list[int] = []
        texts: list[str] = []
        short = request.short if request.short is not None else request.infill is not None or request.max_tokens <= SHORT_TOKENS
        job = Job(steps=lambda j, slot: self._steps(j, slot, plan, stats, ids, texts), size=request.max_tokens, short=short)
        job.prompt = ctx
        self._worker.submit(job)
        return Generation(job, ids, stats, texts)

    def _request_tokens(self, request: GenerationRequest) -> list[int]:
        """The context a request starts from: its tokens (inside the vocabulary), its prompt or messages tokenized,
        or its infill prompt laid out (leaving max_tokens, at most half the context, free for the middle)."""
        if request.tokens is not None:
            ctx = list(request.tokens)
            if max(ctx) >= self.target.n_vocab:
                raise ConfigError(f"token id {max(ctx)} is outside the vocabulary (size {self.target.n_vocab})")
            return ctx
        if request.infill is not None:
            fi = request.infill
            reserve = min(request.max_tokens, self.target.n_ctx // 2)
            return self.infill_tokens(fi.prefix, fi.suffix, extra=fi.extra, prompt=fi.prompt, reserve=reserve)
        return self.prompt_tokens(request.prompt, messages=request.messages, tools=request.tools)

    def matcher(self, constraint: Constraint | Mapping[str, Any]) -> Matcher | None:
        """A fresh matcher for one generation (None for response_format {"type": "text"}); ConstraintError when the
        constraint is invalid or allows nothing with this vocabulary."""
        self._live()
        if not isinstance(constraint, Constraint):
            if not isinstance(constraint, Mapping):
                raise ConfigError("constraint must be a Constraint or a response_format object")
            found = constraint_from_response_format(constraint)
            if found is None:
                return None
            constraint = found
        return Matcher(constraint, self.target.constraint_vocab(), self.target.n_vocab)

    def _check_drafter(self, drafter: DrafterKind | str | None) -> DrafterKind:
        """The drafter kind for one request: the engine's, or another this engine can run."""
        if drafter is None:
            return self.drafter_kind
        kind = parse_drafter(drafter)
        if kind.needs_draft_model and self.draft is None:
            raise ConfigError(f"drafter '{kind}' needs a draft model, and this engine has none")
        if kind.uses_tree and (self.memory is None or self.target.tree_paths < self.spec.tree_nodes):
            raise ConfigError(f"drafter '{kind}' needs an engine loaded with a suffix drafter")
        return kind

    def astream(self, prompt: str | None = None, **kwargs: Any) -> Generation:
        """stream() for asyncio: `async for chunk in engine.astream(...)` (the same handle; iterating it does not
        block the event loop)."""
        return self.stream(prompt, **kwargs)

    def generate(self, prompt: str | None = None, **kwargs: Any) -> Result:
        """Like stream(), waited for: text, token ids, stats and finish reason."""
        return self.stream(prompt, **kwargs).result()

    def submit(self, fn: Callable[["Engine"], Any]) -> "Future[Any]":
        """Run fn(engine) in the engine's thread, with the models to itself, after what is queued (for tools that
        need the models directly, e.g. the benchmark resetting caches)."""
        self._live()
        fut: Future[Any] = Future()

        def run(job: Job) -> None:
            try:
                fut.set_result(fn(self))
            except BaseException as e:
                fut.set_exception(e)

        def dropped() -> None:  # closed before its turn came: the caller must not wait forever
            fut.set_exception(EngineClosedError("the engine was closed before this ran"))

        self._worker.submit(Job(run, on_dropped=dropped))
        return fut

    def remember(self, text: str, source: str = "") -> int:
        """Add a text (a file the user points at) to the suffix drafter's memory; returns its token count (0 when this
        engine has no memory)."""
        self._live()
        if not isinstance(text, str):
            raise ConfigError(f"remember takes text, got {type(text).__name__}")
        if not isinstance(source, str):
            raise ConfigError(f"source must be text, got {type(source).__name__}")
        memory = self.memory
        if memory is None:
            return 0
        toks = self.target.tokenize(text, parse_special=False)
        self.submit(lambda eng: memory.add_document(toks, source)).result()
        return len(toks)

    def reset_caches(self, *, memory: bool = False) -> None:
        """Empty both models' KV caches (their snapshots stay) and, with memory, the suffix memory; waits for the
        queue."""
        def reset(eng: "Engine") -> None:
            for m in (eng.target, eng.draft):
                for i in range(m.parallel if m is not None else 0):
                    m.slot(i).reset()  # type: ignore[union-attr]
            if memory and eng.memory is not None:
                eng.memory.clear()

        self.submit(reset).result()

    # ----------------------------------------------------------------------------- the worker's side

    def _steps(
        self, job: Job, slot: int, plan: "_Plan", stats: GenerationStats, ids: list[int], texts: list[str]
    ) -> Generator[Verify | None, Any, None]:
        """The worker's side of one generation, in `slot`: speculate over the plan, each step's text to the handle
        (ids, texts). Yields each cycle's target decode (a Verify: the worker sends back its logits) and None at each
        cycle boundary (where the worker may let other generations run)."""
        target, draft = self.slots.models(slot)
        req, kind, spec, sampling = plan.request, plan.kind, plan.spec, plan.request.sampling
        logprobs = req.logprobs
        stats.timings.queue = job.started_at - job.enqueued
        # A seed fixes the uniform of every position: the output is then plain decoding's, token for token, whatever
        # the drafts, the costs or the machine (speculate.verify). Without one, a fresh stream from the engine's
        # entropy (tests may fix it).
        rng: Any = PositionalUniforms(sampling.seed) if sampling.seed is not None else np.random.default_rng(self._entropy.spawn(1)[0])
        cost = self.learning.cost_model()  # frozen with a frozen curve
        speculator = self.learning.speculator(kind, spec, sampling, cost, draft, tree_paths=target.tree_paths)
        stats.costs = {**cost.describe(), "source": self.calibration.source}
        detok = StreamingDetokenizer(target.token_bytes, req.stop or ())
        steps = speculate_steps(
            target, plan.ctx, sampling, rng, max_tokens=req.max_tokens, speculator=speculator, stats=stats,
            should_stop=job.cancel_event.is_set, on_prefill=req.on_prefill,
            constraint=plan.matcher, forced_drafts=req.speculative, logprobs=logprobs, clock=job.clock,
        )
        models = [m for m in (target, draft) if m is not None]
        decodes_before = {m: dict(m.threads_info().get("decodes", {})) for m in models}
        llama_before = sum(m.decode_seconds for m in models)
        try:
            ended = False
            try:
                item = next(steps)
                while True:
                    if isinstance(item, Verify):
                        item = steps.send((yield item))
                        continue
                    if self._emit(job, item, detok, ids, texts):
                        break
                    yield None  # a cycle boundary
                    cost.others = self.slots.rows_beside(slot)  # drafts are planned for the batch as a whole
                    item = next(steps)
            except StopIteration:
                ended = True
            if ended:
                tail = detok.flush()
                if tail:  # (logprobs still carried belong to this text; an end token's has no text and is dropped)
                    self._push(job, texts, Chunk(tail, [], False, list(job.logprob_carry) if logprobs is not None else None))
        finally:
            steps.close()
            self.slots.last_rows.pop(slot, None)
            if detok.stopped:
                stats.stop_reason = "stop"
            stats.n_generated = len(ids)
            stats.timings.waited = job.paused
            stats.timings.llama = sum(m.decode_seconds for m in models) - llama_before
            stats.timings.host = max(0.0, stats.wall - stats.timings.llama)
            if speculator is not None:
                stats.controller = speculator.stats()
            self.learning.end_generation(speculator, kind, spec, cost)
            stats.threads = {role: _threads_used(m, decodes_before[m]) for role, m in (("target", target), ("draft", draft)) if m is not None}

    def _emit(self, job: Job, step: Step, detok: StreamingDetokenizer, ids: list[int], texts: list[str]) -> bool:
        """Hand a step's text to the caller: its accepted draft tokens, then the target's own, each pushed token by
        token through the detokenizer, so a stop string ends the generation at the token that completes it, as
        plain decoding would. True when it stopped."""
        n = step.n_accepted
        lps = step.logprobs
        carry = job.logprob_carry
        for toks, from_draft, first in ((step.tokens[:n], True, 0), (step.tokens[n:], False, n)):
            text, used = "", []
            for tok in toks:
                text += detok.push([tok])
                used.append(tok)
                with job.lock:
                    ids.append(tok)
                    job.progress = len(ids)
                if detok.stopped:
                    break
            if lps is not None:
                carry.extend(lps[first : first + len(used)])
            if text:
                chunk_lps = None
                if lps is not None:
                    chunk_lps, carry[:] = list(carry), []
                self._push(job, texts, Chunk(text, used, from_draft, chunk_lps))
            if detok.stopped:
                return True
        return False

    def _push(self, job: Job, texts: list[str], chunk: Chunk) -> None:
        with job.lock:
            texts.append(chunk.text)
        job.push(chunk)


class _Slots:
    """The engine's slots as the worker sees them: which models a slot's generation uses, which free slot a new one
    takes, how its cache is set aside and put back, and how the generations' verify decodes run (one llama_decode
    for several where the live curve says it pays). Holds the models and the learnt costs, not the engine (the
    worker's thread must not keep the engine alive)."""

    def __init__(self, target: Model, draft: Model | None, learning: LearningState) -> None:
        self.target, self.draft, self.learning = target, draft, learning
        self._uses = 0
        self._last_use: dict[int, int] = {}  # slot -> when choose() last gave it out
        self.last_rows: dict[int, int] = {}  # slot -> rows of its generation's last verify decode, when it was batched
        self.batched_decodes = 0  # llama_decode calls that carried more than one generation's rows
        self.batched_rows = 0

    def rows_beside(self, slot: int) -> int:
        """The rows the other generations' last verify decodes put beside this slot's (0 when they ran apart)."""
        if slot not in self.last_rows:
            return 0
        return sum(n for s, n in self.last_rows.items() if s != slot)

    def models(self, slot: int) -> tuple[Model, Model | None]:
        return self.target.slot(slot), self.draft.slot(slot) if self.draft is not None else None

    def choose(self, job: Job, free: list[int]) -> int:
        """The free slot whose target cache already holds the longest prefix of the job's prompt; on a tie the one
        used least recently (an empty slot first), so that another conversation's cache is kept where it can be."""
        self._uses += 1
        best = max(free, key=lambda s: (self.target.slot(s).common_prefix(job.prompt), -self._last_use.get(s, 0)))
        self._last_use[best] = self._uses
        return best

    def park(self, slot: int) -> list[tuple[Model, list[int], bytes]]:
        """Set the slot's caches aside in host memory (both models) and empty the slot."""
        saved = []
        for m in self.models(slot):
            if m is not None:
                saved.append((m, list(m.cached), m.save_state() if m.n_past else b""))
        for m, _, _ in saved:
            m.reset()
        return saved

    def unpark(self, slot: int, saved: list[tuple[Model, list[int], bytes]]) -> None:
        """Put caches set aside by park() back, token for token and byte for byte."""
        for m, tokens, data in saved:
            if not data:
                m.reset()
            elif not m.load_state(tokens, data):
                raise BackendError(f"{m.name}: llama.cpp could not restore the cache of a generation set aside for a shorter one")

    def execute(self, requests: list[Verify]) -> list[Any]:
        """Run the generations' verify decodes: together in one llama_decode when the live curve says one decode of all
        their rows costs less than their separate decodes (and they fit one batch), else one by one. Each result is
        its logits, or the exception its decode raised."""
        out: list[Any] = [None] * len(requests)
        curve = self.learning.curve
        alone = list(range(len(requests)))
        if len(requests) > 1:
            sizes = [r.n_rows for r in requests]
            if sum(sizes) <= self.target.n_batch and curve(sum(sizes)) < BATCH_GAIN * sum(curve(n) for n in sizes):
                alone = []
                parts = [
                    DecodePart(r.model, r.tokens, rows=r.rows, start_pos=r.start_pos, depths=r.depths, seq_ids=r.seq_ids)
                    for r in requests
                ]
                t0 = time.perf_counter()
                try:
                    got: list[Any] = self.target.decode_parts(parts)
                except Exception as e:
                    got = [e] * len(requests)
                else:
                    curve.update(sum(sizes), time.perf_counter() - t0)  # a verify of that many rows, as it was
                    self.batched_decodes += 1
                    self.batched_rows += sum(sizes)
                for i, (r, g) in enumerate(zip(requests, got)):
                    r.shared = True
                    out[i] = g
                    self.last_rows[r.model.slot_index] = r.n_rows
        for i in alone:
            self.last_rows.pop(getattr(requests[i].model, "slot_index", -1), None)
            try:
                # a lone decode's rows are read by its generation before any other decode of the target (the worker
                # steps it at once): a view of llama.cpp's buffer; several run one after another: copies
                out[i] = requests[i].run(view=len(requests) == 1)
            except Exception as e:
                out[i] = e
        return out


@dataclass(frozen=True)
class _Plan:
    """What the worker runs for one request: the request, checked against this engine (Engine.start), with its
    context tokens, drafter kind, speculation settings and constraint matcher."""

    request: GenerationRequest
    ctx: list[int]
    kind: DrafterKind
    spec: SpecConfig
    matcher: Matcher | None


def _calibrate(target: Model, draft: Model | None) -> cal.Calibration:
    """The load-time cost measurement, each model at the thread count it prefers now (a few single-token decodes
    compare the counts first: all cores on a machine where one is taken would make the measurement crawl)."""
    for m in (target, draft):
        if m is not None:
            m.warm_threads()
    with target.pinned_threads():
        if draft is None:
            return cal.calibrate(target, None)
        with draft.pinned_threads():
            return cal.calibrate(target, draft)


def _threads_used(model: Model, before: Mapping[str, int]) -> dict[str, Any]:
    """A model's thread choice for one generation: how it chooses, the count at the end, and (when it chooses by
    itself) how many decodes ran with each count during the generation."""
    info = model.threads_info()
    if "decodes" in info:
        info["decodes"] = {c: n - before.get(c, 0) for c, n in info["decodes"].items()}
    return info


def _clip(text: str, cap: int, *, keep_end: bool) -> str:
    """`text` within `cap` characters: its end (keep_end) or its start, cut after a newline when one lies in the
    half of the kept part nearest the cut (a line start splits no word), else at `cap` characters."""
    if len(text) <= cap:
        return text
    if cap <= 0:
        return ""
    if keep_end:
        start = len(text) - cap
        nl = text.find("\n", start, start + cap // 2)
        return text[nl + 1:] if nl >= 0 else text[start:]
    nl = text.rfind("\n", cap - cap // 2, cap)
    return text[:nl + 1] if nl >= 0 else text[:cap]


def _extra_chunk(c: Any, i: int) -> ExtraChunk:
    """One extra context chunk for infill, from any of the accepted spellings."""
    where = f"extra[{i}]"
    if isinstance(c, ExtraChunk):
        out = c
    elif isinstance(c, str):
        out = ExtraChunk(c)
    elif isinstance(c, tuple) and len(c) == 2:
        out = ExtraChunk(c[1], c[0])
    elif isinstance(c, Mapping):
        unknown = set(c) - {"text", "filename"}
        if unknown:
            raise ConfigError(f"{where} has unknown keys {sorted(unknown)} (it takes text and filename)")
        out = ExtraChunk(c.get("text", ""), c.get("filename", "tmp"))
    else:
        raise ConfigError(f"{where} must be a text, a (filename, text) pair or a {{'filename', 'text'}} mapping")
    if not isinstance(out.text, str) or not isinstance(out.filename, str):
        raise ConfigError(f"{where}: text and filename must be strings")
    return out


def vocab_fingerprint(model: Model) -> str:
    """A name for the model's vocabulary (the suffix memory is only reused with the same one)."""
    import hashlib

    return "sha256:" + hashlib.sha256("\x00".join(model.info.tokens).encode("utf-8", "surrogateescape")).hexdigest()[:32]


class _LazySpecials:
    """The vocabulary's control-token texts, computed only if a template needs them."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def __iter__(self) -> Iterator[str]:
        return iter(self._engine.special_texts())


__all__ = ["Engine", "Chunk", "Result", "Generation", "default_threads", "EdgespecError", "DRAFTER_KINDS"]
