"""`edgespec serve`: the OpenAI-compatible server (edgespec.server) on uvicorn.

The port is bound first (a clear error when it is taken), the server starts answering at once (/health says 503
while the models load and their costs are measured) and the engine loads in a thread."""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

import click

from ..errors import EdgespecError
from .common import load_engine, model_options

API_KEY_ENV = "EDGESPEC_API_KEY"


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
@click.option("--alias", default=None, help="Model id reported by /v1/models and in responses (default: the target file's name).")
@click.option("--prompt-cache-mb", type=click.FloatRange(0, 1 << 20), default=256, show_default=True,
              help="Host memory per model for KV snapshots of conversations (0 = none).")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info", show_default=True)
def serve(**kw: Any) -> None:
    """Serve the models over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/models,
    /health, /metrics).

    Point any OpenAI client at http://HOST:PORT/v1 (the API key is any string unless --api-key is set)."""
    import uvicorn

    from ..server import Settings, create_app
    from ..server.guards import is_loopback

    host, port, api_key = kw.pop("host"), kw.pop("port"), kw.pop("api_key")
    max_queue, prompt_cache_mb = kw.pop("max_queue"), kw.pop("prompt_cache_mb")
    settings = Settings(api_key=api_key or None, cors_origins=tuple(kw.pop("cors_origins")), host=host, model_alias=kw.pop("alias"))
    log_level = kw.pop("log_level")
    model_kw = dict(kw)
    sock = _listen(host, port)
    bound = sock.getsockname()
    shown = f"[{bound[0]}]" if sock.family == socket.AF_INET6 else bound[0]
    click.echo(f"edgespec: listening on http://{shown}:{bound[1]} (OpenAI base URL http://{shown}:{bound[1]}/v1); loading the models...", err=True)
    if settings.api_key is None and not is_loopback(host):
        click.echo(f"warning: listening on {host} without --api-key: anyone who can reach this port can use the models", err=True)

    failure: list[BaseException] = []
    server: Any = None

    def load() -> Any:
        eng = load_engine(dict(model_kw), max_queue=max_queue, prompt_cache_mb=prompt_cache_mb)
        click.echo(f"edgespec: ready: {os.path.basename(eng.target.spec.path)}"
                   + (f" + {os.path.basename(eng.draft.spec.path)}" if eng.draft is not None else "")
                   + f" (drafter {eng.drafter_kind}, context {eng.target.n_ctx})", err=True)
        return eng

    def on_load_error(e: BaseException) -> None:
        failure.append(e)
        if server is not None:
            server.should_exit = True

    app = create_app(load, settings, on_load_error=on_load_error)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:  # Ctrl-C / SIGTERM: end the generations first
            app.state.edgespec.begin_shutdown()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=3, lifespan="on", access_log=log_level == "debug")
    server = Server(config)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    if failure:
        e = failure[0]
        raise EdgespecError(str(e) if isinstance(e, EdgespecError) else f"the model failed to load: {type(e).__name__}: {e}")
    if not server.started:
        sys.exit(1)
