"""Ollama-compatible endpoints for clients set up for an "Ollama" provider: `/api/tags`, `/api/show`, `/api/chat`,
`/api/generate` (NDJSON streaming, on by default as in Ollama), `/api/ps`, `/api/version`. Shapes: Ollama's docs/api.md
and api/types.go.

Each is a translation over the same engine call as the OpenAI routes. `options` map onto edgespec's settings
(`num_predict`, `temperature`, `top_k`, `top_p`, `min_p`, `seed`, `stop`, `repeat_penalty`, `repeat_last_n`,
`presence_penalty`, `frequency_penalty`); load-time options that never change the output (`num_thread`, `num_gpu`,
`num_batch`, `use_mmap`, ...) and `keep_alive` are accepted and reported in the `X-Edgespec-Ignored-Params` header;
an option or field that would change the answer and cannot be honoured (`mirostat`, `template`, `images`, `think`,
a `num_ctx` larger than the server's context...) is a 400 naming it. `format` ("json" or a JSON schema) is structured
output and `tools` (chat) are tool calls, through the same constraints as the OpenAI routes; a tool call comes back
as Ollama writes it, `message.tool_calls: [{"function": {"name", "arguments": {...}}}]` (with streaming, in one
line before the last); Ollama has no `tool_choice`, edgespec takes OpenAI's values there (default "auto"). Errors have Ollama's shape, `{"error": "<message>"}`.

`logprobs: true` (with `top_logprobs` 0-20) answers `logprobs: [{"token", "logprob", "bytes", "top_logprobs"}]` per
generated token, in each streamed line for its tokens and whole in a single answer (the engine's log-probabilities,
as on the OpenAI routes). `/api/generate` (not `raw`) returns `context`: the prompt's token ids and the generated
ones; sent back, it is continued at the token level (the new turn is rendered with the chat template, without a
BOS and without a system prompt of the model, after those tokens), where Ollama detokenizes it into the prompt text.
`/api/version` answers the oldest Ollama version with every API feature served here (OLLAMA_VERSION), so clients that
gate features on the version enable them; edgespec's own version is beside it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Annotated, Any, Mapping

import anyio
from pydantic import Field, Strict
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Send

from edgespec import __version__
from edgespec.errors import ConfigError, TemplateError
from . import schema
from . import sse
from . import by_name, core
from .core import JSON, ServerState, read_body, send_json, server_state
from .responses import GenerationResponse, edgespec_stats, timings
from .api_errors import APIError, bad, unsupported
from .pool import is_pinned, param_size, parse_keep_alive
from .bodies import Body, Bool, ErrorText, Str, validate_body
from .schema import CompletionRequest, InfillInput

if TYPE_CHECKING:  # importing the server loads no llama.cpp
    from edgespec.runtime.engine import Engine

NDJSON_HEADERS = [(b"content-type", b"application/x-ndjson"), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
# options -> the OpenAI-style key schema reads
OPTION_KEYS = {
    "num_predict": "n_predict", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
    "seed": "seed", "stop": "stop", "repeat_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
}
# options that only say how to load or run the model: they never change the answer
RUNTIME_OPTIONS = frozenset({"num_keep", "num_thread", "num_gpu", "main_gpu", "num_batch", "use_mmap", "use_mlock",
                             "low_vram", "f16_kv", "vocab_only", "numa", "logits_all", "embedding_only"})
# options that would change the answer, with the value that leaves it unchanged
NEUTRAL_OPTIONS = {"mirostat": 0, "tfs_z": 1, "typical_p": 1, "penalize_newline": None}
CHAT_KEYS = frozenset({"model", "messages", "stream", "options", "keep_alive", "format", "tools", "tool_choice", "think",
                       "logprobs", "top_logprobs"})
GENERATE_KEYS = frozenset({"model", "prompt", "suffix", "system", "template", "raw", "context", "images", "stream",
                           "options", "keep_alive", "format", "think", "logprobs", "top_logprobs"})
OLLAMA_VERSION = "0.12.11"  # the first Ollama with logprobs, the newest feature of its API served here


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def ollama_error(e: APIError) -> Response:
    """Ollama's error shape: one string, which names the field at fault."""
    msg = e.message if not e.param or e.param in e.message else f"{e.param}: {e.message}"
    return JSON({"error": msg}, status_code=e.status, headers=e.headers)


