"""Requests in, edgespec settings out: parse and check an OpenAI-style request body, and shape errors the way
OpenAI clients read them (`{"error": {"message", "type", "param", "code"}}`).

Every problem with a request is an `APIError` with an HTTP status and one line that names the parameter. Nothing
a client sends is ignored when it would change the answer: features edgespec does not have (n > 1, logit_bias,
mirostat...) are refused with a 400 that says so. `response_format` (JSON object / JSON schema), llama-server's
`json_schema` and `grammar`, and `tools`/`tool_choice` become a constraint (edgespec/structured.py builds it, so every
route shares it). Unknown keys are accepted, as llama-server
and most OpenAI-compatible servers do, so that clients sending newer optional fields keep working, but never in
silence: `CompletionRequest.ignored` lists them, the response carries them in an `X-Edgespec-Ignored-Params` header
and the server logs each name once (docs/server.md).
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from ..config import MAX_SEED, SamplingParams
from ..constraint import Constraint
from ..errors import ConfigError
from ..infill import ExtraChunk
from ..structured import Tool, check_tool_choice, check_tools, constraint_from_response_format, tool_constraint, tool_history
from ..untrusted import JSONDepthError, loads as loads_json
from .samplers import ChainError, apply_chain, parse_names

MAX_STOPS = 32
MAX_TOKENS_LIMIT = 1 << 20
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


# --------------------------------------------------------------------------------------------- errors
class APIError(Exception):
    """An HTTP error with an OpenAI-shaped body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or default_type(status)
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, param=self.param, code=self.code, **self.extra)


def default_type(status: int) -> str:
    return {
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "invalid_request_error",
        415: "invalid_request_error",
        429: "rate_limit_error",
        501: "not_supported_error",
        503: "unavailable_error",
    }.get(status, "invalid_request_error" if status < 500 else "server_error")


def error_body(message: str, type: str, *, param: str | None = None, code: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code, **extra}}


def bad(param: str | None, message: str, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code or ("invalid_value" if param else None))


def unsupported(param: str, message: str) -> APIError:
    return APIError(400, message, param=param, code="unsupported_parameter")


