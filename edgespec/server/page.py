"""The chat page `edgespec serve` shows at `/` (see docs/web.md): static files shipped in the package (static/: the
page's own HTML, CSS and JS, and vendored third-party libraries in static/vendor/ with their licences), served from
memory with a strict Content-Security-Policy. The page is a client of the server's own API (/v1/chat/completions
with the `show_sources` and `drafter` extensions); this module only serves its files.

Only the files listed in the package are served (no path from the URL ever reaches the file system). The page's
files need no API key (they hold no secret); every API call the page makes does (guards.BearerAuth)."""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .api_errors import APIError
from .core import error_response

PREFIX = "/ui/"  # where the page's assets are served from
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
# Everything from this server only; no inline script or style, no plugins, no framing, no <base>, forms post nowhere.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",  # revalidate: a new edgespec version serves new files at the same names
}

_files: dict[str, tuple[bytes, str]] | None = None


def files() -> dict[str, tuple[bytes, str]]:
    """The page's files by their path under static/ ("index.html", "vendor/marked.umd.js"): (content, media type).
    Read from the package once."""
    global _files
    if _files is None:
        out: dict[str, tuple[bytes, str]] = {}
        root = resources.files("edgespec.server").joinpath("static")

        def walk(d: object, prefix: str) -> None:
            for entry in d.iterdir():  # type: ignore[attr-defined]
                name = prefix + entry.name
                if entry.is_dir():
                    walk(entry, name + "/")
                    continue
                ext = "." + entry.name.rsplit(".", 1)[-1] if "." in entry.name else ""
                if ext in TYPES:
                    out[name] = (entry.read_bytes(), TYPES[ext])

        walk(root, "")
        _files = out
    return _files


def _send(name: str) -> Response:
    found = files().get(name)
    if found is None:
        return error_response(APIError(404, f"no such file: {PREFIX}{name}", code="not_found"))
    body, media = found
    return Response(body, media_type=media, headers=HEADERS)


async def index(request: Request) -> Response:
    """GET /: the chat page."""
    return _send("index.html")


async def asset(request: Request) -> Response:
    """GET /ui/{name}: one of the page's files."""
    return _send(request.path_params["name"])


def routes() -> list[Route]:
    """The page's routes: / and /ui/{name}."""
    return [Route("/", index, methods=["GET"]), Route(PREFIX + "{name:path}", asset, methods=["GET"])]


def is_public(path: str) -> bool:
    """Whether a path is one of the page's files, served without the API key."""
    return path == "/" or path.startswith(PREFIX)


__all__ = ["CSP", "HEADERS", "PREFIX", "asset", "files", "index", "is_public", "routes"]
