"""The server's core, which every route calls: its state (the engine, the request records, the Responses store),
reading a request body, sending JSON, and the one generate path (`generate`: parse in a worker thread, tokenize,
check the context, queue the request with `Engine.start`). The route modules (routes_openai, routes_llamacpp, routes_ollama,
routes_responses) translate their wire format to a `schema.CompletionRequest` and a response writer
(responses.GenerationResponse or a subclass) and call `generate`; this module imports none of them.

Generations are queued from here only (`prepare` builds the request.GenerationRequest and calls Engine.start): a
change to the request object is a change in one place.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
import weakref
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import anyio
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import Send

from edgespec.config import SpecConfig
from edgespec.decoding.constraint import ConstraintError
from edgespec.errors import (
    BackendLostError, ConfigError, ContextFullError, EdgespecError, EngineClosedError, PromptTooLongError, QueueFullError, TemplateError,
)
from edgespec.runtime.request import DrafterKind, GenerationRequest, InfillPrompt
from . import schema
from . import sse
from .metrics import Metrics
from .api_errors import APIError
from .schema import CompletionRequest

if TYPE_CHECKING:  # importing the server loads no llama.cpp
    from edgespec.runtime.engine import Engine
    from edgespec.runtime.handle import Generation

log = logging.getLogger("edgespec.server")

STORE_SIZE = 256  # /v1/responses kept for previous_response_id
STORE_BYTES = 64 * 2**20  # and at most this much of them (their JSON)
# Backpressure: the most chunks of a generation that may wait for its response writer; a generation whose client
# does not read pauses there (generation.Worker: it may be set aside to free its slot), so an unread stream holds
# at most this many chunks (plus the transport's 64 KiB write buffer), not its whole answer.
BACKLOG = 16
JSON_PIECE = 64 * 1024  # a whole JSON answer is written in pieces of this size (send_json)


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
    stall_timeout: seconds a response may wait for its client to read (a write that does not complete); then its
        generation is cancelled and the connection closed (serve --stall-timeout).
    client_share: the share of the queue one client may hold (serve --client-share): a client (its bearer token, else
        its address) may have at most slots + ceil(client_share * max_queue) requests in flight, so that one client
        cannot fill the queue for every other; 1 = no per-client limit.
    """

    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    model_alias: str | None = None
    max_body_bytes: int = 32 * 2**20
    retry_after: int = 1
    history: int = 1024
    stall_timeout: float = 60.0
    client_share: float = 0.5


@dataclass
class RequestRecord:
    """What happened to one generation request (kept in ServerState.records)."""

    id: str
    kind: str
    stream: bool
    n_prompt: int
    max_tokens: int
    client_left: bool = False
    stalled: bool = False  # cancelled because the client did not read its response (Settings.stall_timeout)
    tokens_at_cancel: int | None = None  # tokens generated when the server cancelled the job
    started: bool | None = None  # False: cancelled while queued, never ran
    done: bool = False
    finish_reason: str | None = None  # the engine's ("eos", "stop", "length", "context", "cancelled") or "error"
    n_generated: int = 0
    overrun: int = 0  # tokens generated after the cancel (at most one speculative cycle's)
    error: str | None = None


@dataclass
class Stored:
    """One stored /v1/responses answer."""

    messages: list[dict[str, Any]]  # the conversation so far, the response's own output last
    body: dict[str, Any]  # the response object


