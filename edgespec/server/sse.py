"""Server-sent events, framed by hand (the format is three rules): each event is `data: <one line of JSON>` and a
blank line; the stream ends with `data: [DONE]`; a line starting with `:` is a comment (keep-alive).

JSON is written compactly with non-ASCII characters as UTF-8 (`ensure_ascii=False`): text from the engine is
always whole characters (its detokenizer holds back a token that ends inside a UTF-8 sequence), so no event ever
carries half a character. JSON never contains a raw newline, so one event is one line.
"""

from __future__ import annotations

import json
from typing import Any

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"
HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # proxies (nginx) must not buffer the stream
]


def dumps(obj: Any) -> bytes:
    """Compact JSON as UTF-8 bytes. Text with a lone surrogate (only possible from a client's own JSON escapes)
    falls back to ASCII escapes rather than failing."""
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def event(obj: Any) -> bytes:
    """One `data:` event."""
    return b"data: " + dumps(obj) + b"\n\n"


__all__ = ["DONE", "KEEPALIVE", "HEADERS", "dumps", "event"]
