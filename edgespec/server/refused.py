"""What a body may hold that the server does not read. Nothing that would change the answer is ignored: features
edgespec does not have (n > 1, logit_bias, mirostat...) are refused with a 400 that says so (UNSUPPORTED). Unknown keys
are accepted, as llama-server and most OpenAI-compatible servers do, so that clients sending newer optional fields
keep working, but never in silence: `ignored_keys` lists them for CompletionRequest.ignored, the response carries
them in an `X-Edgespec-Ignored-Params` header and the server logs each name once (docs/server.md)."""

from __future__ import annotations

from typing import Any, Mapping

from .api_errors import unsupported
from .bodies import COMMON_KEYS


def _is_int(v: Any, n: int) -> bool:
    """v is the JSON number n (1 or 1.0; never true or false)."""
    return not isinstance(v, bool) and isinstance(v, (int, float)) and v == n


# Features a client may ask for that this server does not have: a 400 rather than a silently different answer.
# Each entry: (key, test of the value that is still fine, what to say).
UNSUPPORTED: list[tuple[str, Any, str]] = [
    ("n", lambda v: _is_int(v, 1), "n must be 1 (several choices per request are not supported; send several requests)"),
    ("best_of", lambda v: _is_int(v, 1), "best_of > 1 is not supported"),
    ("functions", lambda v: v == [], "functions (function calling) are not supported by this server"),
    ("function_call", lambda v: v in ("none", "auto"), "function_call is not supported by this server (no tools)"),
    ("logit_bias", lambda v: v == {}, "logit_bias is not supported"),
    ("prediction", lambda v: False, "prediction (predicted outputs) is not supported"),
    ("audio", lambda v: False, "audio output is not supported"),
    ("modalities", lambda v: v == ["text"], "only the text modality is supported"),
    ("web_search_options", lambda v: False, "web search is not supported"),
    ("reasoning_effort", lambda v: False, "reasoning_effort is not supported (not a reasoning model server)"),
    ("echo", lambda v: v is False, "echo is not supported"),
    ("suffix", lambda v: v == "", "suffix (insertion) is not supported"),
    # llama.cpp extras this engine does not have
    ("n_probs", lambda v: _is_int(v, 0), "n_probs is not supported"),
    ("ignore_eos", lambda v: v is False, "ignore_eos is not supported"),
    ("mirostat", lambda v: _is_int(v, 0), "mirostat sampling is not supported"),
    ("typical_p", lambda v: _is_int(v, 1), "typical_p is not supported"),
    ("tfs_z", lambda v: _is_int(v, 1), "tfs_z is not supported"),
    ("dynatemp_range", lambda v: _is_int(v, 0), "dynatemp_range (dynamic temperature) is not supported"),
    ("dry_multiplier", lambda v: _is_int(v, 0), "dry_multiplier (DRY sampling) is not supported"),
    ("xtc_probability", lambda v: _is_int(v, 0), "xtc_probability (XTC sampling) is not supported"),
    ("top_n_sigma", lambda v: _is_int(v, -1) or _is_int(v, 0), "top_n_sigma is not supported"),
    ("lora", lambda v: v == [], "LoRA adapters are not supported"),
]


def refuse_unsupported(body: Mapping[str, Any]) -> None:
    """A 400 for the first feature in UNSUPPORTED the body asks for."""
    for key, fine, message in UNSUPPORTED:
        v = body.get(key)
        if v is None:  # JSON null = not given
            continue
        try:
            ok = bool(fine(v))
        except Exception:  # noqa: BLE001 - a value of a strange type is simply not fine
            ok = False
        if not ok:
            raise unsupported(key, message)



def ignored_keys(body: Mapping[str, Any], known: frozenset[str] | set[str]) -> tuple[str, ...]:
    """The body's keys outside `known`, CommonBody's fields and the refused features, in a stable order."""
    refused = {k for k, _, _ in UNSUPPORTED}
    return tuple(sorted(k for k in body if k not in known and k not in COMMON_KEYS and k not in refused))


__all__ = ["UNSUPPORTED", "ignored_keys", "refuse_unsupported"]