# --------------------------------------------------------------------------------------------- parsing
class OllamaBody(Body):
    """The fields of /api/chat and /api/generate checked here (Ollama's wording of their errors); `options` are
    mapped by _options, `messages` and the rest by schema.parse_chat / parse_completion."""

    stream: Annotated[Bool | None, ErrorText("stream must be true or false")] = None
    options: Annotated[dict[str, Any] | None, ErrorText("options must be an object")] = None
    logprobs: Annotated[Bool | None, ErrorText("logprobs must be true or false")] = None
    top_logprobs: Annotated[Annotated[int, Strict()] | None, Field(ge=0, le=20), ErrorText("top_logprobs must be between 0 and 20")] = None


class OllamaGenerateBody(OllamaBody):
    prompt: Annotated[Str | None, ErrorText("prompt must be a string")] = None
    suffix: Annotated[Str | None, ErrorText("suffix must be a string")] = None
    system: Annotated[Str | None, ErrorText("system must be a string")] = None
    raw: Annotated[Bool | None, ErrorText("raw must be true or false")] = None
    context: Annotated[list[Annotated[int, Strict()]] | None,
                       ErrorText("context must be an array of token ids (the context of an earlier answer)")] = None


def _options(opts: dict[str, Any] | None, n_ctx: int) -> tuple[dict[str, Any], list[str]]:
    """`options` as schema keys, and the names accepted without effect."""
    if opts is None:
        return {}, []
    out: dict[str, Any] = {}
    ignored = []
    for k, v in opts.items():
        if k in OPTION_KEYS:
            out[OPTION_KEYS[k]] = v
        elif k == "num_ctx":
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise bad("options.num_ctx", "options.num_ctx must be a positive integer")
            if v > n_ctx:
                raise unsupported("options.num_ctx", f"options.num_ctx {v} exceeds this server's context ({n_ctx}); "
                                  "start the server with a larger --ctx")
            ignored.append("options.num_ctx")  # a smaller window: the answer is the same until the context fills
        elif k in RUNTIME_OPTIONS:
            ignored.append(f"options.{k}")
        elif k in NEUTRAL_OPTIONS:
            neutral = v is None or k == "penalize_newline" or (not isinstance(v, bool) and v == NEUTRAL_OPTIONS[k])
            if not neutral:
                raise unsupported(f"options.{k}", f"options.{k} is not supported by this server")
            ignored.append(f"options.{k}")
        else:
            raise unsupported(f"options.{k}", f"options.{k} is not a setting this server knows")
    if out.get("n_predict") == -2:  # Ollama: fill the context
        out["n_predict"] = -1
    return out, ignored


def _refuse(body: Mapping[str, Any]) -> None:
    for key, fine in (("think", lambda v: v in (None, False)), ("images", lambda v: v in (None, [])),
                      ("template", lambda v: v in (None, ""))):
        if not fine(body.get(key)):
            what = {"think": "think is not supported (not a reasoning model server)", "images": "images are not supported (text only)",
                    "template": "a custom template is not supported (the model's own chat template is used)"}[key]
            raise unsupported(key, what)


def _logprobs(m: OllamaBody) -> int | None:
    """Ollama's logprobs / top_logprobs as the engine's setting (None: off; else how many alternatives)."""
    return (m.top_logprobs or 0) if m.logprobs else None


def _context(v: list[int] | None, n_vocab: int) -> list[int]:
    if v is None:
        return []
    wrong = [t for t in v if not 0 <= t < n_vocab]
    if wrong:
        raise bad("context", f"context: token id {wrong[0]} is outside the vocabulary (size {n_vocab})")
    return list(v)


