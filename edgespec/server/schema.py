"""Requests in, edgespec settings out: check an OpenAI-style request body and shape errors the way OpenAI clients
read them (`{"error": {"message", "type", "param", "code"}}`).

The bodies' parameters are pydantic models (CommonBody, ChatBody, CompletionBody; the other routes' own fields in
their route modules, with `Says` for an API's own wording); `validate_body` checks a body against one, and
`validation_error` is the one place where a pydantic ValidationError becomes the one-line 400 that names the
parameter. What a model cannot say alone (messages and their content parts, prompts, the sampler chain, what
combines with what) is checked after it, here. Every problem with a request is an `APIError`.

Nothing a client sends is ignored when it would change the answer: features edgespec does not have (n > 1,
logit_bias, mirostat...) are refused with a 400 that says so (UNSUPPORTED). `response_format` (JSON object / JSON
schema), llama-server's `json_schema` and `grammar`, and `tools`/`tool_choice` become a constraint
(edgespec/decoding/structured.py builds it, so every route shares it). Unknown keys are accepted, as llama-server and most
OpenAI-compatible servers do, so that clients sending newer optional fields keep working, but never in silence:
`CompletionRequest.ignored` lists them, the response carries them in an `X-Edgespec-Ignored-Params` header and the
server logs each name once (docs/server.md).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Mapping, TypeVar

from pydantic import AllowInfNan, BaseModel, BeforeValidator, ConfigDict, Field, Strict, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from edgespec.config import API_SAMPLING, MAX_SEED, SamplingParams
from edgespec.decoding.constraint import Constraint
from edgespec.errors import ConfigError
from edgespec.prompts.infill import ExtraChunk
from edgespec.decoding.structured import Tool, check_tool_choice, check_tools, constraint_from_response_format, tool_constraint, tool_history
from edgespec.untrusted import JSONDepthError, loads as loads_json
from .samplers import ChainError, apply_chain, parse_names

MAX_STOPS = 32
MAX_TOKENS_LIMIT = 1 << 20
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
B = TypeVar("B", bound=BaseModel)


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

    outside: list[_Outside] = []

    def number(literal: str, value: float | int) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            outside.append(_Outside(literal))
            return outside[-1]
        return value

    def parse_int(literal: str) -> Any:
        # past Python's limit on the digits of an int read from text (4,300), int() fails: a number out of range
        return number(literal, int(literal)) if len(literal) <= _MAX_INT_DIGITS else number(literal, math.inf)

    hooks: dict[str, Any] = {"parse_constant": lambda c: number(c, float(c)), "parse_float": lambda f: number(f, float(f))}
    try:
        try:
            body = loads_json(text, "the request body", **hooks)
        except ValueError as e:
            if isinstance(e, (json.JSONDecodeError, JSONDepthError)):
                raise
            # int() refused an integer of too many digits: read again with every int through parse_int (slower: only
            # then, as bodies of token ids hold millions of ints)
            body = loads_json(text, "the request body", parse_int=parse_int, **hooks)
    except JSONDepthError as e:
        raise bad(None, str(e), code="json_too_deep") from None
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        raise bad(None, f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise bad(None, f"the request body must be a JSON object, got a JSON {_json_type(body)}")
    if outside:
        where = _path_to(body, lambda v: v is outside[0])
        raise bad(where, f"{where} must be a finite number, got {outside[0].shown()}")
    return body


# an int read from text may have at most this many digits (sys.get_int_max_str_digits(), 4,300 by default)
_MAX_INT_DIGITS = (getattr(sys, "get_int_max_str_digits", lambda: 0)() or 4300) - 1


class _Outside(float):
    """A JSON number a double cannot hold (1e309, -1e309, an integer of thousands of digits) or JSON's non-standard
    NaN / Infinity, as Python's json reads them: infinite or NaN. parse_json answers each with a 400 naming where it
    is in the body (its path: options.temperature, messages[0].x)."""

    literal: str

    def __new__(cls, literal: str) -> "_Outside":
        v = float("nan") if literal == "NaN" else float("-inf") if literal.startswith("-") else float("inf")
        out = super().__new__(cls, v)
        out.literal = literal
        return out

    def shown(self) -> str:
        if self.literal in ("NaN", "Infinity", "-Infinity"):
            return self.literal
        digits = self.literal.lstrip("-")
        if digits.isdigit():
            return f"an integer of {len(digits)} digits"
        text = self.literal if len(self.literal) <= 40 else f"a number written with {len(self.literal)} characters"
        return f"{text} (outside the range of a double)"


def _path_to(obj: Any, hit: Any) -> str | None:
    """The path (a.b[0].c) of the first value in obj for which hit(value) is true, walking without recursion."""
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        where, v = stack.pop()
        if hit(v):
            return where
        if isinstance(v, dict):
            stack.extend((f"{where}.{k}" if where else str(k), c) for k, c in reversed(list(v.items())))
        elif isinstance(v, list):
            stack.extend((f"{where}[{i}]", c) for i, c in reversed(list(enumerate(v))))
    return None


# --------------------------------------------------------------------------------------------- body models
# The parameters' types and ranges are pydantic models (CommonBody, ChatBody, CompletionBody); a ValidationError
# becomes the one-line OpenAI-shaped 400 in one place (`validation_error`). JSON null is "not given" (None), as
# OpenAI treats it; unknown keys are kept (extra="allow") and reported ignored.
class _Kind:
    """Field metadata: how a range error is worded (a number's bounds with :g and open/closed brackets, or an integer's)."""

    def __init__(self, name: str) -> None:
        self.name = name


NUMBER, INTEGER = _Kind("number"), _Kind("integer")


class Says:
    """Field metadata: the line any error in this field is answered with (an API's own wording, e.g. llama-server's
    or Ollama's); `item` words an error inside one element of an array field ("{where}" is that element's name,
    input_extra[2]), which is then the parameter named."""

    def __init__(self, message: str, item: str | None = None) -> None:
        self.message = message
        self.item = item


def _integral(v: Any) -> Any:
    return int(v) if isinstance(v, float) and v.is_integer() else v  # 5.0 from a JavaScript client is 5


Num = Annotated[float, Strict(), AllowInfNan(False)]  # a finite JSON number (an integer too), never a string or a boolean
Int = Annotated[int, BeforeValidator(_integral), Strict()]
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]


Number = Annotated[Num | None, Field(allow_inf_nan=False), NUMBER]  # a range: Annotated[Number, Field(ge=..., le=...)]
Integer = Annotated[Int | None, INTEGER]


class Body(BaseModel):
    """Every request body model: unknown keys are kept (reported in the ignored-parameters header), values frozen."""

    model_config = ConfigDict(extra="allow", frozen=True)


class StreamOptions(Body):
    include_usage: Bool | None = None


class CommonBody(Body):
    """What chat completions and completions share (in the order they are checked); llama-server's and edgespec's
    own keys included. Constraints (response_format, json_schema, grammar, tools) are compiled by structured.py and
    constraint.py, the sampler chain by samplers.py."""

    model: Str | None = None
    stream: Bool | None = None
    stream_options: StreamOptions | None = None
    max_completion_tokens: Annotated[Integer, Field(ge=1, le=MAX_TOKENS_LIMIT)] = None
    max_tokens: Annotated[Integer, Field(ge=1, le=MAX_TOKENS_LIMIT)] = None
    n_predict: Annotated[Integer, Field(ge=-1, le=MAX_TOKENS_LIMIT)] = None  # llama.cpp's name; -1 = no limit
    samplers: Any = None
    temperature: Annotated[Number, Field(ge=0.0, le=2.0)] = None
    top_p: Annotated[Number, Field(ge=0.0, le=1.0)] = None
    seed: Annotated[Integer, Field(ge=-1, le=MAX_SEED)] = None
    repeat_last_n: Annotated[Integer, Field(ge=-1, le=MAX_TOKENS_LIMIT)] = None
    top_k: Annotated[Integer, Field(ge=-1, le=1 << 30)] = None
    min_p: Annotated[Number, Field(ge=0.0, lt=1.0)] = None
    repeat_penalty: Annotated[Number, Field(ge=1e-6, le=1e6)] = None
    presence_penalty: Annotated[Number, Field(ge=-2.0, le=2.0)] = None
    frequency_penalty: Annotated[Number, Field(ge=-2.0, le=2.0)] = None
    speculative: Bool | None = None
    draft_max: Annotated[Integer, Field(ge=0, le=64)] = None
    speculative_n_max: Annotated[Integer, Field(ge=0, le=64, alias="speculative.n_max")] = None  # llama-server's spelling
    stop: Any = None
    show_draft: Bool | None = None
    logprobs: Any = None
    response_format: Any = None
    json_schema: Any = None
    grammar: Str | None = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Bool | None = None

    @field_validator("stream_options", mode="before")
    @classmethod
    def _with_stream(cls, v: Any, info: ValidationInfo) -> Any:
        if v is not None and not info.data.get("stream"):
            raise PydanticCustomError("edgespec", "stream_options is only allowed when stream is true")
        return v

    @field_validator("stop", mode="after")
    @classmethod
    def _stops(cls, v: Any) -> Any:
        if v is None or isinstance(v, str):
            return v
        if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
            raise PydanticCustomError("edgespec", "stop must be a string or an array of strings")
        if len(v) > MAX_STOPS:
            raise PydanticCustomError("edgespec", "stop has {n} strings; at most {limit}", {"n": len(v), "limit": MAX_STOPS})
        return v


class ChatBody(CommonBody):
    messages: Any = None
    logprobs: Bool | None = None
    top_logprobs: Annotated[Integer, Field(ge=0, le=20)] = None

    @field_validator("top_logprobs", mode="before")
    @classmethod
    def _with_logprobs(cls, v: Any, info: ValidationInfo) -> Any:
        if not info.data.get("logprobs") and v not in (None, 0):
            raise PydanticCustomError("edgespec", "top_logprobs needs logprobs: true")
        return v


class CompletionBody(CommonBody):
    prompt: Any = None
    suffix: Str | None = None
    logprobs: Annotated[Integer, Field(ge=0, le=5)] = None  # the completions API: how many alternatives (null = off)
    # chat's field, not the completions API's (`logprobs` is the count here): checked as chat checks it, then not
    # read (reported ignored: it is outside COMMON_KEYS)
    top_logprobs: Annotated[Integer, Field(ge=0, le=20)] = None


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


def _where(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as the parameter's name: stream_options.include_usage, messages[0].role."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _metadata(model: type[BaseModel], name: Any) -> list[Any]:
    """The metadata of the top-level field `name` (by its alias: the body's key)."""
    field_info = next((f for n, f in model.model_fields.items() if (f.alias or n) == name), None)
    return list(field_info.metadata) if field_info is not None else []


def _limits(model: type[BaseModel], name: str) -> tuple[_Kind | None, Any, Any, bool, bool]:
    """(kind, lower bound, upper bound, lower open, upper open) of a top-level field."""
    kind, lo, hi, lo_open, hi_open = None, None, None, False, False
    for m in _metadata(model, name):
        if isinstance(m, _Kind):
            kind = m
        for attr, is_lo, is_open in (("ge", True, False), ("gt", True, True), ("le", False, False), ("lt", False, True)):
            v = getattr(m, attr, None)
            if v is not None:
                if is_lo:
                    lo, lo_open = v, is_open
                else:
                    hi, hi_open = v, is_open
    return kind, lo, hi, lo_open, hi_open


def validation_error(e: ValidationError, model: type[BaseModel]) -> APIError:
    """A pydantic ValidationError as the one-line 400 this server answers (the first error; the parameter named)."""
    err = e.errors(include_url=False)[0]
    loc = tuple(err["loc"])
    name = _where(loc)
    v = err.get("input")
    kind = err["type"]
    if kind == "edgespec":  # a check of our own, worded in full
        return bad(name, str(err["msg"]))
    says = next((m for m in _metadata(model, loc[0]) if isinstance(m, Says)), None) if loc else None
    if says is not None:
        if says.item is not None and len(loc) > 1 and isinstance(loc[1], int):
            where = _where(loc[:2])
            return bad(where, says.item.format(where=where))
        return bad(str(loc[0]), says.message)
    shown = f"{_json_type(v)} {json.dumps(v, default=str)[:40]}"
    if kind in ("bool_type", "bool_parsing"):
        return bad(name, f"{name} must be true or false, got {_json_type(v)}")
    if kind in ("string_type", "string_unicode"):
        return bad(name, f"{name} must be a string, got {_json_type(v)}")
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return bad(name, f"{name} must be an object")
    if kind in ("int_type", "int_from_float", "int_parsing"):
        return bad(name, f"{name} must be an integer, got {shown}")
    f_kind, lo, hi, lo_open, hi_open = _limits(model, name)
    lb, rb = "(" if lo_open else "[", ")" if hi_open else "]"
    if kind in ("float_type", "float_parsing") and isinstance(v, int) and not isinstance(v, bool) and lo is not None:
        # an integer past float's range (JSON allows any number of digits)
        return bad(name, f"{name} must be in {lb}{lo:g}, {hi:g}{rb}, got an integer of {len(str(abs(v)))} digits")
    if kind in ("float_type", "float_parsing", "finite_number"):
        return bad(name, f"{name} must be a number, got {shown}")
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal") and lo is not None and hi is not None:
        if f_kind is INTEGER:
            got = _integral(v)
            digits = len(str(abs(got))) if isinstance(got, int) else 0
            shown_int = f"{v:g}" if isinstance(v, float) and digits > 20 else got if digits <= 20 else f"an integer of {digits} digits"
            return bad(name, f"{name} must be in [{lo}, {hi}], got {shown_int}")
        return bad(name, f"{name} must be in {lb}{lo:g}, {hi:g}{rb}, got {float(v):g}")
    return bad(name or None, f"{name + ': ' if name else ''}{err['msg']}")  # a check without words of our own


def validate_body(model: type[B], body: Mapping[str, Any]) -> B:
    """The body as `model` (400 on the first problem, worded by validation_error)."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise validation_error(e, model) from None


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


# Keys CommonBody reads (and those refused in UNSUPPORTED): anything else in a body is reported ignored.
COMMON_KEYS = frozenset(f.alias or n for n, f in CommonBody.model_fields.items())


def ignored_keys(body: Mapping[str, Any], known: frozenset[str] | set[str]) -> tuple[str, ...]:
    """The body's keys outside `known`, CommonBody's fields and the refused features, in a stable order."""
    refused = {k for k, _, _ in UNSUPPORTED}
    return tuple(sorted(k for k in body if k not in known and k not in COMMON_KEYS and k not in refused))


def parse_chat(body: Mapping[str, Any]) -> CompletionRequest:
    _refuse_unsupported(body)
    m = validate_body(ChatBody, body)
    tools, choice, parallel = _tools(m)
    messages = _messages(m.messages)
    constraint = _output_constraint(m)
    if choice != "none":
        if constraint is not None:
            raise unsupported("response_format", "response_format together with tools is not supported; send one or the other")
        constraint = _constraint_or_400("tools", lambda: tool_constraint(tools, choice, parallel=parallel))
    try:
        messages = tool_history(messages)  # checked here; rendered (with the tools) by the engine, for its template
    except ConfigError as e:
        raise bad("messages", str(e)) from None
    req = replace(_common(m, "chat", messages=messages), ignored=ignored_keys(body, {"messages", "top_logprobs"}))
    lp = (m.top_logprobs or 0) if m.logprobs else None
    return _no_infill_with(replace(req, constraint=constraint, tools=tools if choice != "none" else [], tool_choice=choice, logprobs=lp))


def parse_completion(body: Mapping[str, Any]) -> CompletionRequest:
    suffix = body.get("suffix")
    if suffix is not None and suffix != "":  # insertion: the prompt is the code before the cursor
        m = validate_body(CompletionBody, body)
        body = {k: v for k, v in body.items() if k != "suffix"}
        _refuse_unsupported(body)
    else:
        _refuse_unsupported(body)
        m = validate_body(CompletionBody, body)
    for key in ("tools", "tool_choice"):
        if getattr(m, key) not in (None, [], "none"):
            raise unsupported(key, f"{key} is for /v1/chat/completions")
    prompt, tokens = _prompt(m.prompt)
    req = replace(_common(m, "completion", prompt=prompt, tokens=tokens), ignored=ignored_keys(body, {"prompt", "suffix"}),
                  constraint=_output_constraint(m), logprobs=m.logprobs)
    _no_infill_with(req)
    if suffix is None or suffix == "":
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


def _output_constraint(m: CommonBody) -> Constraint | None:
    """response_format, or llama-server's json_schema / grammar fields (at most one of them)."""
    found: list[tuple[str, Any]] = []
    rf, js, gr = m.response_format, m.json_schema, m.grammar
    if rf is not None:
        found.append(("response_format", lambda: constraint_from_response_format(rf)))
    if js not in (None, {}):
        found.append(("json_schema", lambda: Constraint.json_schema(js)))
    if gr is not None and gr != "":
        found.append(("grammar", lambda: Constraint.grammar(gr)))
    if len(found) > 1:
        raise bad(found[1][0], f"give only one of {', '.join(k for k, _ in found)}")
    return _constraint_or_400(found[0][0], found[0][1]) if found else None


def _tools(m: ChatBody) -> tuple[list[Tool], str, bool]:
    tools = _constraint_or_400("tools", lambda: check_tools(m.tools))
    choice = _constraint_or_400("tool_choice", lambda: check_tool_choice(m.tool_choice, tools))
    return tools, choice, m.parallel_tool_calls is not False


def _messages(v: Any) -> list[dict[str, Any]]:
    if v is None:
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
            text = part.get("text")
            if not isinstance(text, str):
                raise bad(f"{pw}.text", f"{pw}.text must be a string, got {_json_type(text)}")
            texts.append(text)
        return "\n".join(texts)
    if v is None:
        raise bad(where, f"{where} is required")
    raise bad(where, f"{where} must be a string or an array of text parts, got {_json_type(v)}")


def _prompt(v: Any) -> tuple[str | None, list[int] | None]:
    if v is None:
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


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
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


def _sampler_chain(v: Any) -> list[str] | None:
    """llama-server's `samplers` (a custom sampler chain) as llama.cpp's names, or None when not given."""
    if v is None:
        return None
    try:
        return parse_names(v)
    except ChainError as e:
        raise unsupported("samplers", str(e)) from None


def _common(m: CommonBody, kind: str, *, messages: Any = None, prompt: Any = None, tokens: Any = None) -> CompletionRequest:
    """The request from what chat completions and completions share (the body's types and ranges checked by m)."""
    stream = bool(m.stream)
    include_usage = m.stream_options is not None and bool(m.stream_options.include_usage)
    mct, mt, n_predict = m.max_completion_tokens, m.max_tokens, m.n_predict
    if mct is not None and mt is not None and mct != mt:
        raise bad("max_tokens", f"max_tokens ({mt}) and max_completion_tokens ({mct}) disagree; send one of them")
    max_tokens = mct if mct is not None else mt if mt is not None else (n_predict if n_predict not in (None, -1, 0) else None)
    if n_predict == 0 and mct is None and mt is None:
        raise bad("n_predict", "n_predict must be -1 or at least 1")
    chain = _sampler_chain(m.samplers)
    d = API_SAMPLING
    temperature = d.temperature if m.temperature is None else m.temperature
    top_p = d.top_p if m.top_p is None else m.top_p
    if top_p == 0.0 and (chain is None or "top_p" in chain):  # only the most likely token survives: greedy
        temperature, top_p = 0.0, 1.0
        if chain is not None:  # greedy where top_p was (greedy overrides any temperature)
            chain = ["temperature" if n == "top_p" else n for n in chain if n != "temperature"]
    repeat_last_n = d.repeat_last_n if m.repeat_last_n is None else m.repeat_last_n

    def given(v: float | None, default: float) -> float:
        return default if v is None else v

    try:
        sampling = SamplingParams(
            temperature=temperature,
            top_p=top_p,
            top_k=max(0, m.top_k or d.top_k),
            min_p=given(m.min_p, d.min_p),
            repeat_penalty=given(m.repeat_penalty, d.repeat_penalty),
            presence_penalty=given(m.presence_penalty, d.presence_penalty),
            frequency_penalty=given(m.frequency_penalty, d.frequency_penalty),
            repeat_last_n=MAX_TOKENS_LIMIT if repeat_last_n == -1 else repeat_last_n,
            seed=None if m.seed in (None, -1) else m.seed,
        )
    except ConfigError as e:  # the ranges above are narrower; this is a guard
        raise bad(None, str(e)) from None
    if chain is not None:
        try:
            sampling = apply_chain(chain, sampling)
        except ChainError as e:
            raise unsupported("samplers", str(e)) from None
    speculative = m.speculative is not False
    draft_max = m.draft_max if m.draft_max is not None else m.speculative_n_max
    if draft_max == 0:
        speculative = False
    stop = (m.stop,) if isinstance(m.stop, str) else tuple(m.stop or ())
    return CompletionRequest(
        kind=kind,
        messages=messages,
        prompt=prompt,
        prompt_tokens=tokens,
        sampling=sampling,
        max_tokens=max_tokens,
        stop=tuple(x for x in stop if x),
        stream=stream,
        include_usage=include_usage and stream,
        speculative=speculative,
        draft_max=draft_max,
        show_draft=bool(m.show_draft),
        model=m.model,
    )


__all__ = ["Body", "APIError", "CompletionRequest", "InfillInput", "ignored_keys", "COMMON_KEYS", "UNSUPPORTED", "error_body", "parse_json",
           "parse_chat", "parse_completion", "bad", "unsupported", "CommonBody", "ChatBody", "CompletionBody", "StreamOptions",
           "validate_body", "validation_error", "Says", "Num", "Int", "Bool", "Str"]
