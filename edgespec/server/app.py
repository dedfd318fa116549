"""The OpenAI-compatible HTTP layer: a Starlette app over one `Engine` (see docs/server.md).

    app = create_app(engine)                      # an Engine already loaded (the caller keeps owning it)
    app = create_app(lambda: Engine.load(...))    # loaded in a thread at startup; /health says 503 until then

The server is a thin layer: it parses requests (schema.py), queues a generation on the engine, and writes what
the generation yields, as one JSON response or as server-sent events (sse.py). It holds no llama.cpp state and no
generation logic: the engine's worker thread owns both models, runs one generation at a time in FIFO order and
keeps the KV cache across requests (a re-sent conversation decodes only its new tokens).

Each request holds its own `Generation` handle. A task watches the ASGI receive channel for `http.disconnect`
(a client that closes its stream, drops the connection or times out) and cancels the handle at once: a running
generation stops within one speculative cycle (or one prefill chunk), a queued one never starts. Writing to a
client that has left is never relied on to notice it.

To serve on a socket of your own (uvicorn's `Server.run(sockets=[...])`), create it with `proto=IPPROTO_TCP`: asyncio
turns TCP_NODELAY on for accepted connections only then, and without it each small SSE write can wait up to 40 ms
for the client's delayed ACK (`edgespec serve` does this).

Every answer carries the generation's statistics: `usage` (with `prompt_tokens_details.cached_tokens`, the
prompt tokens served from the KV cache), `timings` with llama-server's field names, and `edgespec` (μ, acceptance,
acceptance by draft position, drafting sources, the time split).
"""

from __future__ import annotations

import hmac
import inspect
import ipaddress
import logging
import secrets
import threading
import time
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import __version__
from ..errors import ConfigError, ContextFullError, EdgespecError, EngineClosedError, QueueFullError, TemplateError
from . import schema, sse
from .metrics import Metrics
from .schema import APIError, CompletionRequest

log = logging.getLogger("edgespec.server")

# Origins a browser page may call from without --cors-origin: pages served from this machine.
LOCAL_ORIGIN = r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:\d{1,5})?$"
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}
ROUTES = ("/health", "/v1/models", "/models", "/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions", "/metrics")
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}


# --------------------------------------------------------------------------------------------- settings, state
@dataclass(frozen=True)
class Settings:
    """How the server behaves (the engine's own settings live in the engine).

    api_key: when set, every endpoint but /health wants `Authorization: Bearer <api_key>` (401 otherwise).
    cors_origins: browser origins allowed besides pages served from localhost ("*" = any).
    host: the address the server listens on; on a loopback address, requests must name a loopback host in their
        Host header (a defence against DNS rebinding: a web page cannot reach the server through its own domain).
    model_alias: the model id to report (default: the target file's name without .gguf).
    max_body_bytes: the largest request body (413 beyond).
    retry_after: seconds a client is told to wait when the queue is full.
    history: how many finished requests' records to keep (RequestRecord; for tests and debugging).
    """

    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    model_alias: str | None = None
    max_body_bytes: int = 32 * 2**20
    retry_after: int = 1
    history: int = 1024


@dataclass
class RequestRecord:
    """What happened to one generation request (kept in ServerState.records)."""

    id: str
    kind: str
    stream: bool
    n_prompt: int
    max_tokens: int
    client_left: bool = False
    tokens_at_cancel: int | None = None  # tokens generated when the server cancelled the job
    started: bool | None = None  # False: cancelled while queued, never ran
    done: bool = False
    finish_reason: str | None = None  # the engine's ("eos", "stop", "length", "context", "cancelled") or "error"
    n_generated: int = 0
    overrun: int = 0  # tokens generated after the cancel (at most one speculative cycle's)
    error: str | None = None