class ResponseStore:
    """The last `size` stored responses, at most `max_bytes` of them in all (their JSON: the response object and the
    conversation kept with it); the oldest go first, and one larger than max_bytes on its own is not kept. Thread-safe."""

    def __init__(self, size: int = STORE_SIZE, max_bytes: int = STORE_BYTES) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self.n_bytes = 0
        self._items: OrderedDict[str, tuple[Stored, int]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, rid: str, item: Stored) -> None:
        n = json_size([item.messages, item.body])
        with self._lock:
            old = self._items.pop(rid, None)
            if old is not None:
                self.n_bytes -= old[1]
            if n > self.max_bytes:
                return
            self._items[rid] = (item, n)
            self.n_bytes += n
            while len(self._items) > self.size or self.n_bytes > self.max_bytes:
                self.n_bytes -= self._items.popitem(last=False)[1][1]

    def get(self, rid: str) -> Stored | None:
        with self._lock:
            kept = self._items.get(rid)
            return kept[0] if kept is not None else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


def json_size(obj: Any) -> int:
    """The bytes `obj` takes as JSON (UTF-8 counted as characters: a bound close enough for a memory budget)."""
    return len(json.dumps(obj, ensure_ascii=False, default=str))


@dataclass
class ServerState:
    settings: Settings
    engine: Engine | None = None
    factory: Callable[[], Engine] | None = None
    on_load_error: Callable[[BaseException], None] | None = None
    load_error: str | None = None
    loaded_at: int = 0
    metrics: Metrics = field(default_factory=Metrics)
    records: deque = field(init=False)  # the last settings.history RequestRecords
    closing: bool = False
    live: set = field(default_factory=set)  # GenerationResponses being written
    stored: ResponseStore = field(default_factory=ResponseStore)  # /v1/responses kept for previous_response_id
    clients: Counter = field(default_factory=Counter)  # client key -> its generation requests in flight (admit)
    pool: Any = None  # pool.ModelPool: the models served by name besides this one (None: this one only)

    def __post_init__(self) -> None:
        self.records = deque(maxlen=self.settings.history)

    def limits(self) -> tuple[int, int] | None:
        """(requests in flight the server takes: slots + queue, the most one client may hold), or None when the
        engine's queue is unbounded."""
        eng = self.engine
        max_queue = getattr(eng, "max_queue", None)  # Engine(max_queue=...); None: unbounded
        if not isinstance(max_queue, int):
            return None
        slots = int(getattr(eng, "parallel", 1) or 1)
        share = min(1.0, max(0.0, self.settings.client_share))
        return slots + max_queue, slots + max(1, math.ceil(share * max_queue))

    def admit(self, client: str) -> "Admission":
        """Count a generation request in flight (from the event loop's thread): every one, from its admission until
        its response is written (a stream its client does not read included), counts against slots + queue, and a
        client's against its share; beyond either, an APIError (503 queue_full / 429 client_queue_full)."""
        limits = self.limits()
        if limits is not None:
            total, per_client = limits
            retry = {"Retry-After": str(self.settings.retry_after)}
            if self.metrics.in_flight >= total:
                self.metrics.rejected["queue_full"] += 1
                raise APIError(503, f"the server is busy: {self.metrics.in_flight} requests are in flight (slots + queue: "
                               f"{total}); retry later", code="queue_full", headers=retry)
            if self.clients[client] >= per_client:
                self.metrics.rejected["client_queue_full"] += 1
                raise APIError(429, f"this client already has {self.clients[client]} requests in flight, its share of the "
                               "server's slots and queue; retry when one has finished", code="client_queue_full", headers=retry)
        return Admission.count(self, client)

    @property
    def pinned(self) -> bool:
        """Whether the server has a model of its own (the pinned one), loaded or loading."""
        return self.engine is not None or self.factory is not None

    def check_ready(self) -> None:
        """/health: the pinned model loaded and usable (a server with a pool and no pinned model is always ready)."""
        if self.pool is not None and not self.pinned:
            if self.closing:
                raise APIError(503, "the server is shutting down", code="shutting_down")
            return
        self.require_engine()

    def set_engine(self, engine: Engine) -> None:
        self.loaded_at = int(time.time())
        self.engine = engine

    def require_engine(self) -> Engine:
        if self.engine is None:
            if self.load_error is not None:
                raise APIError(503, f"the model failed to load: {self.load_error}", code="load_failed")
            raise APIError(503, "Loading model", code="loading")
        if getattr(self.engine, "lost", None):
            raise api_error(BackendLostError(self.engine.lost))
        if self.closing or self.engine.closed:
            raise APIError(503, "the server is shutting down", code="shutting_down")
        return self.engine

    @property
    def loaded(self) -> Engine:
        """The engine, where the caller knows it was loaded (require_engine asked before); 503 if not."""
        if self.engine is None:
            raise APIError(503, "Loading model", code="loading")
        return self.engine

    @property
    def model_id(self) -> str:
        if self.settings.model_alias:
            return self.settings.model_alias
        return model_stem(self.loaded.target.spec.path)

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
        if self.pool is not None:
            self.pool.close()


