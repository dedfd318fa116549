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

import logging
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
from starlette.responses import Response
from starlette.routing import Route

from ..constraint import ConstraintError
from ..errors import ConfigError, ContextFullError, EdgespecError, EngineClosedError, QueueFullError, TemplateError
from . import routes_llamacpp as llamacpp
from . import routes_ollama as ollama
from . import routes_responses as responses_api
from . import schema
from .guards import BearerAuth, CountResponses, HostCheck
from .metrics import Metrics
from .responses import IGNORED_HEADER, JSON, GenerationResponse, api_error, edgespec_stats, error_response, timings, usage
from .schema import APIError, CompletionRequest

log = logging.getLogger("edgespec.server")

# Origins a browser page may call from without --cors-origin: pages served from this machine.
LOCAL_ORIGIN = r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:\d{1,5})?$"


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
    records: deque = field(init=False)  # the last settings.history RequestRecords
    closing: bool = False
    live: set = field(default_factory=set)  # GenerationResponses being written
    stored: Any = None  # routes_responses.ResponseStore: /v1/responses kept for previous_response_id (made on first use)

    def __post_init__(self) -> None:
        self.records = deque(maxlen=self.settings.history)

    def set_engine(self, engine: Any) -> None:
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
        return {"spec": spec}


def _stem(path: str) -> str:
    name = Path(path).name
    return name[:-5] if name.lower().endswith(".gguf") else name


def _state(request: Request) -> ServerState:
    return request.app.state.edgespec


# --------------------------------------------------------------------------------------------- endpoints
async def health(request: Request) -> Response:
    try:
        _state(request).require_engine()
    except APIError as e:
        return error_response(e)
    return JSON({"status": "ok"})


async def models(request: Request) -> Response:
    return JSON({"object": "list", "data": [_model_card(_state(request))]})


async def model(request: Request) -> Response:
    """GET /v1/models/{id}: the card of the model served, or OpenAI's 404 for any other id."""
    want = request.path_params["model_id"]
    if not want:  # /v1/models/ is the list
        return await models(request)
    card = _model_card(_state(request))
    if want != card["id"]:
        return error_response(APIError(404, f"the model {want!r} does not exist (this server serves {card['id']!r})",
                                       param="model", code="model_not_found"))
    return JSON(card)


def _model_card(state: "ServerState") -> dict[str, Any]:
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
    return {"id": state.model_id, "object": "model", "created": state.loaded_at, "owned_by": "edgespec", "meta": meta}


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


