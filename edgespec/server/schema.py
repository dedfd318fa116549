"""Requests in, edgespec settings out: a chat completion or completion body, from its bytes (`parse_json`) to the
`CompletionRequest` a route hands to the core (`parse_chat`, `parse_completion`).

The body's parameters are checked by the pydantic models of bodies.py first; what a model cannot say alone (messages
and their content parts, prompts, the sampler chain, what combines with what) is checked here. Every problem with a
request is an `APIError` (api_errors.py); features edgespec does not have are refused and unknown keys reported
ignored (refused.py). `response_format` (JSON object / JSON schema), llama-server's `json_schema` and `grammar`, and
`tools`/`tool_choice` become a constraint (edgespec/decoding/structured.py builds it, so every route shares it).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from edgespec.config import API_SAMPLING, SamplingParams
from edgespec.decoding.constraint import Constraint
from edgespec.errors import ConfigError
from edgespec.prompts.infill import ExtraChunk
from edgespec.decoding.structured import Tool, check_tool_choice, check_tools, constraint_from_response_format, tool_constraint, tool_history
from edgespec.runtime.request import AUTO, KIND_NAMES
from edgespec.untrusted import JSONDepthError, loads as loads_json
from .api_errors import bad, json_type, unsupported
from .bodies import MAX_TOKENS_LIMIT, ChatBody, CommonBody, CompletionBody, validate_body
from .refused import ignored_keys, refuse_unsupported
from .samplers import ChainError, apply_chain, parse_names

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


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
        raise bad(None, f"the request body must be a JSON object, got a JSON {json_type(body)}")
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
    show_sources: bool = False  # each streamed delta carries `sources`: [text, "draft" | "lookup" | "target"] per token
    drafter: str | None = None  # the body's `drafter` kind name; None: the engine's ("auto")
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


def parse_chat(body: Mapping[str, Any]) -> CompletionRequest:
    refuse_unsupported(body)
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
        refuse_unsupported(body)
    else:
        refuse_unsupported(body)
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
        raise bad("messages", f"messages must be an array, got {json_type(v)}")
    if not v:
        raise bad("messages", "messages must not be empty")
    out = []
    for i, m in enumerate(v):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(where, f"{where} must be an object with role and content, got {json_type(m)}")
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
                raise bad(f"{pw}.text", f"{pw}.text must be a string, got {json_type(text)}")
            texts.append(text)
        return "\n".join(texts)
    if v is None:
        raise bad(where, f"{where} is required")
    raise bad(where, f"{where} must be a string or an array of text parts, got {json_type(v)}")


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
    raise bad("prompt", f"prompt must be a string or an array of token ids, got {json_type(v)}")


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
    drafter = _drafter(m.drafter)
    if drafter == "none":
        speculative, drafter = False, None
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
        show_sources=bool(m.show_sources),
        drafter=drafter if speculative else None,
    )


def _drafter(v: str | None) -> str | None:
    """The body's `drafter` (edgespec's extension): None for "auto" or none given, else a drafter kind's name."""
    if v is None or v == AUTO:
        return None
    if v not in KIND_NAMES:
        raise bad("drafter", f"drafter must be one of {', '.join((AUTO,) + KIND_NAMES)}, got {json.dumps(v)[:60]}")
    return v


__all__ = ["CompletionRequest", "InfillInput", "parse_chat", "parse_completion", "parse_json"]