class Admission:
    """One request counted in flight (ServerState.admit); release() (once; later calls do nothing) when its response
    has been written, or was never made."""

    def __init__(self, state: ServerState, client: str) -> None:
        self.state, self.client, self.held = state, client, True
        self.after: list[Callable[[], None]] = []  # called at release (a pooled model's lease)

    @classmethod
    def count(cls, state: ServerState, client: str) -> "Admission":
        """Count one request of `client` in flight, without checking a limit."""
        state.clients[client] += 1
        state.metrics.in_flight += 1
        return cls(state, client)

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        st = self.state
        st.metrics.in_flight -= 1
        st.clients[self.client] -= 1
        if st.clients[self.client] <= 0:
            del st.clients[self.client]
        for done in self.after:
            done()


def client_key(request: Request) -> str:
    """Who sent a request, for the per-client share: its bearer token (hashed: the key itself is not kept), else its
    peer address (every client behind one proxy, or on one machine, is then one client)."""
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    token = token.strip(" \t")
    if scheme.lower() == "bearer" and token:
        return "key:" + hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    client = request.client
    return "addr:" + (client.host if client is not None else "?")


def model_stem(path: str) -> str:
    """A model file's name without .gguf (the model id reported by default)."""
    name = Path(path).name
    return name[:-5] if name.lower().endswith(".gguf") else name


def server_state(request: Request) -> ServerState:
    """The state of the app serving `request`."""
    return request.app.state.edgespec


