"""`edgespec serve`: the OpenAI-compatible server (edgespec.server) on uvicorn.

The port is bound first (a clear error when it is taken), the server starts answering at once (/health says 503
while the models load and their costs are measured) and the engine loads in a thread."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import sys
from pathlib import Path
from typing import Any

import click

from edgespec.config import MAX_PARALLEL
from edgespec.errors import EdgespecError
from .common import load_engine, model_options

API_KEY_ENV = "EDGESPEC_API_KEY"
STALL_TIMEOUT_ENV = "EDGESPEC_STALL_TIMEOUT"
CLIENT_SHARE_ENV = "EDGESPEC_CLIENT_SHARE"
KEEP_ALIVE_ENV = "EDGESPEC_KEEP_ALIVE"
MAX_LOADED_ENV = "EDGESPEC_MAX_LOADED_MODELS"


def _name_alias(target: str | None) -> str | None:
    """--target given as a discovered model's name (qwen2.5-coder:7b): that name is the model id the server reports
    (an Ollama blob's file name is a digest); a path or a pair: None, the file's name as before."""
    if not target:
        return None
    from edgespec.models.catalog import is_catalog_name

    try:
        return target if is_catalog_name(target) else None
    except (OSError, ValueError, EdgespecError):
        return None


def _listen(host: str, port: int) -> socket.socket:
    try:
        # proto=IPPROTO_TCP matters: asyncio turns on TCP_NODELAY (no Nagle delay on small SSE writes) only for
        # sockets whose proto says TCP, and accepted sockets inherit it from this one
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise EdgespecError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise EdgespecError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def _header_timeout_protocol(seconds: float) -> Any:
    """uvicorn's HTTP protocol (httptools or h11, as uvicorn picks) that closes a connection which has not finished
    sending a request's headers within `seconds` (uvicorn has no such limit: a client that sends half a header
    holds its connection, and a task, forever). The clock starts when the connection opens and again when data
    arrives while no request is in progress.

    It also lends each request's scope the connection's abort (`scope["extensions"]["edgespec.abort"]`): a response
    whose client stopped reading (responses.ClientStalled) drops the connection and what its transport still holds;
    a plain close would wait for the client to read it all first."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class HeaderTimeout(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _header_timer: Any = None

        def _waiting_for_headers(self) -> bool:
            cycle = getattr(self, "cycle", None)
            return cycle is None or bool(getattr(cycle, "response_complete", False))

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(seconds, self._expired)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expired(self) -> None:
            self._header_timer = None
            transport = getattr(self, "transport", None)
            if self._waiting_for_headers() and transport is not None and not transport.is_closing():
                transport.close()

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            scope = getattr(self, "scope", None)  # the request just parsed (its task has not started yet)
            if isinstance(scope, dict) and getattr(self, "transport", None) is not None:
                scope.setdefault("extensions", {})["edgespec.abort"] = self._abort
            if self._waiting_for_headers():
                self._arm()
            else:
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _abort(self) -> None:
            """Drop the connection with a reset: what this process and the kernel still hold for it is freed now (a
            close would keep the kernel's send queue until the client read it)."""
            transport = self.transport
            sock = transport.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
            transport.abort()

    return HeaderTimeout


@click.command()
@model_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0 = every interface; use --api-key then).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="Port (0 = any free port; the address is printed).")
@click.option("--api-key", envvar=API_KEY_ENV, default=None, metavar="KEY",
              help=f"Require 'Authorization: Bearer KEY' on every endpoint but /health (env {API_KEY_ENV}: keeps it out of `ps`).")
@click.option("--max-queue", type=click.IntRange(1, 4096), default=16, show_default=True,
              help="Requests that may wait for the engine; beyond that: 503 with Retry-After.")
@click.option("--cors-origin", "cors_origins", multiple=True, metavar="ORIGIN",
              help="Browser origin allowed to call the server besides pages on localhost (repeatable; '*' = any).")
@click.option("--alias", default=None, help="Model id reported by /v1/models and in responses (default: the target's name when --target "
                                               "is a model's name, else the target file's name).")
@click.option("--parallel", type=click.IntRange(1, MAX_PARALLEL), default=None,
              help="Slots: requests generated at once, each with a whole context in both models (default: up to 4, as memory allows).")
@click.option("--prompt-cache-mb", type=click.FloatRange(0, 1 << 20), default=256, show_default=True,
              help="Host memory per model for KV snapshots of conversations (0 = none).")
