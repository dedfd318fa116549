"""The OpenAI-compatible HTTP layer: a Starlette app over one `Engine` (see docs/server.md).

    app = create_app(engine)                      # an Engine already loaded (the caller keeps owning it)
    app = create_app(lambda: Engine.load(...))    # loaded in a thread at startup; /health says 503 until then

The server is a thin layer: each route module (routes_openai, routes_llamacpp, routes_ollama, routes_responses)
translates its API's body into a request (schema.py) and calls the core (core.py), which queues a generation on the
engine; the route's writer (responses.GenerationResponse or a subclass) writes what the generation yields, as one
JSON response or as a stream (sse.py). This module assembles them: the route table, /health, /metrics, the
middleware and the error handlers. The server holds no llama.cpp state and no generation logic: the engine's worker
thread owns both models, runs up to its slots' generations together (short requests first, the rest in order of
arrival) and keeps the KV cache across requests (a re-sent conversation decodes only its new tokens).

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
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, cast

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from . import routes_llamacpp as llamacpp
from . import routes_ollama as ollama
from . import routes_openai as openai_api
from . import routes_responses as responses_api
from . import page
from .core import JSON, RequestRecord, ServerState, Settings, error_response, server_state
from .guards import BearerAuth, CountResponses, HostCheck
from .responses import IGNORED_HEADER
from .api_errors import APIError

if TYPE_CHECKING:  # importing the server loads no llama.cpp
    from edgespec.runtime.engine import Engine

log = logging.getLogger("edgespec.server")

# Origins a browser page may call from without --cors-origin: pages served from this machine.
LOCAL_ORIGIN = r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:\d{1,5})?$"


# --------------------------------------------------------------------------------------------- endpoints
async def health(request: Request) -> Response:
    try:
        server_state(request).check_ready()
    except APIError as e:
        return error_response(e)
    return JSON({"status": "ok"})


async def metrics(request: Request) -> Response:
    state = server_state(request)
    eng = state.engine
    live = eng is not None and not eng.closed
    slots = eng.slot_state() if live else {"parallel": 0, "busy": 0, "queued": 0}  # type: ignore[union-attr]
    text = state.metrics.render(queue_length=slots["queued"], running=slots["busy"], slots=slots["parallel"], loaded=eng is not None)
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


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


def _state(engine: Any, settings: Settings, on_load_error: Callable[[BaseException], None] | None, pool: Any) -> ServerState:
    state = ServerState(settings=settings, on_load_error=on_load_error, pool=pool)
    if engine is None:
        if pool is None:
            raise ValueError("create_app needs an engine, a pool or both")
    elif callable(engine) and not hasattr(engine, "stream"):
        state.factory = cast("Callable[[], Engine]", engine)
    else:
        state.set_engine(cast("Engine", engine))
    return state


def create_app(
    engine: Engine | Callable[[], Engine] | None,
    settings: Settings | None = None,
    *,
    on_load_error: Callable[[BaseException], None] | None = None,
    pool: Any = None,
) -> Starlette:
    """The server app over `engine`: an Engine (the caller keeps owning it), or a callable that loads one (called in a
    thread at startup; the app closes that engine at shutdown). on_load_error(exc) is called from the loading thread
    when the callable raises. pool: a pool.ModelPool whose models are served by name besides `engine` (the pinned
    model; None: the pool's models only); the app closes it at shutdown."""
    settings = settings or Settings()
    state = _state(engine, settings, on_load_error, pool)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.start_loading()
        try:
            yield
        finally:
            state.shutdown()

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", openai_api.models, methods=["GET"]),
        Route("/models", openai_api.models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", openai_api.model, methods=["GET"]),
        Route("/models/{model_id:path}", openai_api.model, methods=["GET"]),
        Route("/v1/chat/completions", openai_api.chat_completions, methods=["POST"]),
        Route("/chat/completions", openai_api.chat_completions, methods=["POST"]),
        Route("/v1/completions", openai_api.completions, methods=["POST"]),
        Route("/completions", openai_api.completions, methods=["POST"]),
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
        *page.routes(),  # the chat page at / (page.py, docs/web.md)
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


__all__ = ["Settings", "ServerState", "RequestRecord", "create_app", "LOCAL_ORIGIN"]