# --------------------------------------------------------------------------------------------- reading, sending
async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The request's body as a JSON object: 415 without a JSON Content-Type, 413 past `limit` bytes, 400 for what
    is not one JSON object (schema.parse_json, in a worker thread; edgespec/untrusted.py bounds its nesting)."""
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
    # in a worker thread: a body of many MiB takes a noticeable time to decode, and the loop serves other streams
    return await anyio.to_thread.run_sync(schema.parse_json, b"".join(parts))


async def read_body(request: Request) -> dict[str, Any]:
    """The body of a request to an endpoint that needs the engine (503 while it loads), read as read_json does."""
    state = server_state(request)
    state.require_engine()
    return await read_json(request, state.settings.max_body_bytes)


async def read_bound(request: Request, keep_alive: Any = None) -> tuple[ServerState, dict[str, Any]]:
    """The body (as read_body reads it) and the state of the model its "model" names: the server's own state for the
    pinned model (or with no pool: any name), else the pool's view of that model, loaded first if it is not
    (pool.bind: 404 for an unknown name). keep_alive: the request's (Ollama's routes), None for the default."""
    state = server_state(request)
    if state.pool is None:
        return state, await read_body(request)
    body = await read_json(request, state.settings.max_body_bytes)
    return await bind_body(state, body, keep_alive), body


async def bind_body(state: ServerState, body: Mapping[str, Any], keep_alive: Any = None) -> ServerState:
    """The state of the model `body` names (read_bound's, for a body already read)."""
    if state.pool is None:
        state.require_engine()
        return state
    return await state.pool.bind(state, body.get("model"), keep_alive)


def release_lease(state: ServerState) -> None:
    """Give back the pooled model a request's state holds (nothing for the pinned model's)."""
    lease = getattr(state, "lease", None)
    if lease is not None:
        lease.release()


class JSON(JSONResponse):
    """A JSON response written as the event streams write JSON (sse.dumps: compact, UTF-8)."""

    def render(self, content: Any) -> bytes:
        return sse.dumps(content)


def error_response(e: APIError) -> Response:
    return JSON(e.body(), status_code=e.status, headers=e.headers)


async def send_json(send: Send, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
    """A whole JSON answer on a raw ASGI `send` (the response writers', which are ASGI apps)."""
    data = sse.dumps(body)
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    hdrs += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    # in pieces: each write waits for the client to take what the transport holds (a client that does not read a
    # large answer, logprobs of thousands of tokens, then holds 64 KiB of it in the server, and its stall_timeout runs)
    pieces = [data[i : i + JSON_PIECE] for i in range(0, len(data), JSON_PIECE)] or [b""]
    for i, piece in enumerate(pieces):
        await send({"type": "http.response.body", "body": piece, "more_body": i < len(pieces) - 1})


def api_error(e: BaseException) -> APIError:
    """An exception from the engine as the HTTP error a client should see."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, ContextFullError):
        return APIError(400, str(e), code="context_length_exceeded")
    if isinstance(e, (ConfigError, TemplateError)):
        return APIError(400, str(e))
    if isinstance(e, BackendLostError):  # the process ends in a moment; `serve --rpc` reloads once the server is back
        return APIError(503, str(e), code="backend_lost", headers={"Retry-After": "10"})
    if isinstance(e, EngineClosedError):
        return APIError(503, "the server is shutting down", code="shutting_down")
    if isinstance(e, EdgespecError):
        return APIError(500, str(e), code="engine_error")
    log.error("generation failed", exc_info=e)
    return APIError(500, f"internal error: {type(e).__name__}", code="internal_error")


# --------------------------------------------------------------------------------------------- the generate path
def request_spec(eng: Engine, req: CompletionRequest) -> SpecConfig | None:
    """The engine's SpecConfig lowered to the request's draft limit, or None (the engine's) when the limit does not bind."""
    kind = req.drafter or eng.drafter_kind  # the request's drafter, else the engine's
    if req.draft_max is None or not req.speculative or kind == DrafterKind.NONE:
        return None
    base = eng.spec
    n = req.draft_max
    # n-gram lookups draft up to ngram_draft_max only under the adaptive controller (fixed K drafts draft_max)
    ngram_binds = base.adaptive and kind in (DrafterKind.NGRAM, DrafterKind.MODEL_NGRAM) and n < base.ngram_draft_max
    if n >= base.draft_max and not ngram_binds:
        return None
    return replace(base, draft_max=min(base.draft_max, n), ngram_draft_max=min(base.ngram_draft_max, n), draft_min=min(base.draft_min, n))


def prepare(state: ServerState, req: CompletionRequest) -> tuple[Generation, list[int], int]:
    """In a worker thread (templates and tokenizers take time on long prompts): the server's one GenerationRequest
    and its one call to Engine.start, which builds the prompt (runtime/prompt.py) and checks that it fits."""
    eng = state.engine
    assert eng is not None  # read_body/generate asked require_engine first
    fi = req.infill
    try:
        gen = eng.start(GenerationRequest(
            prompt=req.prompt if fi is None else None,
            messages=req.messages if fi is None else None,
            tools=tuple(req.tools) if req.messages is not None and fi is None else (),
            tokens=req.prompt_tokens if fi is None and req.prompt is None and req.messages is None else None,
            infill=InfillPrompt(fi.prefix, fi.suffix, fi.extra, fi.prompt) if fi is not None else None,
            sampling=req.sampling, max_tokens=req.max_tokens, stop=req.stop, speculative=req.speculative, drafter=req.drafter,
            constraint=req.constraint, logprobs=req.logprobs, spec=request_spec(eng, req),
            short=True if fi is not None else None,  # an editor's completion never waits behind a chat answer
        ))
    except PromptTooLongError as e:
        raise APIError(
            400,
            f"{e}; shorten the prompt or start the server with a larger --ctx",
            param="messages" if req.messages is not None and fi is None else "prompt",
            code="context_length_exceeded",
            extra={"n_prompt_tokens": e.n_prompt, "n_ctx": e.n_ctx},
        ) from None
    except ConstraintError as e:  # e.g. a grammar that allows nothing with this model's vocabulary
        raise APIError(400, str(e), param="tools" if req.tools else "response_format", code="invalid_constraint") from None
    return gen, gen.prompt_tokens, gen.max_tokens


async def generate(
    request: Request,
    parse: Callable[[Mapping[str, Any]], CompletionRequest],
    kind: str,
    response: Callable[[ServerState, CompletionRequest, Any, RequestRecord], Any],
    body: dict[str, Any] | None = None,
    state: ServerState | None = None,
) -> Any:
    """Parse, prepare and queue one generation (every route's). `parse` turns the body into the request (in a worker
    thread: a large grammar or schema compiles for seconds); `response(state, req, gen, record)` makes the ASGI
    response that writes it in the route's format (responses.GenerationResponse or a subclass). body: the request's
    JSON when the route has read it already, with `state` (read_bound's) where the route has bound the model."""
    if body is None:
        try:
            state, body = await read_bound(request)
        except APIError as e:
            if e.status not in (503, 404):
                server_state(request).metrics.rejected["invalid"] += 1
            raise
    elif state is None:
        state = server_state(request)
        state.require_engine()
    try:
        return await _queue(request, state, body, parse, kind, response)
    except BaseException:
        release_lease(state)
        raise


async def _queue(request: Request, state: ServerState, body: dict[str, Any], parse: Callable[[Mapping[str, Any]], CompletionRequest],
                 kind: str, response: Callable[[ServerState, CompletionRequest, Any, RequestRecord], Any]) -> Any:
    try:
        req = await anyio.to_thread.run_sync(parse, body)
    except APIError:
        state.metrics.rejected["invalid"] += 1
        raise
    admission = state.admit(client_key(request))
    lease = getattr(state, "lease", None)
    if lease is not None:
        admission.after.append(lease.release)
    try:
        gen, prompt_ids, max_tokens = await _prepare(state, req, kind)
    except BaseException:
        admission.release()
        raise
    try:
        record = RequestRecord(id="", kind=kind, stream=req.stream, n_prompt=len(prompt_ids), max_tokens=max_tokens)
        out = response(state, req, gen, record)
    except BaseException:
        gen.cancel()
        admission.release()
        raise
    gen.limit_backlog(BACKLOG)
    out.admission = admission
    weakref.finalize(out, admission.release)  # a response never run (its connection gone first) gives its place back
    out.prompt_ids = prompt_ids
    record.id = out.id
    return out


async def _prepare(state: ServerState, req: CompletionRequest, kind: str) -> tuple[Generation, list[int], int]:
    """prepare() in a worker thread, its failures as the client's errors."""
    try:
        return await anyio.to_thread.run_sync(prepare, state, req)
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
        if req.drafter is not None and str(e).startswith("drafter "):  # the body's drafter this engine cannot run
            param = "drafter"
        raise APIError(400, str(e), param=param) from None
    except EngineClosedError as e:
        raise api_error(e) from None


__all__ = ["Settings", "ServerState", "RequestRecord", "ResponseStore", "Stored", "Admission", "client_key", "BACKLOG", "server_state",
           "model_stem", "read_json", "read_body", "read_bound", "bind_body", "release_lease", "JSON", "error_response", "send_json",
           "api_error", "request_spec", "prepare", "generate"]
