"""The file of a saved chat (ChatSession.save / load, `/save` and `/load` in `edgespec chat`; docs/api.md): reading
and writing it (`read_conversation`, `write_conversation`: one-line ChatErrors, atomic writes) and checking what it
holds (`parse_conversation` -> `Conversation`). A file is untrusted: every field is checked, and a problem is a
ChatError naming the first one."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from edgespec.config import SamplingParams, check_stop
from edgespec.errors import ConfigError, EdgespecError
from edgespec.fsutil import atomic_write_text, read_json_file

FILE_FORMAT = "edgespec-chat"
FILE_VERSION = 1
MAX_FILE_BYTES = 64 * 1024 * 1024  # far past any conversation a context holds; larger is a wrong file
MAX_MESSAGES = 100_000
ROLES = ("user", "assistant")
_SESSION_SETTINGS = ("max_tokens", "stop", "speculative", "sampling")
_ENGINE_SETTINGS = ("target", "draft", "drafter", "draft_max", "n_ctx")


class ChatError(EdgespecError):
    """A chat-level problem (bad file for /save, ...)."""


class Conversation:
    """A saved conversation, checked (parse_conversation): everything load() restores."""

    def __init__(self) -> None:
        self.system: str | None = None
        self.messages: list[dict[str, str]] = []
        self.sampling: SamplingParams | None = None
        self.max_tokens: int | None = None
        self.stop: tuple[str, ...] | None = None
        self.speculative: bool | None = None
        self.vocab: str | None = None
        self.tokens: list[int] = []
        self.settings: dict[str, Any] = {}  # as saved (the engine's part is informative)
        self.notes: list[str] = []  # remarks for the user (a foreign cache dropped, ...)


def read_conversation(path: str | os.PathLike[str]) -> Any:
    """The JSON in a conversation file; ChatError (one line) for a path that is not a readable regular file of at
    most MAX_FILE_BYTES (a FIFO or a device is never waited on, a folder, a symlink loop) or not strict JSON (NaN,
    a 5,000-digit number, nesting too deep)."""
    p = _user_path(path, "load")
    try:
        return read_json_file(p, MAX_FILE_BYTES)
    except OSError as e:
        raise ChatError(f"cannot read {_shown(p)}: {e.strerror or e}") from None
    except ValueError as e:
        raise ChatError(f"{_shown(p)} is not a saved conversation (not valid JSON: {_one_line(e)})") from None


def write_conversation(path: str | os.PathLike[str], data: dict[str, Any]) -> Path:
    """Write `data` (ChatSession.as_dict()) as JSON, atomically (a failed write leaves the old file as it was); a
    ChatError (one line) for any path that cannot be written (a NUL byte, a folder, a device, no permission, a
    missing folder)."""
    p = _user_path(path, "save to")
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    try:
        if p.is_dir():
            raise IsADirectoryError(21, "Is a directory")
        atomic_write_text(p, text)
    except (OSError, ValueError) as e:  # ValueError: a path the OS layer refuses (an embedded NUL byte)
        raise ChatError(f"cannot write {_shown(p)}: {getattr(e, 'strerror', None) or e}") from None
    return p


def parse_conversation(data: Any, *, n_vocab: int | None = None) -> Conversation:
    """Check a saved conversation (the JSON of save(), any version up to FILE_VERSION; a file without a version is
    the first format, without a cache) and return what load() restores; ChatError naming the first problem.
    n_vocab: token ids must be below it (ids out of range are a tampered file)."""
    if not isinstance(data, dict):
        raise _bad(f"the file holds a JSON {_json_type(data)}, not an object")
    _check_format(data)
    conv = Conversation()
    system = data.get("system")
    if system is not None:
        conv.system = _text(system, "the system prompt") or None
    conv.messages = _messages(data.get("messages"))
    settings = data.get("settings", {})
    if not isinstance(settings, dict):
        raise _bad(f"settings must be an object, got {_json_type(settings)}")
    unknown = sorted(set(settings) - set(_SESSION_SETTINGS) - set(_ENGINE_SETTINGS))
    if unknown:
        raise _bad(f"unknown setting {_short(unknown[0])}")
    conv.settings = dict(settings)
    try:
        _session_settings(settings, conv)
    except ConfigError as e:
        raise _bad(f"settings: {e}") from None
    _check_engine_settings(settings)
    cache = data.get("cache")
    if cache is not None:
        conv.vocab, conv.tokens = _cache(cache, n_vocab)
    return conv


def _bad(why: str) -> ChatError:
    return ChatError(f"not a saved conversation: {why}")


def _check_format(data: dict[str, Any]) -> None:
    """The format and version (none: the first format) and no field outside the format's."""
    version = data.get("version", 0)
    if "version" in data or "format" in data:
        if data.get("format") != FILE_FORMAT:
            raise _bad(f"format must be {FILE_FORMAT!r}, got {_short(data.get('format'))}")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise _bad(f"version must be a positive integer, got {_short(version)}")
        if version > FILE_VERSION:
            raise _bad(f"version {version} was written by a newer edgespec (this one reads up to {FILE_VERSION})")
    unknown = sorted(set(data) - {"format", "version", "system", "messages", "settings", "cache"})
    if unknown:
        raise _bad(f"unknown field {_short(unknown[0])}")