@click.option("--header-timeout", type=click.FloatRange(0.1, 3600), default=10.0, show_default=True,
              help="Seconds a connection may take to send a request's headers; then it is closed.")
@click.option("--stall-timeout", type=click.FloatRange(1, 86400), default=60.0, show_default=True, envvar=STALL_TIMEOUT_ENV,
              help="Seconds a response may wait for its client to read it; then its generation is cancelled and the connection "
                   f"closed (env {STALL_TIMEOUT_ENV}).")
@click.option("--client-share", type=click.FloatRange(0, 1), default=0.5, show_default=True, envvar=CLIENT_SHARE_ENV,
              help="Share of the queue one client (its bearer token, else its address) may hold: at most slots + "
                   f"ceil(share x max-queue) of its requests in flight, beyond that 429 (1 = no per-client limit; env {CLIENT_SHARE_ENV}).")
@click.option("--models-dir", "models_dirs", multiple=True, metavar="DIR", type=click.Path(exists=True, file_okay=False),
              help="Serve every GGUF in DIR by its name, loaded on first use (repeatable; see docs/server.md, \"Serving several models\"). "
                   "Without --target, no model is pinned.")
@click.option("--discover/--no-discover", default=True, show_default=True,
              help="Serve every model found on this machine by its name too (Ollama, LM Studio, Hugging Face and llama.cpp "
                   "caches, your folders: `edgespec models list`), each with its best draft; --no-discover: the pinned pair "
                   "(and --models-dir's models) only, and any model name reaches the pinned pair.")
@click.option("--keep-alive", default="5m", show_default=True, envvar=KEEP_ALIVE_ENV, metavar="DURATION",
              help=f"How long a model served by name stays loaded when idle (\"30s\", \"5m\", \"1h\", seconds; 0 = unload after each "
                   f"request; negative = never); a request's Ollama keep_alive overrides it (env {KEEP_ALIVE_ENV}).")
@click.option("--max-loaded", type=click.IntRange(1, 64), default=3, show_default=True, envvar=MAX_LOADED_ENV,
              help=f"Models served by name held loaded at once; the least recently used idle one unloads first (env {MAX_LOADED_ENV}).")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info", show_default=True)
def serve(**kw: Any) -> None:
    """Serve the models over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/models,
    /health, /metrics).

    Point any OpenAI client at http://HOST:PORT/v1 (the API key is any string unless --api-key is set). A request
    that leaves a sampling setting out gets the OpenAI API's default (temperature 1.0, top_p 1.0, no top_k or
    min_p), not the llama.cpp defaults that generate and chat use."""
    from edgespec.config import check_rpc_endpoints
    from edgespec.server.guards import check_api_key, is_loopback

    host, port, api_key = kw.pop("host"), kw.pop("port"), kw.pop("api_key")
    why = check_api_key(api_key) if api_key else None
    if why:
        raise click.BadParameter(f"no client could send this key: {why}", param_hint="--api-key")
    params = {"host": host, "api_key": api_key or None, "max_queue": kw.pop("max_queue"), "prompt_cache_mb": kw.pop("prompt_cache_mb"),
              "parallel": kw.pop("parallel"), "cors_origins": tuple(kw.pop("cors_origins")), "alias": kw.pop("alias") or _name_alias(kw.get("target")),
              "log_level": kw.pop("log_level"), "header_timeout": kw.pop("header_timeout"),
              "stall_timeout": kw.pop("stall_timeout"), "client_share": kw.pop("client_share"),
              "pool": {"models_dirs": [str(d) for d in kw.pop("models_dirs")], "discover": kw.pop("discover"), "keep_alive": _keep_alive(kw.pop("keep_alive")),
                       "max_loaded": kw.pop("max_loaded")},
              "model_kw": dict(kw)}
    remote = check_rpc_endpoints(kw.get("rpc")) + check_rpc_endpoints(kw.get("draft_rpc"))
    sock = _listen(host, port)
    bound = sock.getsockname()
    shown = f"[{bound[0]}]" if sock.family == socket.AF_INET6 else bound[0]
    click.echo(f"edgespec: listening on http://{shown}:{bound[1]} (OpenAI base URL http://{shown}:{bound[1]}/v1); loading the models...", err=True)
    page = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(bound[0], shown)  # on every interface: open it on this machine
    click.echo(f"edgespec: chat page: http://{page}:{bound[1]}/", err=True)
    if api_key is None and not is_loopback(host):
        click.echo(f"warning: listening on {host} without --api-key: anyone who can reach this port can use the models", err=True)
    if remote:  # a lost RPC server ends the process that talks to it: serve from a child this one reloads (supervise.py)
        from .supervise import supervise

        sys.exit(supervise(params, sock, remote, child=[sys.executable, "-c", f"from {__name__} import child_main; child_main()"]))
    run_server(params, sock)


