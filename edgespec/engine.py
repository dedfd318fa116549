"""The public engine: load a target (and a draft) once, then generate or stream many times.

    from edgespec import Engine, ModelSpec, SamplingParams
    eng = Engine.load(ModelSpec("target.gguf"), ModelSpec("draft.gguf"))
    r = eng.generate("Write a haiku", sampling=SamplingParams(temperature=0))
    for chunk in eng.stream(messages=[{"role": "user", "content": "hi"}]):
        print(chunk.text, end="")

Plain decoding (no draft) goes through the same loop and the same sampling code with a draft length of 0.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from . import chat_template
from .backend import Model, default_threads
from .config import ConfigError, EdgespecError, ModelSpec, SamplingParams, SpecConfig
from .controller import Controller, CostModel, NgramPolicy
from .detok import StreamingDetokenizer
from .drafters.model import ModelDrafter
from .drafters.ngram import NgramDrafter
from .drafters.policy import HybridDrafter, LookupSpeculator
from .gguf_check import inspect_gguf, require_compatible
from .speculate import GenerationStats, Step, speculate

DRAFTER_KINDS = ("model", "ngram", "model+ngram", "none")


@dataclass
class Chunk:
    """A piece of streamed text. `from_draft` is True when every token behind it was a draft token the target
    accepted (for --show-draft colouring)."""

    text: str
    tokens: list[int]
    from_draft: bool


@dataclass
class Result:
    text: str
    token_ids: list[int]
    stats: GenerationStats
    finish_reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason, "stats": self.stats.as_dict()}


class Generation:
    """An iterator of Chunks; after (or during) iteration `.text`, `.token_ids` and `.stats` describe the run."""

    def __init__(self, chunks: Iterator[Chunk], stats: GenerationStats, token_ids: list[int], detok: StreamingDetokenizer):
        self._chunks = chunks
        self.stats = stats
        self.token_ids = token_ids
        self._detok = detok

    def __iter__(self) -> Iterator[Chunk]:
        return self._chunks

    @property
    def text(self) -> str:
        return self._detok.text

    def close(self) -> None:
        self._chunks.close()  # type: ignore[attr-defined]

    def result(self) -> Result:
        for _ in self._chunks:
            pass
        return Result(self.text, list(self.token_ids), self.stats, self.stats.stop_reason)


# --------------------------------------------------------------------------------------------- calibration
# Every size up to 9, then a few larger ones: on CPUs the curve is irregular (here 12 tokens cost more than 16),
# so interpolating from a few sizes misleads the controller. Sizes in between are learnt online.
_CAL_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17)


def _cache_dir() -> Path:
    import platformdirs

    return Path(os.environ.get("EDGESPEC_CACHE_DIR") or platformdirs.user_cache_dir("edgespec"))


def measure_decode_costs(model: Model, sizes: Sequence[int] = _CAL_SIZES, repeats: int = 2) -> dict[int, float]:
    """Seconds for one batched decode of n tokens after a short context, best of `repeats`. Leaves the cache
    empty. This is the verify-cost curve the controller plans with."""
    base = [model.bos if model.bos >= 0 else 0] + [min(100 + i, model.n_vocab - 1) for i in range(15)]
    sizes = [n for n in sizes if len(base) + n <= model.n_ctx and n <= model.n_batch]
    model.reset()
    model.decode(base, 0, ())
    out: dict[int, float] = {}
    for _ in range(repeats):
        for n in sizes:
            toks = [(7 * j + 11) % model.n_vocab for j in range(n)]
            t0 = time.perf_counter()
            model.decode(toks, len(base), range(n))
            dt = time.perf_counter() - t0
            model.truncate(len(base))
            out[n] = min(out.get(n, dt), dt)
    model.reset()
    return out


def calibrate(target: Model, draft: Model | None, *, use_cache: bool = True) -> tuple[dict[int, float], float]:
    """(target verify costs {n: s}, draft seconds per token), cached per model file and settings in the user
    cache so that later loads skip the measurement."""
    key = json.dumps(
        [_model_key(target), _model_key(draft) if draft else None, sorted(_CAL_SIZES)], sort_keys=True
    )
    path = _cache_dir() / "calibration.json"
    table: dict[str, Any] = {}
    if use_cache:
        try:
            table = json.loads(path.read_text())
            hit = table.get(key)
            if hit:
                return {int(n): float(s) for n, s in hit["verify"].items()}, float(hit["draft"])
        except (OSError, ValueError, KeyError, TypeError):
            table = {}
    verify = measure_decode_costs(target)
    c_draft = measure_decode_costs(draft, sizes=(1,))[1] if draft is not None else 0.0
    if use_cache:
        try:
            table[key] = {"verify": verify, "draft": c_draft, "when": time.time()}
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(table, indent=1))
            tmp.replace(path)
        except OSError:
            pass
    return verify, c_draft


def _model_key(m: Model) -> list[Any]:
    st = os.stat(m.spec.path)
    return [os.path.abspath(m.spec.path), st.st_size, st.st_mtime_ns, m.n_threads, m.spec.n_gpu_layers, m.n_batch]


# --------------------------------------------------------------------------------------------- engine
def _as_spec(m: ModelSpec | str | os.PathLike[str]) -> ModelSpec:
    return m if isinstance(m, ModelSpec) else ModelSpec(os.fspath(m))


class Engine:
    """A loaded target (+ optional draft) and the machinery to generate from it."""

    def __init__(
        self,
        target: Model,
        draft: Model | None = None,
        *,
        drafter: str = "auto",
        spec: SpecConfig | None = None,
        verify_costs: Mapping[int, float] | None = None,
        draft_cost: float = 0.0,
    ) -> None:
        self.target = target
        self.draft = draft
        self.spec = spec or SpecConfig()
        if drafter == "auto":
            drafter = "model+ngram" if draft is not None else "none"
        if drafter not in DRAFTER_KINDS:
            raise ConfigError(f"drafter must be one of {', '.join(DRAFTER_KINDS)}, got {drafter!r}")
        if drafter in ("model", "model+ngram") and draft is None:
            raise ConfigError(f"drafter {drafter!r} needs a draft model")
        self.drafter_kind = drafter
        self.verify_costs = dict(verify_costs) if verify_costs else {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0, 16: 1.0}
        self.draft_cost = draft_cost
        self.last_controller_stats: dict[str, Any] = {}

    @classmethod
    def load(
        cls,
        target: ModelSpec | str | os.PathLike[str],
        draft: ModelSpec | str | os.PathLike[str] | None = None,
        *,
        drafter: str = "auto",
        spec: SpecConfig | None = None,
        calibrate_costs: bool = True,
    ) -> "Engine":
        """Validate both files, check that they share a tokenizer (before any weights load), load them and
        measure decode costs (cached per machine)."""
        tspec = _as_spec(target)
        tinfo = inspect_gguf(tspec.path)
        dspec = dinfo = None
        if draft is not None and drafter != "ngram" and drafter != "none":
            dspec = _as_spec(draft)
            dinfo = inspect_gguf(dspec.path)
            require_compatible(tinfo, dinfo)
        t = Model(tspec, tinfo)
        d = None
        try:
            if dspec is not None:
                d = Model(dspec, dinfo)
            verify, c_draft = calibrate(t, d) if calibrate_costs else (None, 0.0)
        except BaseException:
            t.close()
            if d is not None:
                d.close()
            raise
        return cls(t, d, drafter=drafter, spec=spec, verify_costs=verify, draft_cost=c_draft)

    def close(self) -> None:
        self.target.close()
        if self.draft is not None:
            self.draft.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------- prompts
    @property
    def chat_template(self) -> str | None:
        return self.target.chat_template

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        return chat_template.render(self.chat_template, messages, add_generation_prompt=add_generation_prompt)

    def prompt_tokens(self, prompt: str | None = None, *, messages: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """Token ids for a raw prompt (BOS added if the model wants it) or for chat messages (rendered with the
        model's template; special tokens in the template are parsed as specials)."""
        if (prompt is None) == (messages is None):
            raise ConfigError("give exactly one of prompt or messages")
        text = prompt if prompt is not None else self.render(messages or [])
        toks = self.target.tokenize(text, add_special=True, parse_special=messages is not None)
        if not toks:
            raise ConfigError("the prompt is empty")
        return toks

    # ----------------------------------------------------------------------------- generation
    @property
    def model_draft_pays(self) -> bool:
        """Whether the draft model can pay on this machine: False without one, or when the controller's hardware gate
        (calibrated costs, 90% acceptance everywhere still gains under 10%) switches it off. Then "model+ngram" runs
        the n-gram drafter alone and the draft model does no work at all."""
        if self.draft is None or self.drafter_kind not in ("model", "model+ngram") or self.spec.draft_max == 0:
            return False
        return not self._model_controller(frozen=False).disabled

    def _cost(self, free: bool, frozen: bool) -> CostModel:
        return CostModel(self.verify_costs, c_draft=0.0 if free else self.draft_cost, frozen=frozen)

    def _model_controller(self, frozen: bool) -> Controller:
        return Controller(self.spec, self._cost(False, frozen))

    def _make_drafter(self, sampling: SamplingParams, speculative: bool) -> tuple[Any, Any]:
        kind = self.drafter_kind if speculative else "none"
        if kind == "none" or self.spec.draft_max == 0:
            return None, None
        # A seeded run plans with the calibrated costs only (not this run's timings): reproducible output.
        frozen = sampling.seed is not None
        md = ModelDrafter(self.draft, sampling, self.spec.draft_temperature) if self.draft is not None else None
        if kind == "model":
            return md, self._model_controller(frozen)
        ngram = NgramDrafter(self.spec.ngram_n_max, self.spec.ngram_n_min)
        lookup = LookupSpeculator(ngram, NgramPolicy(self.spec, self._cost(True, frozen)))
        if kind == "ngram":
            return lookup, lookup
        model_ctl = self._model_controller(frozen)
        if model_ctl.disabled:  # the hardware gate (see model_draft_pays): the lookup alone
            return lookup, lookup
        hybrid = HybridDrafter(md, lookup, model_ctl)  # type: ignore[arg-type]
        return hybrid, hybrid

    def stream(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        tokens: Sequence[int] | None = None,
        sampling: SamplingParams | None = None,
        max_tokens: int = 512,
        stop: Sequence[str] = (),
        speculative: bool = True,
    ) -> Generation:
        """Start a generation and return it as an iterator of text Chunks (see Generation)."""
        sampling = sampling or SamplingParams()
        if max_tokens < 1:
            raise ConfigError(f"max_tokens must be at least 1, got {max_tokens}")
        ctx = list(tokens) if tokens is not None else self.prompt_tokens(prompt, messages=messages)
        rng = np.random.default_rng(sampling.seed)
        drafter, policy = self._make_drafter(sampling, speculative)
        stats = GenerationStats()
        ids: list[int] = []
        detok = StreamingDetokenizer(self.target.token_bytes, stop)
        steps = speculate(
            self.target, ctx, sampling, rng, max_tokens=max_tokens, drafter=drafter, policy=policy, stats=stats
        )
        return Generation(self._chunks(steps, ids, detok, stats, policy), stats, ids, detok)

    def _chunks(
        self, steps: Iterator[Step], ids: list[int], detok: StreamingDetokenizer, stats: GenerationStats, policy: Any
    ) -> Iterator[Chunk]:
        try:
            for step in steps:
                ids.extend(step.tokens)
                n = step.n_accepted
                for toks, flag in ((step.tokens[:n], True), (step.tokens[n:], False)):
                    if not toks:
                        continue
                    text = detok.push(toks)
                    if text:
                        yield Chunk(text, list(toks), flag)
                    if detok.stopped:
                        stats.stop_reason = "stop"
                        return
            tail = detok.flush()
            if tail:
                yield Chunk(tail, [], False)
        finally:
            steps.close()  # type: ignore[attr-defined]
            if detok.stopped:
                stats.stop_reason = "stop"
            if policy is not None and hasattr(policy, "stats"):
                self.last_controller_stats = policy.stats()

    def generate(self, prompt: str | None = None, **kwargs: Any) -> Result:
        """Like stream(), joined: text, token ids and stats."""
        return self.stream(prompt, **kwargs).result()


__all__ = ["Engine", "Chunk", "Result", "Generation", "calibrate", "measure_decode_costs", "default_threads", "EdgespecError"]
