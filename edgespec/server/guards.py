"""Request guards for the server (pure ASGI middleware): the Host check against DNS rebinding on loopback, the
Bearer API key, and the response counter for /metrics."""

from __future__ import annotations

import hmac
import ipaddress
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .metrics import Metrics
from .core import error_response
from .api_errors import APIError
from .page import PREFIX, is_public

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}


class HostCheck:
    """On a loopback address, refuse requests whose Host header names another host (DNS rebinding)."""

    def __init__(self, app: ASGIApp, host: str) -> None:
        self.app = app
        self.active = is_loopback(host)
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
    """`Authorization: Bearer <key>` on every route but /health, /v1/health and the chat page's files (page.is_public:
    they hold no secret; the page sends the key with each API call), and CORS preflights."""

    def __init__(self, app: ASGIApp, key: str | None) -> None:
        self.app = app
        # compared as bytes: a non-ASCII key is the UTF-8 bytes clients send (an environment variable's undecodable
        # bytes come back as they were)
        self.key = key_bytes(key) if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.key is not None and scope["type"] == "http" and scope["path"] not in ("/health", "/v1/health") and scope["method"] != "OPTIONS" \
                and not is_public(scope["path"]):
            auth = _raw_header(scope, b"authorization") or b""
            scheme, _, token = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(b" \t"), self.key):
                e = APIError(401, "invalid or missing API key: send Authorization: Bearer <key>", code="invalid_api_key",
                             headers={"WWW-Authenticate": "Bearer"})
                await error_response(e)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class CountResponses:
    """HTTP responses by route and status for /metrics (the chat page's files are one label, unknown paths another)."""

    def __init__(self, app: ASGIApp, metrics: Metrics, routes: frozenset[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = path if path in self.routes else PREFIX + "{name}" if path.startswith(PREFIX) else "other"  # the page's files: one label

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.http[(route, int(message["status"]))] += 1
            await send(message)

        await self.app(scope, receive, counting_send)


def key_bytes(key: str) -> bytes:
    """The bytes a client sends for an API key: UTF-8 (undecodable bytes of an environment variable as they were)."""
    return key.encode("utf-8", "surrogateescape")


def check_api_key(key: str) -> str | None:
    """Why `key` cannot be sent in an Authorization header (so no client could ever pass it), or None."""
    try:
        raw = key_bytes(key)
    except UnicodeEncodeError:
        return "it is not valid text"
    if not raw:
        return "it is empty"
    if raw != raw.strip(b" \t"):
        return "it starts or ends with a space"
    if any(b < 0x20 or b == 0x7F for b in raw):
        return "it holds a control character (a newline, a tab, NUL)"
    return None


def _raw_header(scope: Scope, name: bytes) -> bytes | None:
    for k, v in scope.get("headers", []):
        if k == name:
            return bytes(v)
    return None


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


def is_loopback(host: str) -> bool:
    h = host.strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False



__all__ = ["HostCheck", "BearerAuth", "CountResponses", "LOOPBACK_NAMES", "is_loopback"]