@dataclass
class ServerState:
    settings: Settings
    engine: Any = None
    factory: Callable[[], Any] | None = None
    on_load_error: Callable[[BaseException], None] | None = None
    load_error: str | None = None
    loaded_at: int = 0
    metrics: Metrics = field(default_factory=Metrics)
    records: deque = field(default_factory=deque)
    closing: bool = False
    live: set = field(default_factory=set)  # GenerationResponses being written
    _spec_kw: bool = False  # Engine.stream accepts spec= (a per-generation SpecConfig)

    def set_engine(self, engine: Any) -> None:
        self._spec_kw = "spec" in inspect.signature(engine.stream).parameters
        self.loaded_at = int(time.time())
        self.engine = engine

    def require_engine(self) -> Any:
        if self.engine is None:
            if self.load_error is not None:
                raise APIError(503, f"the model failed to load: {self.load_error}", code="load_failed")
            raise APIError(503, "Loading model", code="loading")
        if self.closing or self.engine.closed:
            raise APIError(503, "the server is shutting down", code="shutting_down")
        return self.engine

    @property
    def model_id(self) -> str:
        if self.settings.model_alias:
            return self.settings.model_alias
        return _stem(self.engine.target.spec.path)

    # -- loading in a thread
    def start_loading(self) -> None:
        if self.factory is None:
            return
        threading.Thread(target=self._load, name="edgespec-load", daemon=True).start()

    def _load(self) -> None:
        assert self.factory is not None
        try:
            engine = self.factory()
        except BaseException as e:  # noqa: BLE001 - reported on /health and to the command
            self.load_error = str(e) if isinstance(e, EdgespecError) else f"{type(e).__name__}: {e}"
            log.error("the model failed to load: %s", self.load_error)
            if self.on_load_error is not None:
                self.on_load_error(e)
            return
        if self.closing:
            engine.close()
            return
        self.set_engine(engine)

    def begin_shutdown(self) -> None:
        """The server is stopping: refuse new generations and cancel those queued or running, so that their clients
        get a final error event at once instead of waiting out the graceful-shutdown timeout. Call it from the event
        loop's thread (e.g. uvicorn's signal handler)."""
        self.closing = True
        for response in list(self.live):
            response.gen.cancel()

    def shutdown(self) -> None:
        self.closing = True
        if self.factory is not None and self.engine is not None:
            self.engine.close()  # cancels what still runs; queued generations never start

    # -- per-request drafting limits
    def spec_kwargs(self, req: CompletionRequest) -> dict[str, Any]:
        """Engine.stream keywords for the request's draft limit (none when it does not bind)."""
        eng = self.engine
        if req.draft_max is None or not req.speculative or eng.drafter_kind == "none":
            return {}
        base = eng.spec
        n = req.draft_max
        # n-gram lookups draft up to ngram_draft_max only under the adaptive controller (fixed K drafts draft_max)
        ngram_binds = base.adaptive and "ngram" in eng.drafter_kind and n < base.ngram_draft_max
        if n >= base.draft_max and not ngram_binds:
            return {}
        spec = replace(base, draft_max=min(base.draft_max, n), ngram_draft_max=min(base.ngram_draft_max, n), draft_min=min(base.draft_min, n))
        if not self._spec_kw:
            raise schema.unsupported(
                "draft_max",
                f"this engine takes no per-request draft limit below the server's ({base.draft_max}, n-gram {base.ngram_draft_max}); "
                "start the server with --draft-max N, or send \"speculative\": false (or \"draft_max\": 0) for plain decoding",
            )
        return {"spec": spec}


def _stem(path: str) -> str:
    name = Path(path).name
    return name[:-5] if name.lower().endswith(".gguf") else name


def _state(request: Request) -> ServerState:
    return request.app.state.edgespec


# --------------------------------------------------------------------------------------------- statistics
def usage(stats: Any) -> dict[str, Any]:
    return {
        "prompt_tokens": stats.n_prompt,
        "completion_tokens": stats.n_generated,
        "total_tokens": stats.n_prompt + stats.n_generated,
        "prompt_tokens_details": {"cached_tokens": stats.n_cached},
    }


def timings(stats: Any) -> dict[str, Any]:
    """llama-server's per-request `timings` (its field names; other servers and tools read them)."""
    prompt_n = stats.n_prefill
    prompt_ms = stats.timings.prefill * 1000
    predicted_n = stats.n_generated
    predicted_ms = stats.decode_seconds * 1000 if predicted_n else 0.0
    return {
        "cache_n": stats.n_cached,
        "prompt_n": prompt_n,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / prompt_n, 3) if prompt_n else 0.0,
        "prompt_per_second": round(prompt_n * 1000 / prompt_ms, 3) if prompt_ms > 0 else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_ms / predicted_n, 3) if predicted_n else 0.0,
        "predicted_per_second": round(predicted_n * 1000 / predicted_ms, 3) if predicted_ms > 0 else 0.0,
        "draft_n": stats.n_drafted,
        "draft_n_accepted": stats.n_accepted,
    }