def _messages(msgs: Any) -> list[dict[str, str]]:
    """The messages: user and assistant alternating, each exactly a role and a text content."""
    if not isinstance(msgs, list):
        raise _bad(f"messages must be a list, got {_json_type(msgs)}")
    if len(msgs) > MAX_MESSAGES:
        raise _bad(f"{len(msgs)} messages (at most {MAX_MESSAGES})")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise _bad(f"message {i + 1} is a JSON {_json_type(m)}, not an object")
        if set(m) != {"role", "content"}:
            extra = sorted(set(m) - {"role", "content"})
            raise _bad(f"message {i + 1} " + (f"has an unknown field {_short(extra[0])}" if extra else "needs a role and a content"))
        role = m["role"]
        want = ROLES[i % 2]
        if role != want:
            raise _bad(f"message {i + 1} must have role {want!r} (user and assistant alternate), got {_short(role)}")
        out.append({"role": role, "content": _text(m["content"], f"message {i + 1}'s content")})
    return out


def _session_settings(settings: dict[str, Any], conv: Conversation) -> None:
    """The settings load() restores (sampling, max_tokens, stop, speculative) into conv; ConfigError from their checks."""
    if settings.get("sampling") is not None:
        sp = settings["sampling"]
        if not isinstance(sp, dict):
            raise _bad(f"settings.sampling must be an object, got {_json_type(sp)}")
        names = set(SamplingParams.__dataclass_fields__)
        extra = sorted(set(sp) - names)
        if extra:
            raise _bad(f"unknown sampling setting {_short(extra[0])}")
        conv.sampling = SamplingParams(**sp)
    if settings.get("max_tokens") is not None:
        mt = settings["max_tokens"]
        if isinstance(mt, bool) or not isinstance(mt, int) or not 1 <= mt <= 1 << 20:
            raise _bad(f"settings.max_tokens must be an integer in [1, {1 << 20}], got {_short(mt)}")
        conv.max_tokens = mt
    if settings.get("stop") is not None:
        conv.stop = check_stop(settings["stop"])
        for s in conv.stop:
            _text(s, "a stop string")
    if settings.get("speculative") is not None:
        if not isinstance(settings["speculative"], bool):
            raise _bad(f"settings.speculative must be true or false, got {_short(settings['speculative'])}")
        conv.speculative = settings["speculative"]


def _check_engine_settings(settings: dict[str, Any]) -> None:
    """The engine's settings (informative on load): only their types are checked."""
    for key in ("target", "draft", "drafter"):
        if settings.get(key) is not None and not isinstance(settings[key], str):
            raise _bad(f"settings.{key} must be text, got {_json_type(settings[key])}")
    for key in ("draft_max", "n_ctx"):
        v = settings.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise _bad(f"settings.{key} must be a non-negative integer, got {_short(v)}")


def _cache(cache: Any, n_vocab: int | None) -> tuple[str, list[int]]:
    """The saved cache: the vocabulary's fingerprint and the token ids (each below n_vocab when given)."""
    if not isinstance(cache, dict) or set(cache) - {"vocab", "tokens"}:
        raise _bad("cache must be an object with vocab and tokens")
    vocab, tokens = cache.get("vocab"), cache.get("tokens", [])
    if not isinstance(vocab, str) or not isinstance(tokens, list):
        raise _bad("cache.vocab must be text and cache.tokens a list")
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0 or (n_vocab is not None and t >= n_vocab):
            where = f" [0, {n_vocab})" if n_vocab is not None else ""
            raise _bad(f"cache.tokens holds {_short(t)}, not a token id{where}")
    return vocab, tokens


def _text(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise _bad(f"{what} must be text, got {_json_type(v)}")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(f"{what} is not valid text (a lone surrogate)") from None
    return v


def _json_type(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null", int: "number", float: "number"}.get(
        type(v), type(v).__name__
    )


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:200]


def _shown(p: Path) -> str:
    return _short(str(p))[1:-1] if "\x00" in str(p) or len(str(p)) > 200 else str(p)


def _user_path(path: Any, verb: str) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise ChatError(f"a file to {verb} must be a path, got {type(path).__name__}")
    name = os.fspath(path)
    if not isinstance(name, str):
        raise ChatError(f"a file to {verb} must be a text path, got {type(name).__name__}")
    if not name:
        raise ChatError(f"a file to {verb} needs a name")
    try:
        return Path(name).expanduser()
    except (RuntimeError, TypeError, ValueError) as e:  # ~user unknown, bytes, ...
        raise ChatError(f"cannot {verb} {path!r}: {_one_line(e)}") from None


__all__ = ["ChatError", "Conversation", "FILE_FORMAT", "FILE_VERSION", "MAX_FILE_BYTES", "MAX_MESSAGES", "parse_conversation",
           "read_conversation", "write_conversation"]