def run_server(params: dict[str, Any], sock: socket.socket) -> None:
    """Load the engine (in a thread) and serve on the listening `sock` until Ctrl-C/SIGTERM; an EdgespecError when
    the models fail to load. `params`: what serve() read from its options."""
    import uvicorn

    from edgespec.server import Settings, create_app

    max_queue, prompt_cache_mb, parallel = params["max_queue"], params["prompt_cache_mb"], params["parallel"]
    settings = Settings(api_key=params["api_key"], cors_origins=params["cors_origins"], host=params["host"], model_alias=params["alias"],
                        stall_timeout=params.get("stall_timeout", 60.0), client_share=params.get("client_share", 0.5))
    log_level, header_timeout = params["log_level"], params["header_timeout"]
    model_kw = params["model_kw"]

    failure: list[BaseException] = []
    server: Any = None

    def load() -> Any:
        eng = load_engine(dict(model_kw), max_queue=max_queue, prompt_cache_mb=prompt_cache_mb, parallel=parallel)
        click.echo(f"edgespec: ready: {os.path.basename(eng.target.spec.path)}"
                   + (f" + {os.path.basename(eng.draft.spec.path)}" if eng.draft is not None else "")
                   + f" (drafter {eng.drafter_kind}, {eng.parallel} slot(s) of {eng.target.n_ctx} tokens)", err=True)
        return eng

    def on_load_error(e: BaseException) -> None:
        failure.append(e)
        if server is not None:
            server.should_exit = True

    pool = model_pool(params)
    pinned = load if pool is None or model_kw.get("target") is not None or not params.get("pool", {}).get("models_dirs") else None
    app = create_app(pinned, settings, on_load_error=on_load_error, pool=pool)
    if pinned is None:
        click.echo(f"edgespec: ready: serving {len(pool.entries())} model(s) by name, none pinned", err=True)  # type: ignore[union-attr]

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:  # Ctrl-C / SIGTERM: end the generations first
            app.state.edgespec.begin_shutdown()
            super().handle_exit(sig, frame)  # a second Ctrl-C: force_exit (stop waiting for connections)
            captured = getattr(self, "_captured_signals", None)
            if isinstance(captured, list):  # uvicorn raises each captured signal again after the shutdown: once is enough
                captured[:] = list(dict.fromkeys(captured))

        async def shutdown(self, sockets: Any = None) -> None:
            await super().shutdown(sockets=sockets)
            if not self.force_exit:
                return
            # A second Ctrl-C: uvicorn stops waiting and leaves the requests still in progress (a body half sent) to be
            # cancelled when the loop ends, each with a logged traceback, and skips the lifespan shutdown (the engine
            # is never closed: answers not ended, memory not saved). Close their connections instead (each request
            # then sees a disconnect and ends as any disconnected request does), then run the shutdown.
            for conn in list(self.server_state.connections):
                transport = getattr(conn, "transport", None)
                if transport is not None:
                    transport.close()
            tasks = list(self.server_state.tasks)
            if tasks:
                await asyncio.wait(tasks, timeout=2)
            if getattr(self, "lifespan", None) is not None:
                await self.lifespan.shutdown()

    config = uvicorn.Config(_ended_quietly(app), http=_header_timeout_protocol(header_timeout), log_level=log_level,
                            timeout_graceful_shutdown=3, lifespan="on", access_log=log_level == "debug")
    server = Server(config)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn raised the Ctrl-C again after its shutdown
        sock.close()
        app.state.edgespec.shutdown()
        _leave_busy_threads(130, "\ninterrupted")
        raise
    finally:
        sock.close()
        app.state.edgespec.shutdown()  # idempotent: whatever way the server stopped, generations end and memory is saved
    if failure:
        e = failure[0]
        raise EdgespecError(str(e) if isinstance(e, EdgespecError) else f"the model failed to load: {type(e).__name__}: {e}")
    if not server.started:
        sys.exit(1)