# --------------------------------------------------------------------------------------------- JSON body
def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object (400 for anything else: bad UTF-8, bad JSON, NaN, deep nesting, a list)."""
    if not raw.strip():
        raise bad(None, "the request body is empty; send a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad(None, f"the request body is not valid UTF-8 (byte {e.start})") from None

    def no_constants(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON")

    try:
        body = loads_json(text, "the request body", parse_constant=no_constants)
    except JSONDepthError as e:
        raise bad(None, str(e), code="json_too_deep") from None
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        raise bad(None, f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise bad(None, f"the request body must be a JSON object, got a JSON {_json_type(body)}")
    return body


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


# --------------------------------------------------------------------------------------------- typed getters
_MISSING = object()


def _get(body: Mapping[str, Any], name: str) -> Any:
    v = body.get(name, _MISSING)
    return _MISSING if v is None else v  # JSON null = not given, as OpenAI treats it


def _number(body: Mapping[str, Any], name: str, default: float, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> float:
    v = _get(body, name)
    if v is _MISSING:
        return default
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise bad(name, f"{name} must be a number, got {_json_type(v)} {json.dumps(v)[:40]}")
    lb = "(" if lo_open else "["
    rb = ")" if hi_open else "]"
    try:
        f = float(v)
    except OverflowError:  # an integer past float's range (JSON allows any number of digits)
        raise bad(name, f"{name} must be in {lb}{lo:g}, {hi:g}{rb}, got an integer of {len(str(abs(v)))} digits") from None
    if not math.isfinite(f):
        raise bad(name, f"{name} must be a number, got {_json_type(v)} {json.dumps(v)[:40]}")
    if (f < lo or (lo_open and f == lo)) or (f > hi or (hi_open and f == hi)):
        raise bad(name, f"{name} must be in {lb}{lo:g}, {hi:g}{rb}, got {f:g}")
    return f


def _integer(body: Mapping[str, Any], name: str, default: Any, lo: int, hi: int) -> Any:
    v = _get(body, name)
    if v is _MISSING:
        return default
    if isinstance(v, float) and v.is_integer():
        v = int(v)  # 5.0 from a JavaScript client is 5
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise bad(name, f"{name} must be an integer, got {_json_type(v)} {json.dumps(v)[:40]}")
    n = int(v)
    if not lo <= n <= hi:
        raise bad(name, f"{name} must be in [{lo}, {hi}], got {n}")
    return n


def _boolean(body: Mapping[str, Any], name: str, default: bool) -> bool:
    v = _get(body, name)
    if v is _MISSING:
        return default
    if not isinstance(v, bool):
        raise bad(name, f"{name} must be true or false, got {_json_type(v)}")
    return v


def _string(v: Any, name: str) -> str:
    if not isinstance(v, str):
        raise bad(name, f"{name} must be a string, got {_json_type(v)}")
    return v


# --------------------------------------------------------------------------------------------- the request
@dataclass
class CompletionRequest:
    """A parsed /v1/chat/completions or /v1/completions request."""

    kind: str  # "chat" or "completion"
    messages: list[dict[str, str]] | None
    prompt: str | None
    prompt_tokens: list[int] | None
    sampling: SamplingParams
    max_tokens: int | None  # None: until the context is full
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    speculative: bool
    draft_max: int | None
    show_draft: bool
    model: str | None
    constraint: Constraint | None = None  # what the output must look like (response_format, grammar, tools)
    tools: list[Tool] = field(default_factory=list)  # offered tools (chat), when tool_choice is not "none"
    tool_choice: str = "none"  # "none", "auto", "required" or a function name
    logprobs: int | None = None  # None = off; else how many top alternatives per token
    infill: "InfillInput | None" = None  # fill-in-the-middle: the prompt is built from the code around the cursor
    ignored: tuple[str, ...] = ()  # keys of the body this server does not read (reported, never silent)


@dataclass(frozen=True)
class InfillInput:
    """The code around the cursor (Engine.infill_tokens's arguments)."""

    prefix: str
    suffix: str
    extra: tuple[ExtraChunk, ...] = ()
    prompt: str = ""


# Keys _common and the parsers read (and those refused in _UNSUPPORTED): anything else in a body is reported ignored.
COMMON_KEYS = frozenset({
    "model", "stream", "stream_options", "max_completion_tokens", "max_tokens", "n_predict", "temperature", "top_p",
    "seed", "repeat_last_n", "top_k", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty", "speculative",
    "draft_max", "speculative.n_max", "stop", "show_draft", "logprobs", "top_logprobs",
    "response_format", "json_schema", "grammar", "tools", "tool_choice", "parallel_tool_calls", "samplers",
})


def ignored_keys(body: Mapping[str, Any], known: frozenset[str] | set[str]) -> tuple[str, ...]:
    """The body's keys outside `known` and the refused features, in a stable order."""
    refused = {k for k, _, _ in _UNSUPPORTED}
    return tuple(sorted(k for k in body if k not in known and k not in COMMON_KEYS and k not in refused))


def parse_chat(body: Mapping[str, Any]) -> CompletionRequest:
    _refuse_unsupported(body)
    tools, choice, parallel = _tools(body)
    messages = _messages(_get(body, "messages"))
    constraint = _output_constraint(body)
    if choice != "none":
        if constraint is not None:
            raise unsupported("response_format", "response_format together with tools is not supported; send one or the other")
        constraint = _constraint_or_400("tools", lambda: tool_constraint(tools, choice, parallel=parallel))
    try:
        messages = tool_history(messages)  # checked here; rendered (with the tools) by the engine, for its template
    except ConfigError as e:
        raise bad("messages", str(e)) from None
    req = replace(_common(body, "chat", messages=messages), ignored=ignored_keys(body, {"messages"}))
    lp: int | None = None
    if _boolean(body, "logprobs", False):
        lp = _integer(body, "top_logprobs", 0, 0, 20)
    elif _get(body, "top_logprobs") not in (_MISSING, None, 0):
        raise bad("top_logprobs", "top_logprobs needs logprobs: true")
    return _no_infill_with(replace(req, constraint=constraint, tools=tools if choice != "none" else [], tool_choice=choice, logprobs=lp))


def parse_completion(body: Mapping[str, Any]) -> CompletionRequest:
    suffix = _get(body, "suffix")
    if suffix is not _MISSING and suffix != "":  # insertion: the prompt is the code before the cursor
        _string(suffix, "suffix")
        body = {k: v for k, v in body.items() if k != "suffix"}
    _refuse_unsupported(body)
    for key in ("tools", "tool_choice"):
        if _get(body, key) not in (_MISSING, None, [], "none"):
            raise unsupported(key, f"{key} is for /v1/chat/completions")
    prompt, tokens = _prompt(_get(body, "prompt"))
    lp = _integer(body, "logprobs", None, 0, 5)  # the completions API: how many alternatives (null = off)
    req = replace(_common(body, "completion", prompt=prompt, tokens=tokens), ignored=ignored_keys(body, {"prompt", "suffix"}),
                  constraint=_output_constraint(body), logprobs=lp)
    _no_infill_with(req)
    if suffix is _MISSING or suffix == "":
        return req
    if prompt is None:
        raise unsupported("suffix", "suffix needs the prompt as a string (the code before the cursor), not token ids")
    return replace(req, prompt=None, infill=InfillInput(prefix=prompt, suffix=suffix))


def _no_infill_with(req: CompletionRequest) -> CompletionRequest:
    """The infill sampler ends a completion with a token a grammar may forbid: not with a constraint."""
    if req.sampling.infill and req.constraint is not None:
        raise unsupported("samplers", "the infill sampler cannot be combined with grammar, json_schema, response_format or tools")
    return req


def _constraint_or_400(param: str, make: Any) -> Any:
    try:
        return make()
    except ConfigError as e:
        raise bad(param, str(e), code="invalid_" + param.split(".")[0]) from None


def _output_constraint(body: Mapping[str, Any]) -> Constraint | None:
    """response_format, or llama-server's json_schema / grammar fields (at most one of them)."""
    found: list[tuple[str, Any]] = []
    rf = _get(body, "response_format")
    if rf is not _MISSING and rf is not None:
        found.append(("response_format", lambda: constraint_from_response_format(rf)))
    js = _get(body, "json_schema")
    if js not in (_MISSING, None, {}):
        found.append(("json_schema", lambda: Constraint.json_schema(js)))
    gr = _get(body, "grammar")
    if gr not in (_MISSING, None, ""):
        found.append(("grammar", lambda: Constraint.grammar(_string(gr, "grammar"))))
    if len(found) > 1:
        raise bad(found[1][0], f"give only one of {', '.join(k for k, _ in found)}")
    return _constraint_or_400(found[0][0], found[0][1]) if found else None


def _tools(body: Mapping[str, Any]) -> tuple[list[Tool], str, bool]:
    tools_v = _get(body, "tools")
    tools = _constraint_or_400("tools", lambda: check_tools(None if tools_v is _MISSING else tools_v))
    choice_v = _get(body, "tool_choice")
    choice = _constraint_or_400("tool_choice", lambda: check_tool_choice(None if choice_v is _MISSING else choice_v, tools))
    parallel = _boolean(body, "parallel_tool_calls", True)
    return tools, choice, parallel


def _messages(v: Any) -> list[dict[str, Any]]:
    if v is _MISSING:
        raise bad("messages", "messages is required: a list of {\"role\", \"content\"} objects", code="missing_required_parameter")
    if not isinstance(v, list):
        raise bad("messages", f"messages must be an array, got {_json_type(v)}")
    if not v:
        raise bad("messages", "messages must not be empty")
    out = []
    for i, m in enumerate(v):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(where, f"{where} must be an object with role and content, got {_json_type(m)}")
        role = m.get("role")
        if role == "function" or m.get("function_call"):
            raise unsupported(where, f"{where}: the legacy function-call messages are not supported; use tools")
        if role == "tool":
            tool: dict[str, Any] = {"role": "tool", "content": _content(m.get("content"), f"{where}.content")}
            if isinstance(m.get("tool_call_id"), str):
                tool["tool_call_id"] = m["tool_call_id"]
            out.append(tool)
            continue
        if not isinstance(role, str) or role not in ROLES:
            raise bad(f"{where}.role", f"{where}.role must be one of system, developer, user, assistant, tool; got {json.dumps(role)[:40]}")
        name = m.get("name")
        if name is not None and name != "":
            # the chat template layer sees role and content only: a name would be dropped without a word
            raise unsupported(f"{where}.name", f"{where}.name: message names are not passed to the chat template by this "
                                               "server; put the name into the content instead")
        content = m.get("content")
        if content is None and role == "assistant":
            content = ""
        msg: dict[str, Any] = {"role": ROLES[role], "content": _content(content, f"{where}.content")}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = m["tool_calls"]
        out.append(msg)
    return out


def _content(v: Any, where: str) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        texts = []
        for j, part in enumerate(v):
            pw = f"{where}[{j}]"
            if not isinstance(part, dict):
                raise bad(pw, f"{pw} must be an object like {{\"type\": \"text\", \"text\": \"...\"}}")
            kind = part.get("type")
            if kind != "text":
                raise unsupported(pw, f"{pw}: content parts of type {json.dumps(kind)[:40]} are not supported (text only)")
            texts.append(_string(part.get("text"), f"{pw}.text"))
        return "\n".join(texts)
    if v is None:
        raise bad(where, f"{where} is required")
    raise bad(where, f"{where} must be a string or an array of text parts, got {_json_type(v)}")


def _prompt(v: Any) -> tuple[str | None, list[int] | None]:
    if v is _MISSING:
        raise bad("prompt", "prompt is required", code="missing_required_parameter")
    if isinstance(v, str):
        return v, None
    if isinstance(v, list):
        if len(v) == 1 and isinstance(v[0], (str, list)):
            return _prompt(v[0])  # a batch of one
        if v and all(isinstance(t, int) and not isinstance(t, bool) for t in v):
            return None, list(v)
        if not v:
            raise bad("prompt", "prompt must not be empty")
        if all(isinstance(p, (str, list)) for p in v):
            raise unsupported("prompt", "several prompts in one request are not supported; send one request per prompt")
    raise bad("prompt", f"prompt must be a string or an array of token ids, got {_json_type(v)}")


def _is_int(v: Any, n: int) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and v == n


# Features a client may ask for that this server does not have: a 400 rather than a silently different answer.
# Each entry: (key, test of the value that is still fine, what to say).
_UNSUPPORTED: list[tuple[str, Any, str]] = [
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
    ("typical_p", lambda v: v == 1, "typical_p is not supported"),
    ("tfs_z", lambda v: v == 1, "tfs_z is not supported"),
    ("dynatemp_range", lambda v: v == 0, "dynamic temperature is not supported"),
    ("dry_multiplier", lambda v: v == 0, "DRY sampling is not supported"),
    ("xtc_probability", lambda v: v == 0, "XTC sampling is not supported"),
    ("top_n_sigma", lambda v: v in (-1, 0), "top_n_sigma is not supported"),
    ("lora", lambda v: v == [], "LoRA adapters are not supported"),
]


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    for key, fine, message in _UNSUPPORTED:
        v = _get(body, key)
        if v is _MISSING:
            continue
        try:
            ok = bool(fine(v))
        except Exception:  # noqa: BLE001 - a value of a strange type is simply not fine
            ok = False
        if not ok:
            raise unsupported(key, message)


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    v = _get(body, "stop")
    if v is _MISSING:
        return ()
    if isinstance(v, str):
        return (v,) if v else ()
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise bad("stop", "stop must be a string or an array of strings")
    if len(v) > MAX_STOPS:
        raise bad("stop", f"stop has {len(v)} strings; at most {MAX_STOPS}")
    return tuple(s for s in v if s)


def _sampler_chain(body: Mapping[str, Any]) -> list[str] | None:
    """llama-server's `samplers` (a custom sampler chain) as llama.cpp's names, or None when not given."""
    v = _get(body, "samplers")
    if v is _MISSING:
        return None
    try:
        return parse_names(v)
    except ChainError as e:
        raise unsupported("samplers", str(e)) from None


def _common(body: Mapping[str, Any], kind: str, *, messages: Any = None, prompt: Any = None, tokens: Any = None) -> CompletionRequest:
    model = _get(body, "model")
    if model is not _MISSING:
        _string(model, "model")
    stream = _boolean(body, "stream", False)
    include_usage = False
    so = _get(body, "stream_options")
    if so is not _MISSING:
        if not stream:
            raise bad("stream_options", "stream_options is only allowed when stream is true")
        if not isinstance(so, dict):
            raise bad("stream_options", "stream_options must be an object")
        try:
            include_usage = _boolean(so, "include_usage", False)
        except APIError as e:
            raise bad("stream_options.include_usage", "stream_options." + e.message) from None
    mct = _integer(body, "max_completion_tokens", None, 1, MAX_TOKENS_LIMIT)
    mt = _integer(body, "max_tokens", None, 1, MAX_TOKENS_LIMIT)
    if mct is not None and mt is not None and mct != mt:
        raise bad("max_tokens", f"max_tokens ({mt}) and max_completion_tokens ({mct}) disagree; send one of them")
    n_predict = _integer(body, "n_predict", None, -1, MAX_TOKENS_LIMIT)  # llama.cpp's name; -1 = no limit
    max_tokens = mct if mct is not None else mt if mt is not None else (n_predict if n_predict not in (None, -1, 0) else None)
    if n_predict == 0 and mct is None and mt is None:
        raise bad("n_predict", "n_predict must be -1 or at least 1")
    chain = _sampler_chain(body)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0.0 and (chain is None or "top_p" in chain):  # only the most likely token survives: greedy
        temperature, top_p = 0.0, 1.0
        if chain is not None:  # greedy where top_p was (greedy overrides any temperature)
            chain = ["temperature" if n == "top_p" else n for n in chain if n != "temperature"]
    seed = _integer(body, "seed", None, -1, MAX_SEED)
    repeat_last_n = _integer(body, "repeat_last_n", 64, -1, MAX_TOKENS_LIMIT)
    try:
        sampling = SamplingParams(
            temperature=temperature,
            top_p=top_p,
            top_k=max(0, _integer(body, "top_k", 0, -1, 1 << 30)),
            min_p=_number(body, "min_p", 0.0, 0.0, 1.0, hi_open=True),
            repeat_penalty=_number(body, "repeat_penalty", 1.0, 1e-6, 1e6),
            presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
            frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
            repeat_last_n=MAX_TOKENS_LIMIT if repeat_last_n == -1 else repeat_last_n,
            seed=None if seed in (None, -1) else seed,
        )
    except ConfigError as e:  # the ranges above are narrower; this is a guard
        raise bad(None, str(e)) from None
    if chain is not None:
        try:
            sampling = apply_chain(chain, sampling)
        except ChainError as e:
            raise unsupported("samplers", str(e)) from None
    speculative = _boolean(body, "speculative", True)
    draft_max = _integer(body, "draft_max", None, 0, 64)
    n_max = _integer(body, "speculative.n_max", None, 0, 64)  # llama-server's spelling
    if draft_max is None:
        draft_max = n_max
    if draft_max == 0:
        speculative = False
    return CompletionRequest(
        kind=kind,
        messages=messages,
        prompt=prompt,
        prompt_tokens=tokens,
        sampling=sampling,
        max_tokens=max_tokens,
        stop=_stop(body),
        stream=stream,
        include_usage=include_usage and stream,
        speculative=speculative,
        draft_max=draft_max,
        show_draft=_boolean(body, "show_draft", False),
        model=None if model is _MISSING else model,
    )


__all__ = ["APIError", "CompletionRequest", "InfillInput", "ignored_keys", "COMMON_KEYS", "error_body", "parse_json", "parse_chat",
           "parse_completion", "bad", "unsupported"]