def edgespec_stats(stats: Any, req: CompletionRequest, drafter: str) -> dict[str, Any]:
    """The speculation statistics: μ, acceptance (overall, by draft position, by source), cycles, the time split."""
    d = stats.as_dict()
    for k in ("costs", "controller", "stop_reason"):
        d.pop(k, None)
    d["drafter"] = drafter if req.speculative else "none"
    return d


# --------------------------------------------------------------------------------------------- the generation response
class GenerationResponse:
    """An ASGI response that writes one generation (JSON or SSE) while watching for the client leaving."""

    def __init__(self, state: ServerState, req: CompletionRequest, gen: Any, record: RequestRecord) -> None:
        self.state = state
        self.req = req
        self.gen = gen
        self.record = record
        self.client_left = False
        self.created = int(time.time())
        self.id = ("chatcmpl-" if req.kind == "chat" else "cmpl-") + secrets.token_hex(12)
        self.model = state.model_id
        self.drafter = state.engine.drafter_kind
        self.spans: list[list[int]] = []  # [start, end) character ranges of text from accepted drafts
        self._chars = 0

    # -- the client leaving
    def _left(self) -> None:
        if self.client_left or self.gen.done:
            return
        self.client_left = True
        self.gen.cancel()
        self.record.client_left = True
        self.record.tokens_at_cancel = len(self.gen.token_ids)

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self._left()
                return

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.state.metrics.in_flight += 1
        self.state.live.add(self)
        if self.state.closing:
            self.gen.cancel()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch, receive)
                try:
                    if self.req.stream:
                        await self._stream(send)
                    else:
                        await self._complete(send)
                except OSError:  # a write to a client that has gone (servers that raise instead of ignoring it)
                    self._left()
                    await self._drain()
                finally:
                    tg.cancel_scope.cancel()
        finally:
            if not self.gen.done:
                self.gen.cancel()  # this task was cancelled (server shutting down): the job stops too
            self._finish()

    async def _drain(self) -> None:
        async for _ in self.gen:
            pass

    def _error(self) -> BaseException | None:
        try:
            self.gen.result(timeout=0)
        except TimeoutError:
            return None
        except BaseException as e:  # noqa: BLE001 - the generation's own error, reported to the client
            return e
        return None

    def _track(self, chunk: Any) -> None:
        n = len(chunk.text)
        if self.req.show_draft and chunk.from_draft and n:
            if self.spans and self.spans[-1][1] == self._chars:
                self.spans[-1][1] += n
            else:
                self.spans.append([self._chars, self._chars + n])
        self._chars += n

    def _stats_fields(self) -> dict[str, Any]:
        stats = self.gen.stats
        out = {"timings": timings(stats), "edgespec": edgespec_stats(stats, self.req, self.drafter)}
        if self.req.show_draft:
            out["edgespec"]["draft_spans"] = self.spans
        return out

    # -- non-streaming
    async def _complete(self, send: Send) -> None:
        async for chunk in self.gen:
            self._track(chunk)
        if self.client_left:
            return
        err = self._error()
        if err is not None:
            api = _api_error(err)
            await _send_json(send, api.status, api.body(), api.headers)
            return
        reason = FINISH.get(self.gen.finish_reason)
        if reason is None:  # cancelled by the server (shutting down), not by this client
            api = APIError(503, "the generation was cancelled: the server is shutting down", code="shutting_down")
            await _send_json(send, api.status, api.body())
            return
        stats = self.gen.stats
        text = self.gen.text
        if self.req.kind == "chat":
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            obj = "text_completion"
        body = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": f"edgespec-{__version__}",
            "choices": [choice],
            "usage": usage(stats),
            **self._stats_fields(),
        }
        await _send_json(send, 200, body)

    # -- streaming
    def _chunk(self, choice: dict[str, Any], **extra: Any) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.req.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": f"edgespec-{__version__}",
            "choices": [choice] if choice else [],
        }
        if self.req.include_usage:
            out["usage"] = None
        out.update(extra)
        return out

    def _delta_choice(self, text: str | None, finish: str | None, *, role: bool = False) -> dict[str, Any]:
        if self.req.kind == "chat":
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}

    def _text_template(self) -> tuple[bytes, bytes]:
        """The bytes around the text of a content chunk, built once (the JSON of a chunk minus its text)."""
        marker = "\ue000edgespec\ue000"
        frame = sse.event(self._chunk(self._delta_choice(marker, None)))
        head, tail = frame.split(sse.dumps(marker))
        return head, tail

    async def _stream(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": sse.HEADERS})

        async def body(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        if self.req.kind == "chat":
            await body(sse.event(self._chunk(self._delta_choice("", None, role=True))))
        head, tail = self._text_template()
        async for chunk in self.gen:
            self._track(chunk)
            if self.client_left or not chunk.text:
                continue
            if self.req.show_draft:
                choice = self._delta_choice(chunk.text, None)
                choice["from_draft"] = chunk.from_draft
                await body(sse.event(self._chunk(choice)))
            else:
                await body(head + sse.dumps(chunk.text) + tail)
        if self.client_left:
            return
        err = self._error()
        reason = FINISH.get(self.gen.finish_reason)
        if err is None and reason is None:
            err = APIError(503, "the generation was cancelled: the server is shutting down", code="shutting_down")
        if err is not None:
            await body(sse.event(_api_error(err).body()))
        else:
            stats = self.gen.stats
            extra = self._stats_fields()
            if not self.req.include_usage:
                extra["usage"] = usage(stats)
            await body(sse.event(self._chunk(self._delta_choice(None if self.req.kind == "chat" else "", reason), **extra)))
            if self.req.include_usage:
                await body(sse.event(self._chunk({}, usage=usage(stats))))
            await body(sse.DONE)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    # -- bookkeeping
    def _finish(self) -> None:
        self.state.live.discard(self)
        m = self.state.metrics
        m.in_flight -= 1
        rec = self.record
        stats = self.gen.stats
        err = self._error() if self.gen.done else None
        rec.done = self.gen.done
        rec.n_generated = len(self.gen.token_ids)
        rec.started = bool(stats.stop_reason) or err is not None
        rec.finish_reason = "error" if err is not None else (stats.stop_reason or "cancelled")
        if err is not None:
            rec.error = str(err)
        if rec.client_left:
            m.cancelled["running" if rec.started else "queued"] += 1
            rec.overrun = max(0, rec.n_generated - (rec.tokens_at_cancel or 0))
            m.cancel_overrun_max = max(m.cancel_overrun_max, rec.overrun)
        finish = "error" if err is not None else FINISH.get(stats.stop_reason, "cancelled")
        m.record_generation(stats, finish)
        self.state.records.append(rec)
        while len(self.state.records) > self.state.settings.history:
            self.state.records.popleft()


async def _send_json(send: Send, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
    data = sse.dumps(body)
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    hdrs += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": data, "more_body": False})


def _api_error(e: BaseException) -> APIError:
    """An exception from the engine as the HTTP error a client should see."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, ContextFullError):
        return APIError(400, str(e), code="context_length_exceeded")
    if isinstance(e, (ConfigError, TemplateError)):
        return APIError(400, str(e))
    if isinstance(e, QueueFullError):
        return APIError(503, f"the server is busy: {e}", code="queue_full")
    if isinstance(e, EngineClosedError):
        return APIError(503, "the server is shutting down", code="shutting_down")
    if isinstance(e, EdgespecError):
        return APIError(500, str(e), code="engine_error")
    log.error("generation failed", exc_info=e)
    return APIError(500, f"internal error: {type(e).__name__}", code="internal_error")


class JSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return sse.dumps(content)


def error_response(e: APIError) -> Response:
    return JSON(e.body(), status_code=e.status, headers=e.headers)


# --------------------------------------------------------------------------------------------- endpoints
async def health(request: Request) -> Response:
    try:
        _state(request).require_engine()
    except APIError as e:
        return error_response(e)
    return JSON({"status": "ok"})


async def models(request: Request) -> Response:
    state = _state(request)
    eng = state.require_engine()
    t, d = eng.target, eng.draft
    meta: dict[str, Any] = {
        "name": t.name,
        "path": t.spec.path,
        "n_ctx": t.n_ctx,
        "n_ctx_train": t.info.context_length,
        "n_vocab": t.n_vocab,
        "n_params": t.info.n_params,
        "size": t.info.file_size,
        "quantization": t.info.quantization,
        "drafter": eng.drafter_kind,
        "draft_max": eng.spec.draft_max,
        "adaptive": eng.spec.adaptive,
        "draft": None
        if d is None
        else {"id": _stem(d.spec.path), "name": d.name, "n_params": d.info.n_params, "size": d.info.file_size, "quantization": d.info.quantization},
    }
    card = {"id": state.model_id, "object": "model", "created": state.loaded_at, "owned_by": "edgespec", "meta": meta}
    return JSON({"object": "list", "data": [card]})


async def metrics(request: Request) -> Response:
    state = _state(request)
    eng = state.engine
    pending = eng.pending if eng is not None and not eng.closed else 0
    running = max(0, min(1, state.metrics.in_flight - pending))
    text = state.metrics.render(queue_length=pending, running=running, loaded=eng is not None)
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    ctype = request.headers.get("content-type")
    media = (ctype or "").split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        got = f"Content-Type {ctype!r}" if ctype else "no Content-Type"
        raise APIError(415, f"send the request body as JSON with Content-Type: application/json (got {got})", code="unsupported_media_type")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise APIError(413, f"the request body is larger than {limit} bytes", code="request_too_large")
    parts, size = [], 0
    try:
        async for piece in request.stream():
            size += len(piece)
            if size > limit:
                raise APIError(413, f"the request body is larger than {limit} bytes", code="request_too_large")
            parts.append(piece)
    except ClientDisconnect:
        raise APIError(400, "the client closed the connection while sending the request") from None
    return schema.parse_json(b"".join(parts))


def _prepare(state: ServerState, req: CompletionRequest, spec_kw: dict[str, Any]) -> tuple[Any, int, int]:
    """In a worker thread (templates and tokenizers take time on long prompts): the prompt's tokens, the context
    check, and the queued generation."""
    eng = state.engine
    if req.messages is not None:
        tokens = eng.prompt_tokens(messages=req.messages)
        param = "messages"
    elif req.prompt is not None:
        tokens = eng.prompt_tokens(req.prompt)
        param = "prompt"
    else:
        tokens = req.prompt_tokens
        param = "prompt"
    n_ctx = eng.target.n_ctx
    if len(tokens) >= n_ctx:
        raise APIError(
            400,
            f"the prompt has {len(tokens)} tokens but the context holds {n_ctx} (the prompt and at least one generated token "
            "must fit); shorten the prompt or start the server with a larger --ctx",
            param=param,
            code="context_length_exceeded",
            extra={"n_prompt_tokens": len(tokens), "n_ctx": n_ctx},
        )
    max_tokens = req.max_tokens if req.max_tokens is not None else n_ctx - len(tokens)
    gen = eng.stream(
        tokens=tokens, sampling=req.sampling, max_tokens=max_tokens, stop=req.stop, speculative=req.speculative, **spec_kw
    )
    return gen, len(tokens), max_tokens


async def _generate(request: Request, parse: Callable[[Mapping[str, Any]], CompletionRequest], kind: str) -> Any:
    state = _state(request)
    state.require_engine()
    try:
        body = await read_json(request, state.settings.max_body_bytes)
        req = parse(body)
        spec_kw = state.spec_kwargs(req)
    except APIError:
        state.metrics.rejected["invalid"] += 1
        raise
    try:
        gen, n_prompt, max_tokens = await anyio.to_thread.run_sync(_prepare, state, req, spec_kw)
    except APIError as e:
        state.metrics.rejected["context" if e.code == "context_length_exceeded" else "invalid"] += 1
        raise
    except QueueFullError as e:
        state.metrics.rejected["queue_full"] += 1
        raise APIError(
            503, f"the server is busy: {e}; retry later", code="queue_full", headers={"Retry-After": str(state.settings.retry_after)}
        ) from None
    except (ConfigError, TemplateError) as e:
        state.metrics.rejected["invalid"] += 1
        raise APIError(400, str(e), param="messages" if req.messages is not None else "prompt") from None
    except EngineClosedError:
        raise APIError(503, "the server is shutting down", code="shutting_down") from None
    record = RequestRecord(id="", kind=kind, stream=req.stream, n_prompt=n_prompt, max_tokens=max_tokens)
    response = GenerationResponse(state, req, gen, record)
    record.id = response.id
    return response


async def chat_completions(request: Request) -> Any:
    return await _generate(request, schema.parse_chat, "chat")


async def completions(request: Request) -> Any:
    return await _generate(request, schema.parse_completion, "completion")


# --------------------------------------------------------------------------------------------- middleware (pure ASGI)
class HostCheck:
    """On a loopback address, refuse requests whose Host header names another host (DNS rebinding)."""

    def __init__(self, app: ASGIApp, host: str) -> None:
        self.app = app
        self.active = _is_loopback(host)
        self.allowed = LOOPBACK_NAMES | {host.lower()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.active and scope["type"] == "http":
            host = _header(scope, b"host")
            name = _host_name(host) if host is not None else None
            if name is not None and name not in self.allowed:
                e = APIError(400, f"Host {host!r} is not this server's name (it listens on a loopback address)", code="invalid_host")
                await error_response(e)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BearerAuth:
    """`Authorization: Bearer <key>` on every route but /health (and CORS preflights)."""

    def __init__(self, app: ASGIApp, key: str | None) -> None:
        self.app = app
        self.key = key.encode() if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.key is not None and scope["type"] == "http" and scope["path"] != "/health" and scope["method"] != "OPTIONS":
            auth = _header(scope, b"authorization") or ""
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.key):
                e = APIError(401, "invalid or missing API key: send Authorization: Bearer <key>", code="invalid_api_key",
                             headers={"WWW-Authenticate": "Bearer"})
                await error_response(e)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class CountResponses:
    """HTTP responses by route and status for /metrics (unknown paths are one label)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in ROUTES else "other"

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.http[(route, int(message["status"]))] += 1
            await send(message)

        await self.app(scope, receive, counting_send)


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", []):
        if k == name:
            return v.decode("latin-1")
    return None


def _host_name(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _is_loopback(host: str) -> bool:
    h = host.strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


# --------------------------------------------------------------------------------------------- the app
async def _api_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return error_response(exc)


async def _http_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    msg = {404: f"no such endpoint: {request.method} {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
    e = APIError(exc.status_code, msg.get(exc.status_code, str(exc.detail)), headers=dict(exc.headers or {}))
    return error_response(e)


async def _internal_error_handler(request: Request, exc: Exception) -> Response:
    log.error("request failed: %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(APIError(500, f"internal error: {type(exc).__name__}", code="internal_error"))


def create_app(
    engine: Any,
    settings: Settings | None = None,
    *,
    on_load_error: Callable[[BaseException], None] | None = None,
) -> Starlette:
    """The server app over `engine`: an Engine (the caller keeps owning it), or a callable that loads one (called in a
    thread at startup; the app closes that engine at shutdown). on_load_error(exc) is called from the loading thread
    when the callable raises."""
    settings = settings or Settings()
    state = ServerState(settings=settings, on_load_error=on_load_error)
    if callable(engine) and not hasattr(engine, "stream"):
        state.factory = engine
    else:
        state.set_engine(engine)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.start_loading()
        try:
            yield
        finally:
            state.shutdown()

    origins = list(settings.cors_origins)
    middleware = [
        Middleware(CountResponses, metrics=state.metrics),
        Middleware(HostCheck, host=settings.host),
        Middleware(
            CORSMiddleware,
            allow_origins=["*"] if "*" in origins else origins,
            allow_origin_regex=None if "*" in origins else LOCAL_ORIGIN,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type"],
            max_age=600,
        ),
        Middleware(BearerAuth, key=settings.api_key),
    ]
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/completions", completions, methods=["POST"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers={APIError: _api_error_handler, HTTPException: _http_error_handler, Exception: _internal_error_handler},
    )
    app.state.edgespec = state
    return app


__all__ = ["Settings", "ServerState", "RequestRecord", "create_app", "usage", "timings", "edgespec_stats", "LOCAL_ORIGIN"]