def _keep_alive(value: str) -> float | None:
    from edgespec.server.api_errors import APIError
    from edgespec.server.pool import parse_keep_alive

    try:
        return parse_keep_alive(value)
    except APIError as e:
        raise click.BadParameter(e.message.removeprefix("keep_alive: "), param_hint="--keep-alive") from None


def model_source(params: dict[str, Any]) -> Any:
    """The models served by name (a pool.ModelSource), or None: serve the pinned pair only. Every discovered model
    (edgespec.models.Catalog, with --models-dir's folders added) unless --no-discover; with --no-discover, only
    --models-dir's folders' models."""
    from edgespec.models.catalog import Catalog
    from edgespec.models.discover import Place, places
    from edgespec.models.store import models_dir
    from edgespec.server.by_name import CatalogSource

    opts = params.get("pool", {})
    dirs = [Place("folder", Path(d)) for d in opts.get("models_dirs") or []]
    if not opts.get("discover", True) and not dirs:
        return None
    where = (places(own=models_dir()) if opts.get("discover", True) else []) + dirs
    kw = params["model_kw"]
    return CatalogSource(Catalog(where), n_ctx=kw.get("n_ctx") or 4096, n_threads=kw.get("threads"),
                         n_gpu_layers=kw.get("n_gpu_layers") or 0)


def model_pool(params: dict[str, Any]) -> Any:
    """The ModelPool over model_source(params), or None."""
    from edgespec.server.pool import ModelPool

    source = model_source(params)
    if source is None:
        return None
    opts = params.get("pool", {})
    from edgespec.config import SpecConfig

    kw = params["model_kw"]
    spec = SpecConfig(draft_max=kw.get("draft_max", 8), adaptive=not kw.get("fixed_k"), draft_temperature=kw.get("draft_temperature"))
    engine_kw = {"max_queue": params["max_queue"], "prompt_cache_mb": params["prompt_cache_mb"], "parallel": params["parallel"], "spec": spec,
                 "deterministic": bool(kw.get("deterministic")), "memory": not kw.get("no_memory")}  # as the pinned pair's
    return ModelPool(source, keep_alive=opts.get("keep_alive", 300.0), max_loaded=opts.get("max_loaded", 3), engine_kw=engine_kw,
                     on_event=lambda line: click.echo(f"edgespec: {line}", err=True))


def _ended_quietly(app: Any) -> Any:
    """The app, where a request still running when uvicorn's graceful shutdown gives up on it (one waiting for a
    long tokenization in a worker thread) ends with a 503 (or its stream's end) instead of a logged traceback."""
    from edgespec.server.core import error_response
    from edgespec.server.api_errors import APIError

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        started = False

        async def tracked(message: Any) -> None:
            nonlocal started
            started = started or message.get("type") == "http.response.start"
            await send(message)

        try:
            await app(scope, receive, tracked)
        except asyncio.CancelledError:
            if scope.get("type") != "http" or not app.state.edgespec.closing:
                raise
            if not started:
                await error_response(APIError(503, "the server is shutting down", code="shutting_down"))(scope, receive, send)
            else:
                await send({"type": "http.response.body", "body": b"", "more_body": False})

    return wrapped


def _leave_busy_threads(code: int, line: str, wait: float = 1.0) -> None:
    """Python waits at exit for every worker thread; one still inside a llama.cpp call (a long tokenization) would
    hold the exit for as long as that call runs. Past `wait` seconds, exit now with `code` (what was written is
    flushed; the shutdown has run)."""
    import threading
    import time

    deadline = time.monotonic() + wait
    for th in threading.enumerate():
        if th is not threading.current_thread() and not th.daemon:
            th.join(max(0.0, deadline - time.monotonic()))
    if any(th.is_alive() and not th.daemon and th is not threading.current_thread() for th in threading.enumerate()):
        click.echo(line, err=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def child_main() -> None:
    """The process supervise.py starts: serve the settings pickled on stdin on the inherited
    socket; exit codes as the CLI's (its streams are the supervisor's, which the CLI already checked)."""
    import pickle

    payload = pickle.load(sys.stdin.buffer)
    sys.stdin.close()
    sock = socket.socket(fileno=payload["fd"])
    try:
        run_server(payload["params"], sock)
    except EdgespecError as e:
        click.echo(f"Error: {e}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("\ninterrupted", err=True)
        sys.exit(130)
    sys.exit(0)