def _common(body: Mapping[str, Any], n_ctx: int, known: frozenset[str], m: OllamaBody) -> tuple[dict[str, Any], tuple[str, ...]]:
    _refuse(body)
    opts, ign = _options(m.options, n_ctx)
    stream = m.stream is not False  # streaming is on by default, as in Ollama
    ka = body.get("keep_alive")
    ignored = sorted(k for k in body if k not in known)
    if ka is not None:
        ignored.append("keep_alive")  # the model stays loaded for the server's life
    mapped = {**opts, "stream": stream}
    if isinstance(body.get("model"), str):
        mapped["model"] = body["model"]
    fmt = body.get("format")
    if fmt == "json":
        mapped["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        mapped["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    elif fmt not in (None, ""):
        raise bad("format", 'format must be "json" or a JSON schema (an object)')
    return mapped, tuple(ignored + ign)


# the keys of the mapped body -> the Ollama field they came from (for the errors schema raises)
FROM_OLLAMA = {**{v: f"options.{k}" for k, v in OPTION_KEYS.items()}, "response_format": "format"}


def _parse(parse: Any, mapped: Mapping[str, Any]) -> CompletionRequest:
    """schema.parse_chat / parse_completion of the mapped body, its errors naming the Ollama field (options.temperature,
    not temperature)."""
    try:
        return parse(mapped)
    except APIError as e:
        p = e.param or ""
        head = p.split(".", 1)[0].split("[", 1)[0]
        if head not in FROM_OLLAMA:
            raise
        name = FROM_OLLAMA[head]
        msg = e.message.replace(head, name, 1) if e.message.startswith(head) else e.message
        raise APIError(e.status, msg, param=name + p[len(head):], code=e.code, headers=e.headers) from None


def parse_ollama_chat(body: Mapping[str, Any], n_ctx: int, eng: Engine | None = None) -> CompletionRequest:
    ob = validate_body(OllamaBody, body)
    mapped, ignored = _common(body, n_ctx, CHAT_KEYS, ob)
    msgs = body.get("messages")
    if isinstance(msgs, list):
        for i, m in enumerate(msgs):
            if isinstance(m, dict) and m.get("images"):
                raise unsupported(f"messages[{i}].images", "images are not supported (text only)")
            if isinstance(m, dict) and m.get("thinking"):
                raise unsupported(f"messages[{i}].thinking", "thinking is not supported")
        msgs = [{k: v for k, v in m.items() if k not in ("images", "thinking", "tool_name")} if isinstance(m, dict) else m
                for m in msgs]
    tools = body.get("tools")
    if tools not in (None, []):
        if "response_format" in mapped:
            raise unsupported("format", "format together with tools is not supported; send one or the other")
        mapped["tools"] = tools
        if "tool_choice" in body:  # not Ollama's: an edgespec extension with the OpenAI values (default "auto")
            mapped["tool_choice"] = body["tool_choice"]
    req = _parse(schema.parse_chat, {**mapped, "messages": msgs})
    return replace(req, ignored=ignored, logprobs=_logprobs(ob))


def parse_ollama_generate(body: Mapping[str, Any], n_ctx: int, eng: Engine | None = None) -> CompletionRequest:
    """The request; with eng (the engine), a `context` is read and the prompt becomes its tokens and the new turn's."""
    m = validate_body(OllamaGenerateBody, body)
    mapped, ignored = _common(body, n_ctx, GENERATE_KEYS, m)
    lp = _logprobs(m)
    context = _context(m.context, eng.target.n_vocab) if eng is not None else []
    prompt, suffix, system, raw = m.prompt or "", m.suffix or "", m.system or "", bool(m.raw)
    if context and (suffix or raw):
        raise unsupported("context", "context cannot be combined with " + ("suffix" if suffix else "raw"))
    if suffix:
        req = _parse(schema.parse_completion, {**mapped, "prompt": prompt})
        return replace(req, prompt=None, ignored=ignored + (("system",) if system else ()), infill=InfillInput(prompt, suffix), logprobs=lp)
    if raw:
        req = _parse(schema.parse_completion, {**mapped, "prompt": prompt})
        return replace(req, ignored=ignored + (("system",) if system else ()), logprobs=lp)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    req = replace(_parse(schema.parse_chat, {**mapped, "messages": messages}), kind="completion", ignored=ignored, logprobs=lp)
    if not context:
        return req
    if eng is None:
        raise bad("context", "context needs the model's template: the model is not loaded")
    try:  # the new turn after the earlier tokens (no second BOS)
        turn = eng.segment_tokens(eng.chat_segments(req.messages or []), add_bos=False)
    except (ConfigError, TemplateError) as e:
        raise bad("prompt", str(e)) from None
    return replace(req, messages=None, prompt_tokens=context + turn)


# --------------------------------------------------------------------------------------------- the answer
class OllamaResponse(GenerationResponse):
    """One generation as Ollama writes it: one JSON object, or NDJSON lines ending with `"done": true` and the
    counts (durations in nanoseconds)."""

    chat = True

    def _piece(self, text: str, calls: list[dict[str, Any]] | None = None, lps: list[Any] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "created_at": _now()}
        if self.chat:
            out["message"] = {"role": "assistant", "content": text}
            if calls:
                out["message"]["tool_calls"] = calls
        else:
            out["response"] = text
        if self.req.logprobs is not None and lps is not None:
            out["logprobs"] = self._token_logprobs(lps)
        return out

    def _wants_context(self) -> bool:
        return not self.chat and (self.req.messages is not None or self.req.infill is not None
                                                                  or self.req.prompt is None)

    def _tool_calls(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """(content, Ollama tool calls) of a chat answer when tools were offered, else (text, [])."""
        content, calls = self._tool_calls_in(text) if self.chat else (text, [])
        if not calls:
            return text, []
        return content or "", [{"function": {"name": c["function"]["name"], "arguments": _arguments(c)}} for c in calls]

    def _final(self, reason: str, text: str, calls: list[dict[str, Any]] | None = None, lps: list[Any] | None = None) -> dict[str, Any]:
        s = self.gen.stats
        t = timings(s)
        out = self._piece(text, calls, lps)
        if self._wants_context():
            out["context"] = self.prompt_ids + list(self.gen.token_ids)
        out.update({
            "done": True,
            "done_reason": reason,
            "total_duration": int((s.wall + s.timings.queue) * 1e9),
            "load_duration": 0,
            "prompt_eval_count": s.n_prompt,
            "prompt_eval_duration": int(t["prompt_ms"] * 1e6),
            "eval_count": s.n_generated,
            "eval_duration": int(t["predicted_ms"] * 1e6),
            "edgespec": edgespec_stats(s, self.req, self.drafter),
        })
        return out

    async def _complete(self, send: Send) -> None:
        async for chunk in self._chunks():
            self._track(chunk)
        if self.client_left:
            return
        api, reason = self._outcome()
        if api is not None:
            await send_json(send, api.status, {"error": api.message}, api.headers)
            return
        content, calls = self._tool_calls(self.gen.text)
        await send_json(send, 200, self._final(reason, content, calls, self.logprobs), self.headers)

    async def _stream(self, send: Send) -> None:
        await self._start(send, NDJSON_HEADERS)

        async def line(obj: Any) -> None:
            await send({"type": "http.response.body", "body": sse.dumps(obj) + b"\n", "more_body": True})

        hold = self.chat and self.req.tool_choice != "none"  # a tool call is only known whole: sent at the end
        async for chunk in self._chunks():
            self._track(chunk)
            if self.client_left or not chunk.text or hold:
                continue
            await line({**self._piece(chunk.text, lps=chunk.logprobs or []), "done": False})
        if self.client_left:
            return
        api, reason = self._outcome()
        if api is None and hold:
            content, calls = self._tool_calls(self.gen.text)
            if content or calls:
                await line({**self._piece(content, calls, self.logprobs), "done": False})
        await line({"error": api.message} if api is not None else self._final(reason, ""))
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _arguments(call: Mapping[str, Any]) -> Any:
    """An OpenAI tool call's arguments (a JSON string) as Ollama sends them: the object itself."""
    try:
        return json.loads(call["function"]["arguments"])
    except ValueError:
        return call["function"]["arguments"]


class OllamaGenerateResponse(OllamaResponse):
    chat = False


# --------------------------------------------------------------------------------------------- routes
async def _bound(request: Request, cls: type[OllamaResponse]) -> tuple[ServerState, dict[str, Any]] | Response:
    """The body and the state of the model it names (core.read_bound, with the body's keep_alive for a pooled model),
    or the answer to a request that only unloads a pooled model (keep_alive 0 and no prompt, as Ollama)."""
    state = server_state(request)
    if state.pool is None:
        return state, await read_body(request)
    body = await core.read_json(request, state.settings.max_body_bytes)
    name, ka = body.get("model"), body.get("keep_alive")
    empty = (not body.get("prompt") and not body.get("suffix")) if cls is OllamaGenerateResponse else body.get("messages") == []
    if empty and ka is not None and parse_keep_alive(ka) == 0 and not is_pinned(state, name) and isinstance(name, str):
        plan = await anyio.to_thread.run_sync(state.pool.plan, name)
        state.pool.unload(plan.name)
        done = {"model": name, "created_at": _now(), "done": True, "done_reason": "unload"}
        return JSON({**done, **({"response": ""} if cls is OllamaGenerateResponse else {"message": {"role": "assistant", "content": ""}})})
    bound = await core.bind_body(state, body, ka)
    if bound is not state:
        body = {k: v for k, v in body.items() if k != "keep_alive"}  # honoured: not reported as ignored
    return bound, body


async def _run(request: Request, parse: Any, cls: type[OllamaResponse], kind: str) -> Any:
    try:
        got = await _bound(request, cls)
        if isinstance(got, Response):
            return got
        state, body = got
        eng = state.loaded
        if cls is OllamaGenerateResponse and not body.get("prompt") and not body.get("suffix"):
            _common(body, eng.target.n_ctx, GENERATE_KEYS, validate_body(OllamaBody, body))  # the checks still apply
            # Ollama: an empty prompt loads the model and answers at once
            return JSON({"model": state.model_id, "created_at": _now(), "response": "", "done": True, "done_reason": "load"})
        if cls is OllamaResponse and body.get("messages") == [] and state is not server_state(request):
            # Ollama: a chat with no messages loads the model and answers at once
            return JSON({"model": state.model_id, "created_at": _now(), "message": {"role": "assistant", "content": ""},
                         "done": True, "done_reason": "load"})
        return await core.generate(request, lambda b: parse(b, eng.target.n_ctx, eng), kind, cls, body=body, state=state)
    except APIError as e:
        return ollama_error(e)


async def chat(request: Request) -> Any:
    return await _run(request, parse_ollama_chat, OllamaResponse, "chat")


async def generate(request: Request) -> Any:
    return await _run(request, parse_ollama_generate, OllamaGenerateResponse, "completion")


def _ollama_name(state: Any) -> str:
    return by_name.ollama_name(state.model_id)


def _details(eng: Engine) -> dict[str, Any]:
    info = eng.target.info
    return {"parent_model": "", "format": "gguf", "family": info.architecture, "families": [info.architecture],
            "parameter_size": param_size(info.n_params), "quantization_level": info.quantization}


def _listed(state: ServerState, eng: Engine) -> dict[str, Any]:
    """The fields /api/tags and /api/ps list the served model with."""
    name = _ollama_name(state)
    return {"name": name, "model": name, "size": eng.target.info.file_size, "digest": "", "details": _details(eng)}


def _modified(eng: Engine) -> str:
    return datetime.fromtimestamp(eng.target.info.path.stat().st_mtime, timezone.utc).isoformat().replace("+00:00", "Z")


async def tags(request: Request) -> Response:
    """The pinned model, then every model served by name."""
    state = server_state(request)
    try:
        pinned = [] if state.pool is not None and not state.pinned else [state.require_engine()]
        listed = [{**_listed(state, eng), "modified_at": _modified(eng)} for eng in pinned]
        names = {m["name"] for m in listed}
        listed += [m for m in await anyio.to_thread.run_sync(by_name.ollama_tags, state) if m["name"] not in names]
    except APIError as e:
        return ollama_error(e)
    return JSON({"models": listed})


async def show(request: Request) -> Response:
    state = server_state(request)
    try:
        if state.pool is not None:
            found = await _show_pooled(request, state)
            if isinstance(found, Response):
                return found
            state = found
        body = await read_body(request) if state.pool is None else {"model": state.model_id}
        eng = state.loaded
        want = body.get("model", body.get("name"))
        if not isinstance(want, str) or not want:
            raise bad("model", "model is required")
        if want not in (state.model_id, _ollama_name(state)):
            raise APIError(404, f"model '{want}' not found (this server serves '{_ollama_name(state)}')", param="model")
    except APIError as e:
        return ollama_error(e)
    return _show(eng)


async def _show_pooled(request: Request, state: ServerState) -> ServerState | Response:
    """/api/show with a pool: the pinned model's state or a loaded pooled model's (its full answer), or the answer
    from the model list for a model not loaded (show does not load it)."""
    body = await core.read_json(request, state.settings.max_body_bytes)
    want = body.get("model", body.get("name"))
    if not isinstance(want, str) or not want:
        raise bad("model", "model is required")
    if is_pinned(state, want):
        state.require_engine()
        return state
    plan = await anyio.to_thread.run_sync(state.pool.plan, want)  # 404 with the close matches
    held = state.pool.get(plan.name)
    e = await anyio.to_thread.run_sync(by_name.entry, state, plan.name)
    if held is not None and not held.engine.closed:
        return _show(held.engine)
    details = by_name.ollama_details(e) if e is not None else {}
    info = {"general.architecture": details.get("family", ""), "general.name": plan.name}
    return JSON({"modelfile": "", "parameters": "", "template": "", "details": details, "model_info": info,
                 "capabilities": ["completion"], "modified_at": by_name.iso(e.modified) if e is not None else _now()})


def _show(eng: Engine) -> Response:
    info = eng.target.info
    try:
        infill = not eng.fim_tokens().missing
    except Exception:  # noqa: BLE001 - a vocabulary that cannot say: no infill
        infill = False
    model_info = {"general.architecture": info.architecture, "general.name": info.name or "",
                  "general.parameter_count": info.n_params, f"{info.architecture}.context_length": info.context_length,
                  "edgespec.n_ctx": eng.target.n_ctx, "edgespec.drafter": eng.drafter_kind}
    return JSON({"modelfile": "", "parameters": "", "template": eng.target.chat_template or "", "details": _details(eng),
                 "model_info": model_info, "capabilities": ["completion", "tools"] + (["insert"] if infill else []),
                 "modified_at": _modified(eng)})


async def ps(request: Request) -> Response:
    """The models loaded: the pinned one (for the server's life: it never expires), then the pool's, each with when
    it unloads."""
    state = server_state(request)
    try:
        pinned = [] if state.pool is not None and not state.pinned else [state.require_engine()]
    except APIError as e:
        return ollama_error(e)
    loaded = [{**_listed(state, eng), "expires_at": NEVER, "size_vram": 0, "context_length": eng.target.n_ctx} for eng in pinned]
    return JSON({"models": loaded + await anyio.to_thread.run_sync(by_name.ollama_ps, state)})


NEVER = "2318-08-08T00:00:00Z"  # Ollama's expires_at for a model kept loaded (keep_alive < 0): far in the future


async def version(request: Request) -> Response:
    return JSON({"version": OLLAMA_VERSION, "edgespec": __version__})


__all__ = ["chat", "generate", "tags", "show", "ps", "version", "parse_ollama_chat", "parse_ollama_generate"]
