"""The request bodies' parameters as pydantic models (CommonBody, ChatBody, CompletionBody; the other routes' own
fields in their route modules, with `ErrorText` for an API's own wording), and `validate_body`, which checks a body
against one: `validation_error` is the one place where a pydantic ValidationError becomes the one-line 400 that names
the parameter. JSON null is "not given" (None), as OpenAI treats it; unknown keys are kept (extra="allow") and
reported ignored (refused.ignored_keys)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Mapping, TypeVar

from pydantic import AllowInfNan, BaseModel, BeforeValidator, ConfigDict, Field, Strict, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from edgespec.config import MAX_SEED
from .api_errors import APIError, bad, json_type

MAX_STOPS = 32
MAX_TOKENS_LIMIT = 1 << 20
B = TypeVar("B", bound=BaseModel)


class _RangeWording:
    """Field metadata: how a range error is worded (a number's bounds with :g and open/closed brackets, or an integer's)."""

    def __init__(self, name: str) -> None:
        self.name = name


NUMBER_RANGE, INTEGER_RANGE = _RangeWording("number"), _RangeWording("integer")


class ErrorText:
    """Field metadata: the line any error in this field is answered with (an API's own wording, e.g. llama-server's
    or Ollama's); `item` words an error inside one element of an array field ("{where}" is that element's name,
    input_extra[2]), which is then the parameter named."""

    def __init__(self, message: str, item: str | None = None) -> None:
        self.message = message
        self.item = item


def _integral(v: Any) -> Any:
    return int(v) if isinstance(v, float) and v.is_integer() else v  # 5.0 from a JavaScript client is 5


JsonNumber = Annotated[float, Strict(), AllowInfNan(False)]  # a finite JSON number (an integer too), never a string or a boolean
JsonInteger = Annotated[int, BeforeValidator(_integral), Strict()]  # a JSON integer (5.0 too), never a string or a boolean
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]

# A body's optional numeric parameter (null: not given) with its range error worded: Annotated[NumberParam, Field(ge=..., le=...)]
NumberParam = Annotated[JsonNumber | None, Field(allow_inf_nan=False), NUMBER_RANGE]
IntegerParam = Annotated[JsonInteger | None, INTEGER_RANGE]


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
    max_completion_tokens: Annotated[IntegerParam, Field(ge=1, le=MAX_TOKENS_LIMIT)] = None
    max_tokens: Annotated[IntegerParam, Field(ge=1, le=MAX_TOKENS_LIMIT)] = None
    n_predict: Annotated[IntegerParam, Field(ge=-1, le=MAX_TOKENS_LIMIT)] = None  # llama.cpp's name; -1 = no limit
    samplers: Any = None
    temperature: Annotated[NumberParam, Field(ge=0.0, le=2.0)] = None
    top_p: Annotated[NumberParam, Field(ge=0.0, le=1.0)] = None
    seed: Annotated[IntegerParam, Field(ge=-1, le=MAX_SEED)] = None
    repeat_last_n: Annotated[IntegerParam, Field(ge=-1, le=MAX_TOKENS_LIMIT)] = None
    top_k: Annotated[IntegerParam, Field(ge=-1, le=1 << 30)] = None
    min_p: Annotated[NumberParam, Field(ge=0.0, lt=1.0)] = None
    repeat_penalty: Annotated[NumberParam, Field(ge=1e-6, le=1e6)] = None
    presence_penalty: Annotated[NumberParam, Field(ge=-2.0, le=2.0)] = None
    frequency_penalty: Annotated[NumberParam, Field(ge=-2.0, le=2.0)] = None
    speculative: Bool | None = None
    draft_max: Annotated[IntegerParam, Field(ge=0, le=64)] = None
    speculative_n_max: Annotated[IntegerParam, Field(ge=0, le=64, alias="speculative.n_max")] = None  # llama-server's spelling
    stop: Any = None
    show_draft: Bool | None = None
    show_sources: Bool | None = None  # edgespec's: each streamed delta names where each of its tokens came from
    drafter: Str | None = None  # edgespec's: this request's drafter ("auto", "none" or a kind's name)
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
    top_logprobs: Annotated[IntegerParam, Field(ge=0, le=20)] = None

    @field_validator("top_logprobs", mode="before")
    @classmethod
    def _with_logprobs(cls, v: Any, info: ValidationInfo) -> Any:
        if not info.data.get("logprobs") and v not in (None, 0):
            raise PydanticCustomError("edgespec", "top_logprobs needs logprobs: true")
        return v


class CompletionBody(CommonBody):
    prompt: Any = None
    suffix: Str | None = None
    logprobs: Annotated[IntegerParam, Field(ge=0, le=5)] = None  # the completions API: how many alternatives (null = off)
    # chat's field, not the completions API's (`logprobs` is the count here): checked as chat checks it, then not
    # read (reported ignored: it is outside COMMON_KEYS)
    top_logprobs: Annotated[IntegerParam, Field(ge=0, le=20)] = None


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


def _limits(model: type[BaseModel], name: str) -> tuple[_RangeWording | None, Any, Any, bool, bool]:
    """(kind, lower bound, upper bound, lower open, upper open) of a top-level field."""
    kind, lo, hi, lo_open, hi_open = None, None, None, False, False
    for m in _metadata(model, name):
        if isinstance(m, _RangeWording):
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
    text = next((m for m in _metadata(model, loc[0]) if isinstance(m, ErrorText)), None) if loc else None
    if text is not None:
        if text.item is not None and len(loc) > 1 and isinstance(loc[1], int):
            where = _where(loc[:2])
            return bad(where, text.item.format(where=where))
        return bad(str(loc[0]), text.message)
    shown = f"{json_type(v)} {json.dumps(v, default=str)[:40]}"
    if kind in ("bool_type", "bool_parsing"):
        return bad(name, f"{name} must be true or false, got {json_type(v)}")
    if kind in ("string_type", "string_unicode"):
        return bad(name, f"{name} must be a string, got {json_type(v)}")
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
        if f_kind is INTEGER_RANGE:
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


# Keys CommonBody reads: anything else in a body, but the refused features, is reported ignored.
COMMON_KEYS = frozenset(f.alias or n for n, f in CommonBody.model_fields.items())

__all__ = ["B", "Body", "Bool", "ChatBody", "COMMON_KEYS", "CommonBody", "CompletionBody", "ErrorText", "IntegerParam", "JsonInteger",
           "JsonNumber", "MAX_STOPS", "MAX_TOKENS_LIMIT", "NumberParam", "StreamOptions", "Str", "validate_body", "validation_error"]
