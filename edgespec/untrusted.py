"""Checks for text and JSON that come from outside: a request body, a file a user names, a command-line argument,
an app's arguments. Pure: no llama.cpp, no HTTP.

* JSON nesting: Python's json module, json.dumps, Jinja templates and llguidance's parser all recurse, so JSON nested
  thousands deep (valid JSON: `[[[...]]]`) would end in a RecursionError (or worse) deep inside them. Every JSON
  edgespec reads from outside is checked here first, by one iterative walk (`check_json_depth`, no recursion), against
  one limit: `config.max_json_depth()` (EDGESPEC_MAX_JSON_DEPTH, default 100 levels).
* Lone surrogates: a Python str may hold U+D800..U+DFFF alone (from JSON's "\\ud800", or from bytes that are not
  UTF-8 on a command line, which Python decodes with surrogateescape); they are not Unicode text and cannot be
  encoded as UTF-8, so a grammar or regex holding one is refused with `first_surrogate`'s position.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from .config import max_json_depth
from .errors import ConfigError

_SURROGATE = re.compile("[\ud800-\udfff]")


class JSONDepthError(ConfigError):
    """JSON nested deeper than the limit (config.max_json_depth())."""


def json_depth(obj: Any, stop_after: int | None = None) -> int:
    """How deep `obj` nests (0 for a scalar, 1 for [] or {}, 2 for [[]]...), counting dicts, lists and tuples, without
    recursion. With stop_after, the walk stops as soon as the depth passes it (and returns that depth): a cycle then
    ends it too (without stop_after a cycle never ends it: pass one for objects that are not parsed JSON)."""
    containers = (dict, list, tuple)
    level = [obj] if isinstance(obj, containers) else []
    depth = 0
    while level:  # one level at a time: each container is looked at once
        depth += 1
        if stop_after is not None and depth > stop_after:
            return depth
        below: list[Any] = []
        for o in level:
            below.extend(c for c in (o.values() if isinstance(o, dict) else o) if isinstance(c, containers))
        level = below
    return depth


def check_json_depth(obj: Any, what: str = "the JSON", limit: int | None = None) -> Any:
    """`obj` itself when it nests at most `limit` levels (default config.max_json_depth()); JSONDepthError otherwise."""
    limit = max_json_depth() if limit is None else limit
    if json_depth(obj, stop_after=limit) > limit:
        raise JSONDepthError(too_deep(what, limit))
    return obj


def too_deep(what: str, limit: int | None = None) -> str:
    limit = max_json_depth() if limit is None else limit
    return f"{what} is nested more than {limit} levels deep (the limit; EDGESPEC_MAX_JSON_DEPTH raises it)"


def loads(text: str | bytes, what: str = "the JSON", limit: int | None = None, **kw: Any) -> Any:
    """json.loads(text, **kw), then check_json_depth: a JSONDepthError for JSON nested too deep (never a
    RecursionError), a ValueError (json.JSONDecodeError) for text that is not JSON."""
    try:
        obj = json.loads(text, **kw)
    except RecursionError:
        raise JSONDepthError(too_deep(what, limit)) from None
    return check_json_depth(obj, what, limit)


def dumps(obj: Any, what: str = "the JSON", limit: int | None = None, **kw: Any) -> str:
    """json.dumps(obj, **kw) after check_json_depth (a JSONDepthError, never a RecursionError)."""
    check_json_depth(obj, what, limit)
    try:
        return json.dumps(obj, **kw)
    except RecursionError:  # only where the limit was raised past what the interpreter's stack allows
        raise JSONDepthError(too_deep(what, limit)) from None


def first_surrogate(text: str) -> int:
    """The index of the first lone surrogate (U+D800..U+DFFF) in text, or -1."""
    m = _SURROGATE.search(text)
    return m.start() if m else -1


def check_text(text: str, what: str, error: Callable[[str], Exception] = ConfigError) -> str:
    """`text` itself when it is Unicode text (no lone surrogate); error(message) otherwise."""
    i = first_surrogate(text)
    if i >= 0:
        raise error(f"{what} holds a lone surrogate (U+{ord(text[i]):04X} at character {i}): not Unicode text "
                    "(on a command line: bytes that are not UTF-8)")
    return text


__all__ = ["JSONDepthError", "check_json_depth", "check_text", "dumps", "first_surrogate", "json_depth", "loads", "too_deep"]