def _prepare(state: ServerState, req: CompletionRequest, spec_kw: dict[str, Any]) -> tuple[Any, list[int], int]:
    """In a worker thread (templates and tokenizers take time on long prompts): the prompt's tokens, the context
    check, and the queued generation."""
    eng = state.engine
    if req.infill is not None:
        fi = req.infill
        reserve = min(req.max_tokens or eng.target.n_ctx // 4, eng.target.n_ctx // 2)
        tokens = eng.infill_tokens(fi.prefix, fi.suffix, extra=fi.extra, prompt=fi.prompt, reserve=reserve)
        param = "prompt"
    elif req.messages is not None:
        tokens = eng.prompt_tokens(messages=req.messages, tools=req.tools)
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
    try:
        gen = eng.stream(
            tokens=tokens, sampling=req.sampling, max_tokens=max_tokens, stop=req.stop, speculative=req.speculative,
            constraint=req.constraint, logprobs=req.logprobs, **spec_kw,
        )
    except ConstraintError as e:  # e.g. a grammar that allows nothing with this model's vocabulary
        raise APIError(400, str(e), param="tools" if req.tools else "response_format", code="invalid_constraint") from None
    return gen, tokens, max_tokens


async def _generate(
    request: Request,
    parse: Callable[[Mapping[str, Any]], CompletionRequest],
    kind: str,
    response: type[GenerationResponse] = GenerationResponse,
    body: dict[str, Any] | None = None,
) -> Any:
    """Parse, prepare and queue one generation; the `response` class writes it in its API's format (body: the
    request's JSON when the route has read it already)."""
    state = _state(request)
    state.require_engine()
    try:
        if body is None:
            body = await read_json(request, state.settings.max_body_bytes)
        req = await anyio.to_thread.run_sync(parse, body)  # a large grammar or schema compiles for seconds: not on the loop
        spec_kw = state.spec_kwargs(req)
    except APIError:
        state.metrics.rejected["invalid"] += 1
        raise
    try:
        gen, prompt_ids, max_tokens = await anyio.to_thread.run_sync(_prepare, state, req, spec_kw)
    except APIError as e:
        state.metrics.rejected["context" if e.code == "context_length_exceeded" else "invalid"] += 1
        raise
    except QueueFullError as e:
        state.metrics.rejected["queue_full"] += 1
        raise APIError(
            503, f"the server is busy: {e}; retry later", code="queue_full", headers={"Retry-After": str(state.settings.retry_after)}
        ) from None
    except ContextFullError as e:  # a prompt refused before tokenizing: it cannot fit whatever its tokens
        state.metrics.rejected["context"] += 1
        raise APIError(400, str(e), param="messages" if req.messages is not None else "prompt", code="context_length_exceeded") from None
    except (ConfigError, TemplateError) as e:
        state.metrics.rejected["invalid"] += 1
        param = "messages" if req.messages is not None else "input_prefix" if req.infill is not None and kind == "infill" else "prompt"
        raise APIError(400, str(e), param=param) from None
    except EngineClosedError as e:
        raise api_error(e) from None
    record = RequestRecord(id="", kind=kind, stream=req.stream, n_prompt=len(prompt_ids), max_tokens=max_tokens)
    out = response(state, req, gen, record)
    out.prompt_ids = prompt_ids
    record.id = out.id
    return out


async def chat_completions(request: Request) -> Any:
    return await _generate(request, schema.parse_chat, "chat")


async def completions(request: Request) -> Any:
    return await _generate(request, schema.parse_completion, "completion")


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

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/models", models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", model, methods=["GET"]),
        Route("/models/{model_id:path}", model, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/completions", completions, methods=["POST"]),
        Route("/metrics", metrics, methods=["GET"]),
        # llama-server's own endpoints (routes_llamacpp.py)
        Route("/v1/health", health, methods=["GET"]),
        Route("/props", llamacpp.props, methods=["GET"]),
        Route("/completion", llamacpp.completion, methods=["POST"]),
        Route("/infill", llamacpp.infill, methods=["POST"]),
        Route("/tokenize", llamacpp.tokenize, methods=["POST"]),
        Route("/detokenize", llamacpp.detokenize, methods=["POST"]),
        Route("/apply-template", llamacpp.apply_template, methods=["POST"]),
        # Ollama's (routes_ollama.py)
        Route("/api/tags", ollama.tags, methods=["GET"]),
        Route("/api/show", ollama.show, methods=["POST"]),
        Route("/api/chat", ollama.chat, methods=["POST"]),
        Route("/api/generate", ollama.generate, methods=["POST"]),
        Route("/api/ps", ollama.ps, methods=["GET"]),
        Route("/api/version", ollama.version, methods=["GET"]),
        # OpenAI's Responses API (routes_responses.py)
        Route("/v1/responses", responses_api.create, methods=["POST"]),
        Route("/responses", responses_api.create, methods=["POST"]),
        Route("/v1/responses/{response_id}", responses_api.retrieve, methods=["GET"]),
    ]
    origins = list(settings.cors_origins)
    middleware = [
        Middleware(CountResponses, metrics=state.metrics, routes=frozenset(r.path for r in routes)),
        Middleware(HostCheck, host=settings.host),
        Middleware(
            CORSMiddleware,
            allow_origins=["*"] if "*" in origins else origins,
            allow_origin_regex=None if "*" in origins else LOCAL_ORIGIN,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["*"],  # SDKs send their own headers (openai-node: X-Stainless-*); origins are what is checked
            expose_headers=[IGNORED_HEADER],  # a page may read which of its parameters were ignored
            max_age=600,
        ),
        Middleware(BearerAuth, key=settings.api_key),
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
