"""One generation request, as every entry point builds it: the CLI from its options, `Engine.stream`/`generate` from
their keywords, `ChatSession` from a conversation; `Engine.start(request)` runs it. Also the drafter kinds
(`DrafterKind`) and the one place "auto" is resolved (`resolve_drafter`).

    req = GenerationRequest(messages=[{"role": "user", "content": "hi"}], sampling=SamplingParams(temperature=0),
                            max_tokens=64, stop=("\\n\\n",))
    for chunk in eng.start(req):
        print(chunk.text, end="")

What needs no engine is checked here, when the request is built (a ConfigError naming the field, the same line the
keywords of Engine.stream give); what needs the engine (the prompt's tokens, a drafter this engine can run, the
constraint against its vocabulary) is checked by Engine.start, before anything is queued.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgespec.config import DEFAULT_SAMPLING, DrafterKind, SamplingParams, SpecConfig, check_int, check_stop
from edgespec.errors import ConfigError

if TYPE_CHECKING:
    from edgespec.decoding.constraint import Constraint
    from edgespec.prompts.infill import ExtraChunk
    from edgespec.decoding.structured import Tool

MAX_LOGPROBS = 20


# --------------------------------------------------------------------------------------------- drafter kinds
AUTO = "auto"  # a drafter choice, not a kind: resolve_drafter turns it into one
KIND_NAMES = tuple(k.value for k in DrafterKind)


def parse_drafter(value: Any) -> DrafterKind:
    """A DrafterKind from its name (or itself); ConfigError naming the kinds for anything else ("auto" included:
    resolve_drafter takes that)."""
    if isinstance(value, DrafterKind):
        return value
    if isinstance(value, str):
        try:
            return DrafterKind(value)
        except ValueError:
            pass
    raise ConfigError(f"drafter must be one of {', '.join(KIND_NAMES)}, got {value!r}")


def resolve_drafter(choice: Any, *, draft_model: bool, lookup_without_draft: bool = False) -> DrafterKind:
    """The drafter kind for a choice ("auto" or a kind's name), given whether a draft model is loaded. "auto" is
    model+ngram with a draft model (the engine runs the lookup alone where the draft model cannot pay on this
    hardware, costs.draft_model_pays); without one, the n-gram lookup where `lookup_without_draft` (the CLI given
    a --target and no draft model: the free lookup), else plain decoding. ConfigError for an unknown name, or a kind
    that needs a draft model without one. The only place "auto" is decided."""
    if choice == AUTO:
        if draft_model:
            return DrafterKind.MODEL_NGRAM
        return DrafterKind.NGRAM if lookup_without_draft else DrafterKind.NONE
    kind = parse_drafter(choice)
    if kind.needs_draft_model and not draft_model:
        raise ConfigError(f"drafter '{kind}' needs a draft model")
    return kind


# --------------------------------------------------------------------------------------------- the request
@dataclass(frozen=True)
class InfillPrompt:
    """The code around a cursor, as Engine.infill_tokens takes it: the prompt of a fill-in-the-middle request.
    extra: other files as context (ExtraChunk, (filename, text), {"filename", "text"} or a text); prompt: text typed
    after the prefix."""

    prefix: str
    suffix: str = ""
    extra: "Sequence[ExtraChunk | tuple[str, str] | Mapping[str, Any] | str]" = ()  # kept as a tuple
    prompt: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.extra, (str, bytes)) or not isinstance(self.extra, Sequence):
            raise ConfigError("extra must be a list of chunks")
        object.__setattr__(self, "extra", tuple(self.extra))


@dataclass(frozen=True)
class GenerationRequest:
    """One generation: its prompt, how to sample, when to stop, what the output must look like, how to draft.

    The prompt is exactly one of `prompt` (raw text: BOS added if the model wants it, control-token text stays
    text), `messages` (chat messages rendered with the model's template; `tools` offered to it), `tokens` (ids as
    they are) or `infill` (the code around a cursor, InfillPrompt).
    sampling: SamplingParams (default DEFAULT_SAMPLING, llama.cpp's defaults; the seed is its `seed`).
    max_tokens: the most tokens generated (0: evaluate the prompt into the cache only, an editor's warm-up; None:
        until the context is full, and an infill leaves a quarter of the context for the middle).
    stop: stop strings (the text ends before the one that appears first).
    constraint: constraint.Constraint, or an OpenAI `response_format` object (see Engine.stream).
    logprobs: None, or how many most likely alternatives (0-20) each token reports.
    speculative: False decodes plainly (and forces no drafts of a constraint).
    drafter: a DrafterKind (or its name) for this request, one the engine can run; None = the engine's.
    spec: other speculation settings for this request (e.g. a lower draft_max); None = the engine's.
    on_prefill: called as on_prefill(done, total) from the engine's thread after each prefill chunk.
    short: whether it may run at a cycle boundary of a longer generation instead of after it (its output is the
        same either way): None = the engine decides (an infill, or max_tokens <= engine.SHORT_TOKENS); True for
        an interactive request that must not wait (an editor's completion); False = strictly in queue order.
    """

    prompt: str | None = None
    messages: Sequence[Mapping[str, Any]] | None = None  # kept as a tuple
    tokens: Sequence[int] | None = None  # kept as a tuple of ints
    infill: InfillPrompt | None = None
    tools: "Sequence[Tool]" = ()  # kept as a tuple
    sampling: SamplingParams = DEFAULT_SAMPLING
    max_tokens: int | None = 512  # None: until the context is full
    stop: Sequence[str] | None = ()  # a string or strings, kept as a tuple (empty ones dropped)
    constraint: "Constraint | Mapping[str, Any] | None" = None
    logprobs: int | None = None
    speculative: bool = True
    drafter: DrafterKind | str | None = None  # kept as a DrafterKind
    spec: SpecConfig | None = None
    on_prefill: Callable[[int, int], None] | None = field(default=None, compare=False)
    short: bool | None = None

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        given = [n for n in ("prompt", "messages", "tokens", "infill") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ConfigError("give exactly one of prompt, messages or tokens" + (" (or infill)" if self.infill is not None else ""))
        if self.prompt is not None and not isinstance(self.prompt, str):
            raise ConfigError(f"prompt must be a string, got {type(self.prompt).__name__}")
        if self.messages is not None:
            if isinstance(self.messages, (str, bytes, Mapping)) or not isinstance(self.messages, Sequence):
                raise ConfigError(f"messages must be a list of {{'role', 'content'}} objects, got {type(self.messages).__name__}")
            if not self.messages:
                raise ConfigError("messages must not be empty")
            put("messages", tuple(self.messages))
        if self.tokens is not None:
            if isinstance(self.tokens, (str, bytes)) or not isinstance(self.tokens, Sequence):
                raise ConfigError("tokens must be a list of token ids")
            if not self.tokens:
                raise ConfigError("tokens is empty")
            put("tokens", tuple(check_int("a token id", t, 0) for t in self.tokens))
        if self.infill is not None and not isinstance(self.infill, InfillPrompt):
            raise ConfigError("infill must be an InfillPrompt")
        if isinstance(self.tools, (str, bytes, Mapping)) or not isinstance(self.tools, Sequence):
            raise ConfigError("tools must be a list of tools")
        put("tools", tuple(self.tools))
        if self.tools and self.messages is None:
            raise ConfigError("tools are offered with messages (a chat), not with a raw prompt")
        if self.sampling is None:
            put("sampling", DEFAULT_SAMPLING)
        elif not isinstance(self.sampling, SamplingParams):
            raise ConfigError("sampling must be a SamplingParams")
        if self.max_tokens is not None:
            put("max_tokens", check_int("max_tokens", self.max_tokens, 0))
        put("stop", check_stop(self.stop))
        if self.logprobs is not None:
            n = check_int("logprobs", self.logprobs, 0)
            if n > MAX_LOGPROBS:
                raise ConfigError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {n}")
            put("logprobs", n)
        if not isinstance(self.speculative, bool):
            raise ConfigError("speculative must be True or False")
        if self.drafter is not None:
            put("drafter", parse_drafter(self.drafter))
        if self.spec is not None and not isinstance(self.spec, SpecConfig):
            raise ConfigError("spec must be a SpecConfig")
        if self.on_prefill is not None and not callable(self.on_prefill):
            raise ConfigError("on_prefill must be callable")
        if self.short is not None and not isinstance(self.short, bool):
            raise ConfigError("short must be True, False or None")


__all__ = ["AUTO", "DrafterKind", "GenerationRequest", "InfillPrompt", "KIND_NAMES", "parse_drafter", "resolve_drafter"]
