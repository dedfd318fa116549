"""llama-server's native endpoints, for clients set up for a "llama.cpp" provider (editor plugins such as llama.vim
and llama.vscode, desktop front-ends): `/v1/health`, `/props`, `/completion`, `/infill`, `/tokenize`, `/detokenize`,
`/apply-template`. Each is a translation over the same engine call as the OpenAI routes (shapes: llama.cpp's
tools/server/README.md).

A request field of llama-server that edgespec cannot honour is a 400 naming it (refused.UNSUPPORTED); the others it
does not read are listed in the `X-Edgespec-Ignored-Params` header. `cache_prompt` is accepted: the KV cache is
always reused, which never changes the output.

What the editor plugins send (llama.vim, llama.vscode) is honoured as llama-server does: `samplers` (server/samplers.py),
`n_predict: 0` (the prompt is evaluated into the cache and an empty completion comes back: the plugins' warm-up
request), `response_fields` (the answer holds only those fields, a nested one under its flattened path such as
`timings/prompt_n`), `n_indent` (infill.indent_cut) and `t_max_predict_ms`. `t_max_prompt_ms` is not implemented
by llama-server either and is reported ignored, like `n_cmpl` (one completion comes back, which the plugin accepts).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Annotated, Any, Mapping

import anyio
from pydantic import Field, Strict
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Send

from edgespec import __version__
from edgespec.config import API_SAMPLING
from edgespec.errors import ConfigError, EdgespecError, TemplateError
from edgespec.prompts.infill import ExtraChunk, indent_cut
from edgespec.config import DrafterKind
from . import schema
from . import sse
from .core import JSON, generate, read_bound, send_json, server_state
from .responses import GenerationResponse, edgespec_stats, ignored_headers, timings
from .api_errors import APIError, bad
from .bodies import Body, Bool, ErrorText, JsonNumber, Str, validate_body
from .refused import ignored_keys
from .schema import CompletionRequest, InfillInput

# llama-server keys read here besides bodies.COMMON_KEYS (cache_prompt and id_slot are accepted and have no effect)
COMPLETION_KEYS = frozenset({"prompt", "cache_prompt", "id_slot", "return_tokens", "t_max_predict_ms", "response_fields", "n_indent"})
INFILL_KEYS = COMPLETION_KEYS | {"input_prefix", "input_suffix", "input_extra"}
INT32_MAX = 2**31 - 1  # llama-server reads n_indent and id_slot into an int32
STOP_TYPE = {"eos": "eos", "stop": "word", "length": "limit", "context": "limit"}
# /tokenize's content, in UTF-8 bytes (each may be a token id: a Python int in the list, a number in the JSON; with
# pieces an object each): 4 MiB is ~4M ids at most, ~0.2 GiB; a 28 MB content took 1-2 GiB
TOKENIZE_MAX_BYTES = 4 * 2**20
TOKENIZE_PIECES_MAX_BYTES = 2**20


# --------------------------------------------------------------------------------------------- parsing
class LlamaBody(Body):
    """What /completion reads besides bodies.CommonBody (llama-server's own fields; its wording of their errors)."""

    response_fields: Annotated[list[Str] | None, ErrorText("response_fields must be an array of field names (a nested one as a/b)")] = None
    n_indent: Annotated[Annotated[int, Strict()] | None, Field(ge=0, le=INT32_MAX),
                        ErrorText("n_indent must be an integer >= 0 (the least indentation of the lines after the first)")] = None
    t_max_predict_ms: Annotated[JsonNumber | None, Field(ge=0), ErrorText("t_max_predict_ms must be a number of milliseconds >= 0")] = None
    return_tokens: Annotated[Bool | None, ErrorText("return_tokens must be true or false")] = None
    # accepted without effect (the KV cache is always reused; the server picks the slot), but checked as llama-server
    # reads them
    cache_prompt: Annotated[Bool | None, ErrorText("cache_prompt must be true or false")] = None
    id_slot: Annotated[Annotated[int, Strict()] | None, Field(ge=-1, le=INT32_MAX),
                       ErrorText("id_slot must be an integer >= -1 (-1: any slot)")] = None

    @property
    def t_max(self) -> float | None:
        """t_max_predict_ms in seconds (None: no limit; 0 is none too)."""
        v = self.t_max_predict_ms
        return float(v) / 1000 if v is not None and v > 0 else None


class ExtraFile(Body):
    text: Str = ""
    filename: Str = "tmp"


class InfillBody(LlamaBody):
    """What /infill reads besides bodies.CommonBody."""

    prompt: Annotated[Str | None, ErrorText("prompt must be a string (text typed after input_prefix)")] = None
    input_prefix: Annotated[Str | None, ErrorText("input_prefix must be a string")] = None
    input_suffix: Annotated[Str | None, ErrorText("input_suffix must be a string")] = None
    input_extra: Annotated[list[ExtraFile] | None, ErrorText("input_extra must be an array of {\"filename\", \"text\"} objects",
                                                        item="{where} must be an object with string text and filename")] = None


class TokenizeBody(Body):
    content: Annotated[Str | None, ErrorText("content must be a string")] = None
    add_special: Annotated[Bool | None, ErrorText("add_special must be true or false")] = None
    parse_special: Annotated[Bool | None, ErrorText("parse_special must be true or false")] = None
    with_pieces: Annotated[Bool | None, ErrorText("with_pieces must be true or false")] = None


class DetokenizeBody(Body):
    tokens: Annotated[list[Annotated[int, Strict()]] | None, ErrorText("tokens must be an array of token ids")] = None


def _llama_body(body: Mapping[str, Any], known: frozenset[str]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The body without llama-server's own keys (what schema.parse_completion reads) and the keys ignored
    (`n_predict: 0` is taken out too: see _warm_only)."""
    ignored = ignored_keys(body, known)
    drop = known | ({"n_predict"} if _warm_only(body) else set())
    return {k: v for k, v in body.items() if k not in drop or k == "prompt"}, ignored


def _warm_only(body: Mapping[str, Any]) -> bool:
    """n_predict 0: llama-server evaluates the prompt into the cache and generates nothing."""
    v = body.get("n_predict")
    return not isinstance(v, bool) and isinstance(v, (int, float)) and v == 0


def _with_limit(req: CompletionRequest, body: Mapping[str, Any]) -> CompletionRequest:
    return replace(req, max_tokens=0) if _warm_only(body) and req.max_tokens is None else req


def pick_fields(obj: Mapping[str, Any], paths: tuple[str, ...]) -> dict[str, Any]:
    """llama-server's response_fields: for each path ("a" or "a/b/c"), the value found there under that path as a
    key; a path that leads nowhere is left out."""
    out: dict[str, Any] = {}
    for path in paths:
        cur: Any = obj
        for key in path.split("/"):
            if not isinstance(cur, Mapping) or key not in cur:
                break
            cur = cur[key]
        else:
            out[path] = cur
    return out


def parse_llama_completion(body: Mapping[str, Any], m: LlamaBody | None = None) -> CompletionRequest:
    rest, ignored = _llama_body(body, COMPLETION_KEYS)
    req = schema.parse_completion(rest)
    return replace(_with_limit(req, body), ignored=ignored)


def parse_infill(body: Mapping[str, Any], m: InfillBody | None = None) -> CompletionRequest:
    m = m if m is not None else validate_body(InfillBody, body)
    rest, ignored = _llama_body(body, INFILL_KEYS)
    rest.pop("prompt", None)
    chunks = tuple(ExtraChunk(c.text, c.filename) for c in m.input_extra or ())
    req = _with_limit(schema.parse_completion({**rest, "prompt": m.prompt or ""}), body)
    return replace(req, prompt=None, ignored=ignored,
                   infill=InfillInput(m.input_prefix or "", m.input_suffix or "", chunks, m.prompt or ""))


# --------------------------------------------------------------------------------------------- the answer
class LlamaCompletionResponse(GenerationResponse):
    """One /completion or /infill generation in llama-server's shape: a JSON object, or SSE `data:` events with
    `content` and `stop`, the last one (`stop: true`) with the totals; no `[DONE]`."""

    t_max: float | None = None
    return_tokens: bool = False
    prompt_text: str = ""
    fields: tuple[str, ...] | None = None  # response_fields
    n_indent: int = 0

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.id = "cmpl-" + self.id.split("-", 1)[1]
        self.timed_out = False  # stopped here: t_max_predict_ms or n_indent
        self._first: float | None = None
        self._newline = False
        self._text = ""  # the text so far (n_indent)
        self._nl = 0  # where indent_cut looks from
        self.cut: int | None = None  # n_indent: the completion ends here

    def _check(self, text: str) -> str:
        """After each piece of text: the time and indentation limits; the part of the piece to send."""
        self._check_time(text)
        if not self.n_indent or self.cut is not None:
            return text if self.cut is None else ""
        before = len(self._text)
        self._text += text
        cut = indent_cut(self._text, self.n_indent, self._nl)
        self._nl = max(self._nl, self._text.rfind("\n"))
        if cut is None:
            return text
        self.cut = cut
        if not self.gen.done:
            self.timed_out = True
            self.gen.cancel()
        return text[: max(0, cut - before)]

    def _content(self) -> str:
        return self.gen.text if self.cut is None else self.gen.text[: self.cut]

    def _check_time(self, text: str) -> None:
        """t_max_predict_ms: stop once the time since the first token is past it and a newline was generated."""
        if self.t_max is None:
            return
        now = time.monotonic()
        if self._first is None:
            self._first = now
        self._newline = self._newline or "\n" in text
        if self._newline and now - self._first > self.t_max and not self.gen.done:
            self.timed_out = True
            self.gen.cancel()

    def _result(self) -> tuple[APIError | None, str]:
        if self.cut is not None and self._error() is None:  # n_indent: cut here, however the generation then ended
            return None, "limit"
        if self.timed_out and self._error() is None and self.gen.finish_reason == "cancelled":
            return None, "limit"
        api, _ = self._outcome()
        if api is not None:
            return api, ""
        return None, STOP_TYPE.get(self.gen.finish_reason, "limit")

    def _final(self, stop_type: str, content: str) -> dict[str, Any]:
        stats = self.gen.stats
        text = self._content()
        out: dict[str, Any] = {
            "index": 0,
            "content": content,
            "tokens": list(self.gen.token_ids) if self.return_tokens else [],
            "id_slot": 0,
            "stop": True,
            "model": self.model,
            "tokens_predicted": stats.n_generated,
            "tokens_evaluated": stats.n_prompt,
            "generation_settings": self._settings(),
            "prompt": self.prompt_text,
            "has_new_line": "\n" in text,
            "truncated": self.gen.finish_reason == "context",
            "stop_type": stop_type,
            "stopping_word": self._stopping_word() if stop_type == "word" else "",
            "tokens_cached": stats.n_cached,
            "timings": timings(stats),
            "edgespec": edgespec_stats(stats, self.req, self.drafter),
        }
        return out if self.fields is None else pick_fields(out, self.fields)

    def _settings(self) -> dict[str, Any]:
        s = self.req.sampling
        return {
            "n_ctx": self.state.loaded.target.n_ctx, "n_predict": self.record.max_tokens, "model": self.model,
            "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p, "seed": s.seed,
            "repeat_penalty": s.repeat_penalty, "repeat_last_n": s.repeat_last_n, "presence_penalty": s.presence_penalty,
            "frequency_penalty": s.frequency_penalty, "stop": list(self.req.stop), "stream": self.req.stream,
            "speculative": self.req.speculative,
        }

    def _stopping_word(self) -> str:
        full = self.state.loaded.target.detokenize(self.gen.token_ids)
        rest = full[len(self.gen.text):]
        return next((s for s in self.req.stop if rest.startswith(s)), next((s for s in self.req.stop if s in rest), ""))

    async def _complete(self, send: Send) -> None:
        async for chunk in self._chunks():
            self._check(chunk.text)
        if self.client_left:
            return
        api, stop_type = self._result()
        if api is not None:
            await send_json(send, api.status, api.body(), api.headers)
            return
        await send_json(send, 200, self._final(stop_type, self._content()), self.headers)

    async def _stream(self, send: Send) -> None:
        await self._start(send)

        async def body(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        n_prompt = self.record.n_prompt
        async for chunk in self._chunks():
            text = self._check(chunk.text)
            if self.client_left or not text:
                continue
            await body(sse.event({"index": 0, "content": text, "tokens": chunk.tokens, "stop": False, "id_slot": 0,
                                  "tokens_predicted": len(self.gen.token_ids), "tokens_evaluated": n_prompt}))
        if self.client_left:
            return
        api, stop_type = self._result()
        await body(sse.event(api.body() if api is not None else self._final(stop_type, "")))
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _response_for(body_hint: dict[str, Any]) -> type[LlamaCompletionResponse]:
    """A response class carrying the per-request llama-server options the writer needs."""
    return type("LlamaCompletion", (LlamaCompletionResponse,), body_hint)


async def _llama_generate(request: Request, parse: Any, kind: str, model: type[LlamaBody]) -> Any:
    state, body = await read_bound(request)
    try:
        m = validate_body(model, body)
    except APIError:
        server_state(request).metrics.rejected["invalid"] += 1
        raise
    hint = {"t_max": m.t_max, "return_tokens": bool(m.return_tokens),
            "prompt_text": body.get("prompt") if isinstance(body.get("prompt"), str) else "",
            "fields": tuple(m.response_fields) or None if m.response_fields is not None else None,  # [] = every field
            "n_indent": m.n_indent or 0}
    return await generate(request, lambda _b: parse(body, m), kind, _response_for(hint), body=body, state=state)


async def completion(request: Request) -> Any:
    return await _llama_generate(request, parse_llama_completion, "completion", LlamaBody)


async def infill(request: Request) -> Any:
    return await _llama_generate(request, parse_infill, "infill", InfillBody)


# --------------------------------------------------------------------------------------------- tokens, templates, props
def _piece(b: bytes) -> Any:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return list(b)  # llama-server: a piece that is not whole UTF-8 is its bytes


async def tokenize(request: Request) -> Response:
    state, body = await read_bound(request)  # a pooled model's lease goes with `state` (pool.ModelState)
    m = validate_body(TokenizeBody, body)
    content = m.content
    if content is None:
        raise bad("content", "content is required", code="missing_required_parameter")
    flags = {"add_special": m.add_special is True, "parse_special": m.parse_special is not False, "with_pieces": m.with_pieces is True}
    limit = TOKENIZE_PIECES_MAX_BYTES if flags["with_pieces"] else TOKENIZE_MAX_BYTES
    size = len(content.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise bad("content", f"content is {size} bytes of UTF-8; /tokenize takes at most {limit}"
                  + (" with with_pieces" if flags["with_pieces"] else "") + " (send it in parts)")
    eng = state.loaded
    ids = await anyio.to_thread.run_sync(
        lambda: eng.target.tokenize(content, add_special=flags["add_special"], parse_special=flags["parse_special"]))
    out: Any = [{"id": t, "piece": _piece(eng.target.token_bytes(t, special=True))} for t in ids] if flags["with_pieces"] else ids
    return JSON({"tokens": out}, headers=ignored_headers(ignored_keys(body, {"content", "add_special", "parse_special", "with_pieces"})))


async def detokenize(request: Request) -> Response:
    state, body = await read_bound(request)
    toks = validate_body(DetokenizeBody, body).tokens
    eng = state.loaded
    if toks is None:
        raise bad("tokens", "tokens must be an array of token ids")
    bad_ids = [t for t in toks if not 0 <= t < eng.target.n_vocab]
    if bad_ids:
        raise bad("tokens", f"token id {bad_ids[0]} is outside the vocabulary (size {eng.target.n_vocab})")
    text = await anyio.to_thread.run_sync(lambda: eng.target.detokenize(toks, special=True))
    return JSON({"content": text}, headers=ignored_headers(ignored_keys(body, {"tokens"})))


async def apply_template(request: Request) -> Response:
    state, body = await read_bound(request)
    req = schema.parse_chat({"messages": body.get("messages")})
    eng = state.loaded
    try:
        prompt = await anyio.to_thread.run_sync(lambda: eng.render(req.messages or []))
    except (TemplateError, ConfigError) as e:
        raise bad("messages", str(e)) from None
    return JSON({"prompt": prompt}, headers=ignored_headers(ignored_keys(body, {"messages"})))


async def props(request: Request) -> Response:
    state = server_state(request)
    eng = state.require_engine()
    t = eng.target
    try:
        fim = eng.fim_tokens()
        can_infill = not fim.missing
    except EdgespecError:
        can_infill = False

    def text(tok: int) -> str:
        return t.token_bytes(tok, special=True).decode("utf-8", "replace") if 0 <= tok < t.n_vocab else ""

    d = API_SAMPLING
    return JSON({
        "default_generation_settings": {
            "id": 0, "id_task": -1, "n_ctx": t.n_ctx, "speculative": eng.drafter_kind != DrafterKind.NONE, "is_processing": False,
            "params": {"n_predict": -1, "temperature": d.temperature, "top_k": d.top_k, "top_p": d.top_p, "min_p": d.min_p, "seed": -1,
                       "repeat_penalty": d.repeat_penalty, "repeat_last_n": d.repeat_last_n, "speculative.n_max": eng.spec.draft_max},
        },
        "total_slots": eng.parallel,
        "deterministic": bool(t.spec.deterministic),  # serve --deterministic: batch-invariant decoding (docs/determinism.md)
        "slots_busy": eng.slot_state()["busy"],
        "model_alias": state.model_id,
        "model_path": t.spec.path,
        "chat_template": t.chat_template or "",
        "bos_token": text(t.bos),
        "eos_token": text(t.eos),
        "modalities": {"vision": False, "audio": False},
        "infill": can_infill,
        "build_info": f"edgespec-{__version__}",
    })


__all__ = ["completion", "infill", "tokenize", "detokenize", "apply_template", "props", "parse_infill", "parse_llama_completion"]
