"""The public engine: load a target (and a draft) once, then generate from any thread, sync or async.

    from edgespec import Engine, ModelSpec, SamplingParams
    with Engine.load(ModelSpec("target.gguf"), ModelSpec("draft.gguf")) as eng:
        r = eng.generate("Write a haiku", sampling=SamplingParams(temperature=0))
        for chunk in eng.stream(messages=[{"role": "user", "content": "hi"}]):
            print(chunk.text, end="")

One worker thread owns the llama.cpp contexts, which hold `parallel` slots (a main sequence each, and its tree paths,
in each model: llama/slot.py). `stream()` queues a generation and returns a `Generation` handle at once: iterate it
(or `async for`), `cancel()` it from any thread (it stops within one speculative cycle, or between prefill chunks),
`close()` it, or ask for its `result()`.
Up to `parallel` generations run at once, each in its own slot, advanced cycle by cycle together (generation.Worker):
their verify decodes go to the target in ONE llama_decode where the live cost curve says that costs less than
separate ones (slots.Slots.execute), each with its own acceptance, sampler, RNG and constraint. A short generation (an
infill, or at most SHORT_TOKENS tokens) is admitted first, takes four turns to a long one's one, and when every slot is
busy it displaces the long generation with the most to go, whose cache is set aside in host memory and restored
after (its output is unchanged). Conversations keep their KV cache: a generation goes to the free slot that already
holds most of its prompt, and a snapshot of what a conversation left is kept in host memory (prompt_cache.PromptCache)
and restored when it comes back, so only its new tokens are decoded.

Plain decoding (no draft) goes through the same loop and the same sampling code with no speculator. Costs are
measured once at load (cached per machine) and then learnt from the decodes generations do anyway; nothing is
measured inside a request.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import weakref
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from edgespec.drafting import calibration as cal
from edgespec.llama import rpc
from edgespec.llama.backend import Model, default_threads
from edgespec.config import DEFAULT_SAMPLING, ModelSpec, SamplingParams, SpecConfig, check_tree_fits
from edgespec.config import MAX_PARALLEL
from edgespec.config import check_int as _check_int
from edgespec.decoding.constraint import Constraint, Matcher
from edgespec.decoding.structured import Tool, constraint_from_response_format
from edgespec.drafting.costs import VerifyCurve
from edgespec.fsutil import clear_odd_file
from edgespec.errors import BackendError, BackendLostError, ConfigError, EdgespecError, EngineClosedError
from edgespec.drafting.learning import LearningState
from .generation import Worker, shutdown
from .handle import Generation, Result
from .job import Chunk, Job
from .prompt import Prompts
from .runner import Plan, generation_steps
from .slots import Slots
from edgespec.llama.gguf_check import inspect_gguf
from edgespec.llama.vocab_pair import VocabPair, require_pairable
from edgespec.prompts.infill import ExtraChunk, FimTokens
from .request import AUTO, DrafterKind, GenerationRequest, InfillPrompt, parse_drafter, resolve_drafter
from edgespec.decoding.sampling import PositionalUniforms
from edgespec.drafting import KINDS, tree_paths_for
from edgespec.drafting.suffix_index import SuffixIndex
from edgespec.drafting.suffix_index import default_path as suffix_default_path
from edgespec.stats import GenerationStats

DRAFTER_KINDS = KINDS
# A generation of at most this many tokens (or any infill) is short: it is admitted before longer ones, gets four turns
# to their one, and may displace a long one when every slot is busy (an editor's completion, a chat's title).
SHORT_TOKENS = 64
# Slots when the caller does not say (Engine.load parallel=None): at most this many, fewer where the sequences or the
# machine's memory do not allow them (context.fit_parallel).
DEFAULT_PARALLEL = 4


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


def _suffix_memory(t: Model, memory: str | os.PathLike[str] | bool) -> tuple[SuffixIndex, Path]:
    """The suffix drafters' memory of everything seen and where it is kept (Engine.load's `memory`, not False)."""
    vocab = vocab_fingerprint(t)
    where = suffix_default_path(vocab) if isinstance(memory, bool) else Path(os.fspath(memory))
    if memory is not True and os.path.lexists(where) and not where.is_file():
        raise ConfigError(f"the memory file {where} is not a regular file")  # the user's path: refused
    index = SuffixIndex.load(where, vocab=vocab)  # an empty one when there is no file yet (a warning if bad)
    if memory is True:
        clear_odd_file(where)  # the cache's own path held a FIFO, a loop, an empty folder: rebuilt at close
    return index, where


def _deterministic(tspec: ModelSpec, on: Any, kind: DrafterKind, paths: int) -> tuple[ModelSpec, int]:
    """The target's spec and tree sequences for Engine.load(deterministic=on): with it (or a spec that asks), the
    target decodes batch-invariantly (ModelSpec.deterministic; docs/determinism.md): greedy output, speculative or
    plain, alone or beside other slots, is token for token the same, and so is seeded sampling. Chains only: no
    tree sequences (a draft model's siblings are dropped; a suffix drafter's trees are a ConfigError)."""
    if not isinstance(on, bool):
        raise ConfigError("deterministic must be True or False")
    if not (on or tspec.deterministic):
        return tspec, paths
    if kind.uses_tree:
        raise ConfigError(f"deterministic mode verifies chains only: drafter '{kind}' builds token trees (use model, ngram or model+ngram)")
    return dataclasses.replace(tspec, deterministic=True), 0


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
        self.prompts = Prompts(target, self._live)  # every prompt is built there (prompt.py)
        self._closed = False
        self.memory_path = os.fspath(memory_path) if memory_path is not None else None
        if draft is not None and draft.parallel < target.parallel:
            raise ConfigError(f"the draft holds {draft.parallel} slots and the target {target.parallel}: load both with the same parallel")
        # how the draft's vocabulary pairs with the target's: the same, mapped ids or an intersection (vocab_pair.py)
        self.vocab_pair: VocabPair | None = require_pairable(target.info, draft.info) if draft is not None else None
        self.slots = Slots(target, draft, self.learning, self.vocab_pair)
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
        deterministic: bool = False,
    ) -> "Engine":
        """Validate both files, check how their vocabularies pair (llama/vocab_pair.py; a draft that shares too little is
        refused before any weights load), load them and
        measure decode costs (cached per machine, checked at every load; calibrate_costs=False measures nothing and
        plans with a fixed flat, GPU-like curve: drafting always looks cheap). prompt_cache_mb: host memory for KV
        snapshots of conversations the engine left (0 = none), per model. memory (suffix drafters only): True keeps
        the memory of everything seen in the user cache across runs, a path keeps it there, False/None keeps it in
        this process only. parallel: slots, generations that run at once (None: up to DEFAULT_PARALLEL, as many
        as the sequences and a quarter of the available memory allow); each slot holds a whole context of
        n_ctx tokens in both models (ConfigError at load when their caches cannot fit the machine). deterministic:
        the target decodes batch-invariantly (see _deterministic)."""
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
            require_pairable(tinfo, dinfo)  # the same vocabulary, or one a draft can propose from (vocab_pair.py)
        cache_bytes = int(prompt_cache_mb * 2**20)
        kind = resolve_drafter(choice, draft_model=dspec is not None)  # before any weights load
        # tree sequences: the suffix drafters' trees, or a draft model's siblings (draft-model trees)
        paths = tree_paths_for(kind, spec or SpecConfig(), dspec is not None, min(tspec.n_batch, tspec.n_ctx))
        tspec, paths = _deterministic(tspec, deterministic, kind, paths)
        if paths:
            check_tree_fits(tspec, paths)  # before any weights load (llama.cpp would abort the process)
        t = Model(tspec, tinfo, prompt_cache_bytes=cache_bytes, tree_paths=paths, parallel=parallel or -DEFAULT_PARALLEL)
        d = None
        try:
            if dspec is not None:
                d = Model(dspec, dinfo, prompt_cache_bytes=cache_bytes, parallel=t.parallel)
            index, where = _suffix_memory(t, memory) if kind.uses_tree and memory else (None, None)
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
                eng.set_calibration(eng.run_on_worker(lambda e: _calibrate(e.target, e.draft)).result())
            except BaseException:
                eng.close()
                raise
        # A full collection now, while the caller waits for the load anyway: the objects the load made move to the
        # oldest generation, so a first generation does not pay that collection in its loop (~20 ms after a CPU
        # decode has left the caches cold, measured: docs/benchmarks.md).
        gc.collect()
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
    def max_queue(self) -> int | None:
        """How many generations may wait for a slot (None: no bound)."""
        return self._worker.max_queue

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

    # ----------------------------------------------------------------------------- prompts (any thread: prompt.Prompts)
    @property
    def chat_template(self) -> str | None:
        return self.prompts.chat_template

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        return self.prompts.render(messages, add_generation_prompt)

    def special_texts(self) -> list[str]:
        return self.prompts.special_texts()

    def max_token_bytes(self) -> int:
        return self.prompts.max_token_bytes()

    def check_prompt_size(self, n_bytes: int) -> None:
        self.prompts.check_prompt_size(n_bytes)

    def segment_tokens(self, segments: Sequence[tuple[str, bool]], *, add_bos: bool) -> list[int]:
        return self.prompts.segment_tokens(segments, add_bos=add_bos)

    def chat_segments(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, tools: Sequence[Tool] = ()
    ) -> list[tuple[str, bool]]:
        return self.prompts.chat_segments(messages, add_generation_prompt, tools)

    def prompt_tokens(
        self, prompt: str | None = None, *, messages: Sequence[Mapping[str, Any]] | None = None, tools: Sequence[Tool] = ()
    ) -> list[int]:
        return self.prompts.prompt_tokens(prompt, messages=messages, tools=tools)

    def fim_tokens(self) -> FimTokens:
        return self.prompts.fim_tokens()

    def infill_tokens(
        self,
        prefix: str,
        suffix: str = "",
        *,
        extra: Sequence[ExtraChunk | tuple[str, str] | Mapping[str, Any] | str] = (),
        prompt: str = "",
        reserve: int = 0,
    ) -> list[int]:
        return self.prompts.infill_tokens(prefix, suffix, extra=extra, prompt=prompt, reserve=reserve)

    # ----------------------------------------------------------------------------- fill-in-the-middle
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
        vocabulary and leave room to generate: PromptTooLongError), a drafter this engine can run, the constraint
        against its vocabulary (ConstraintError)."""
        self._live()
        if not isinstance(request, GenerationRequest):
            raise ConfigError(f"start takes a GenerationRequest, got {type(request).__name__}")
        kind = self._check_drafter(request.drafter) if request.speculative else DrafterKind.NONE
        spec = request.spec
        if spec is not None and kind.uses_tree and spec.tree_nodes > self.target.tree_paths:
            raise ConfigError(f"tree_nodes {spec.tree_nodes} exceeds what this engine was loaded for ({self.target.tree_paths})")
        ctx = self.prompts.request_tokens(request)
        self.prompts.check_fits(len(ctx), request.max_tokens)
        # None: until the context is full
        max_tokens = self.target.n_ctx - len(ctx) if request.max_tokens is None else request.max_tokens
        matcher = self.matcher(request.constraint) if request.constraint is not None else None
        if request.sampling.infill:
            if matcher is not None:  # its end-the-completion token may be one the grammar forbids
                raise ConfigError("the infill sampler (SamplingParams.infill) cannot be combined with a constraint")
            try:
                self.target.infill_vocab()  # built once per model, here rather than in the engine's thread
            except BackendError as e:
                raise ConfigError(str(e)) from None
        plan = Plan(request, ctx, max_tokens, kind, spec or self.spec, matcher)
        stats = GenerationStats()
        ids: list[int] = []
        texts: list[str] = []
        short = request.short if request.short is not None else request.infill is not None or max_tokens <= SHORT_TOKENS
        job = Job(steps=lambda j, slot: generation_steps(
            j, slot, plan, stats, ids, texts, slots=self.slots, learning=self.learning,
            rng=self.generation_rng(plan.request.sampling), costs_source=self.calibration.source,
        ), size=max_tokens, short=short)
        job.prompt = ctx
        self._worker.submit(job)
        return Generation(job, ids, stats, texts)

    def generation_rng(self, sampling: SamplingParams) -> Any:
        """A generation's uniforms. A seed fixes the uniform of every position: the output is then plain decoding's,
        token for token, whatever the drafts, the costs or the machine (speculate.verify). Without one, a fresh
        stream from the engine's entropy (tests may fix it)."""
        if sampling.seed is not None:
            return PositionalUniforms(sampling.seed)
        return np.random.default_rng(self._entropy.spawn(1)[0])

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

    def run_on_worker(self, fn: Callable[["Engine"], Any]) -> "Future[Any]":
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
        self.run_on_worker(lambda eng: memory.add_document(toks, source)).result()
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

        self.run_on_worker(reset).result()



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


def vocab_fingerprint(model: Model) -> str:
    """A name for the model's vocabulary (the suffix memory is only reused with the same one)."""
    import hashlib

    return "sha256:" + hashlib.sha256("\x00".join(model.info.tokens).encode("utf-8", "surrogateescape")).hexdigest()[:32]


__all__ = ["Engine", "Chunk", "Result", "Generation", "default_threads", "EdgespecError", "DRAFTER_KINDS"]
