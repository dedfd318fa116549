"""Prompts: from what a request says to the token ids the target decodes, for one vocabulary (the target's).

Every entry point (Engine.start and so the server, the CLI, ChatSession) builds its prompt here: raw text (BOS where
the model wants it, control-token text kept as text), chat messages rendered with the model's template (markup as
control tokens, contents never), tools offered to the template, the fill-in-the-middle layout with its clipping, and
the size checks (a text that cannot fit the context is refused before it is tokenized; a prompt with no room for a
generated token is refused before it is queued).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

from edgespec.config import check_int
from edgespec.decoding.structured import Tool, prompt_messages
from edgespec.errors import ConfigError, ContextFullError, PromptTooLongError
from edgespec.prompts import chat_template
from edgespec.prompts.infill import FILE_NAME, MAX_EXTRA_CHUNKS, REPO_NAME, ExtraChunk, FimTokens, fim_layout

from .request import GenerationRequest


class Vocabulary(Protocol):
    """What prompt building needs of a loaded model (llama.backend.Model has it)."""

    n_ctx: int
    n_vocab: int
    bos: int
    add_bos: bool

    @property
    def chat_template(self) -> str | None: ...
    @property
    def info(self) -> Any: ...
    @property
    def spec(self) -> Any: ...
    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]: ...
    def token_bytes(self, token: int, *, special: bool = False) -> bytes: ...
    def control_tokens(self) -> list[int]: ...
    def fim_tokens(self) -> FimTokens: ...


class Prompts:
    """Prompt building for one model's vocabulary. Safe from any thread; `live` raises once the owner is closed."""

    def __init__(self, model: Vocabulary, live: Callable[[], None] = lambda: None) -> None:
        self.model = model
        self._live = live
        self._specials: list[str] | None = None
        self._max_token_bytes: int | None = None
        self._fim: FimTokens | None = None

    @property
    def chat_template(self) -> str | None:
        self._live()
        return self.model.chat_template

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        self._live()
        return chat_template.render(self.chat_template, messages, add_generation_prompt=add_generation_prompt)

    def special_texts(self) -> list[str]:
        """The text of every control token of the vocabulary (computed once)."""
        if self._specials is None:
            self._live()
            ids = self.model.control_tokens()  # EngineClosedError if another thread closed it meanwhile
            self._specials = sorted({self.model.token_bytes(i, special=True).decode("utf-8", "replace") for i in ids} - {""})
        return self._specials

    def max_token_bytes(self) -> int:
        """The most bytes one token of the target's vocabulary stands for (computed once)."""
        if self._max_token_bytes is None:
            self._max_token_bytes = max((len(t.encode("utf-8", "surrogateescape")) for t in self.model.info.tokens), default=0) or 256
        return self._max_token_bytes

    def check_prompt_size(self, n_bytes: int) -> None:
        """ContextFullError, before any tokenization, for a text that cannot fit in the context whatever its tokens:
        no token of the vocabulary stands for more than max_token_bytes bytes. Bounds the memory a huge prompt takes
        (a 32 MB body would be tens of millions of token ids, a Python int each)."""
        limit = self.model.n_ctx * self.max_token_bytes()
        if n_bytes > limit:
            raise ContextFullError(
                f"the prompt is {n_bytes} bytes: far more than a context of {self.model.n_ctx} tokens holds (no token of "
                f"this vocabulary is longer than {self._max_token_bytes} bytes); shorten it or use a larger context"
            )

    def segment_tokens(self, segments: Sequence[tuple[str, bool]], *, add_bos: bool) -> list[int]:
        """Token ids for rendered segments: markup with control tokens parsed, contents as plain text."""
        self._live()
        out: list[int] = []
        for i, (text, is_content) in enumerate(segments):
            out += self.model.tokenize(text, add_special=add_bos and i == 0, parse_special=not is_content)
        if add_bos and not segments:
            out = self.model.tokenize("", add_special=True)
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
            toks = self.model.tokenize(prompt, add_special=True, parse_special=False)
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


    def fim_tokens(self) -> FimTokens:
        """The target vocabulary's FIM tokens (see edgespec.prompts.infill)."""
        if self._fim is None:
            self._live()
            self._fim = self.model.fim_tokens()
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
                f"{os.path.basename(self.model.spec.path)} cannot fill in the middle: its vocabulary has no FIM "
                f"{'/'.join(fim.missing)} token (use a code model trained for infill, e.g. Qwen2.5-Coder)"
            )
        for name, v in (("prefix", prefix), ("suffix", suffix), ("prompt", prompt)):
            if not isinstance(v, str):
                raise ConfigError(f"{name} must be a string, got {type(v).__name__}")
        if len(extra) > MAX_EXTRA_CHUNKS:
            raise ConfigError(f"extra has {len(extra)} chunks; at most {MAX_EXTRA_CHUNKS} are taken (send the files nearest the cursor)")
        chunks = [_extra_chunk(c, i) for i, c in enumerate(extra)]
        check_int("reserve", reserve, 0)
        budget = max(4, self.model.n_ctx - reserve)
        # Tokenize little past what the budget keeps (a 27 MB suffix was ~7M ids): each text clipped at a line start
        # to about twice the tokens kept; extra chunks from the cursor's side until they alone fill the budget.
        need = 2 * (budget + 8)
        most = need * self.max_token_bytes()

        def tok(text: str) -> list[int]:
            return self.model.tokenize(text, parse_special=False) if text else []

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
            bos=self.model.bos if self.model.add_bos and self.model.bos >= 0 else None,
            budget=budget,
        )

    def request_tokens(self, request: GenerationRequest) -> list[int]:
        """The context a request starts from: its tokens (inside the vocabulary), its prompt or messages tokenized,
        or its infill prompt laid out, leaving free for the middle its max_tokens (None: a quarter of the context), at
        most half the context."""
        if request.tokens is not None:
            ctx = list(request.tokens)
            if max(ctx) >= self.model.n_vocab:
                raise ConfigError(f"token id {max(ctx)} is outside the vocabulary (size {self.model.n_vocab})")
            return ctx
        if request.infill is not None:
            fi = request.infill
            reserve = min(self.model.n_ctx // 4 if request.max_tokens is None else request.max_tokens, self.model.n_ctx // 2)
            return self.infill_tokens(fi.prefix, fi.suffix, extra=fi.extra, prompt=fi.prompt, reserve=reserve)
        return self.prompt_tokens(request.prompt, messages=request.messages, tools=request.tools)

    def check_fits(self, n_prompt: int, max_tokens: int | None) -> None:
        """PromptTooLongError unless the prompt and the first token to generate (none when max_tokens is 0) fit."""
        n_ctx = self.model.n_ctx
        if n_prompt + (1 if max_tokens is None or max_tokens > 0 else 0) > n_ctx:
            raise PromptTooLongError(n_prompt, n_ctx)


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


class _LazySpecials:
    """The vocabulary's control-token texts, computed only if a template needs them."""

    def __init__(self, prompts: Prompts) -> None:
        self._prompts = prompts

    def __iter__(self) -> Iterator[str]:
        return iter(self._prompts.special_texts())


__all__ = ["Prompts", "Vocabulary"]
