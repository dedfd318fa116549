"""OpenAI's Responses API: `POST /v1/responses` (one JSON response object, or server-sent events with the
Responses event types) and `GET /v1/responses/{id}`, for the openai SDK's `responses.*`, the OpenAI Agents SDK and
other clients built on it.

A Responses request is translated, in `to_chat_body`, into the body of a chat completions request and parsed by the
same code (schema.parse_chat): `instructions` becomes a system message, `input` (a string or message items) the
messages, `max_output_tokens` max_completion_tokens, `text.format` response_format and function `tools` chat tools.
Structured output and function tools are chat completions' own (edgespec/decoding/structured.py): `text.format` holds the
output to a JSON schema, and a tool call comes back as `function_call` output items; `function_call` and
`function_call_output` input items become the assistant tool calls and tool results of the chat messages. With tools
the answer is streamed at its end (a call is known only once its text is complete). What chat completions refuses is
refused here under the Responses name.

`previous_response_id` continues a stored conversation: each stored response keeps its input messages and output,
in a bounded in-memory store (the oldest go first; `store: false` keeps nothing). As OpenAI does, the previous
response's `instructions` are not carried over.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Mapping

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Send

from . import schema
from . import sse
from .core import JSON, ResponseStore, Stored, generate, read_bound, send_json, server_state
from .responses import GenerationResponse, edgespec_stats, ignored_headers, timings
from .api_errors import APIError, bad, unsupported
from .bodies import MAX_TOKENS_LIMIT, Body, Bool, ErrorText, IntegerParam, Str, validate_body
from .schema import CompletionRequest

# OpenAI's limits on `metadata`: 16 pairs, keys of at most 64 characters, string values of at most 512
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
# Keys read here; the parameters OpenAI defines that do not change the answer are accepted and reported ignored
# (max_tool_calls: it limits calls to OpenAI's built-in tools, and only function tools are served here).
KNOWN = frozenset({"model", "input", "instructions", "previous_response_id", "max_output_tokens", "temperature", "top_p",
                   "stream", "store", "text", "tools", "tool_choice", "seed", "stop", "top_k", "min_p", "repeat_penalty",
                   "presence_penalty", "frequency_penalty", "speculative", "draft_max", "show_draft", "reasoning",
                   "include", "background", "top_logprobs", "truncation", "parallel_tool_calls",
                   "stream_options", "conversation", "prompt", "metadata"})
# parameter -> the chat completions key it becomes (for errors chat completions raises)
RENAMED = {"response_format": "text.format", "max_completion_tokens": "max_output_tokens"}


# --------------------------------------------------------------------------------------------- the request
class ResponsesBody(Body):
    """The Responses fields checked here; the others become chat completions keys (to_chat_body), checked there."""

    previous_response_id: Annotated[Str | None, ErrorText("previous_response_id must be a string")] = None
    instructions: Annotated[Str | None, ErrorText("instructions must be a string")] = None
    text: Annotated[dict[str, Any] | None, ErrorText("text must be an object like {\"format\": {\"type\": \"text\"}}")] = None
    store: Annotated[Bool | None, ErrorText("store must be true or false")] = None
    metadata: Annotated[dict[str, Any] | None, ErrorText("metadata must be an object of string keys and string values")] = None
    top_logprobs: Annotated[IntegerParam, Field(ge=0, le=20)] = None  # then refused unless 0 (to_chat_body)
    max_tool_calls: Annotated[IntegerParam, Field(ge=1, le=MAX_TOKENS_LIMIT)] = None  # checked, then reported ignored

    @field_validator("metadata", mode="after")
    @classmethod
    def _metadata(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        """As OpenAI checks it: at most 16 string pairs; keys up to 64 characters, values up to 512 (it is echoed
        back and stored with the response)."""
        if v is None:
            return v
        if len(v) > METADATA_PAIRS:
            raise PydanticCustomError("edgespec", "metadata has {n} pairs; at most {limit}", {"n": len(v), "limit": METADATA_PAIRS})
        for k, val in v.items():
            if len(k) > METADATA_KEY_CHARS:
                raise PydanticCustomError("edgespec", "metadata keys are at most {limit} characters, got one of {n}",
                                          {"limit": METADATA_KEY_CHARS, "n": len(k)})
            if not isinstance(val, str):
                raise PydanticCustomError("edgespec", "metadata values must be strings (the value of {key} is not)", {"key": repr(k[:64])})
            if len(val) > METADATA_VALUE_CHARS:
                raise PydanticCustomError("edgespec", "metadata values are at most {limit} characters, got one of {n}",
                                          {"limit": METADATA_VALUE_CHARS, "n": len(val)})
        return v


@dataclass
class ResponsesInput:
    """What the answer needs besides the chat request: the Responses fields echoed back, and the conversation."""

    messages: list[dict[str, Any]]
    instructions: str | None
    previous_response_id: str | None
    max_output_tokens: int | None
    store: bool
    metadata: Any
    echo: dict[str, Any] = field(default_factory=dict)


def _text(content: Any, where: str) -> Any:
    """A Responses message content as chat content (a string or text parts)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(where, f"{where} must be a string or an array of content parts")
    parts = []
    for j, p in enumerate(content):
        pw = f"{where}[{j}]"
        kind = p.get("type") if isinstance(p, dict) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": p.get("text")})
        elif kind == "refusal":
            parts.append({"type": "text", "text": p.get("refusal")})
        else:
            raise unsupported(pw, f"{pw}: content of type {kind!r} is not supported (text only)")
    return parts


def _input_messages(v: Any) -> list[dict[str, Any]]:
    if isinstance(v, str):
        return [{"role": "user", "content": v}]
    if not isinstance(v, list):
        raise bad("input", "input must be a string or an array of input items")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(v):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad(where, f"{where} must be an object")
        kind = item.get("type", "message")
        if kind == "function_call":
            call = {"id": _str_field(item, "call_id", where), "type": "function",
                    "function": {"name": _str_field(item, "name", where), "arguments": _str_field(item, "arguments", where)}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") and not out[-1]["content"]:
                out[-1]["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
            continue
        if kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": _str_field(item, "call_id", where), "content": text})
            continue
        if kind in ("custom_tool_call", "custom_tool_call_output"):
            raise unsupported(where, f"{where}: {kind} items are not supported (function tools only)")
        if kind != "message":
            raise unsupported(where, f"{where}: input items of type {kind!r} are not supported")
        role = item.get("role")
        msg: dict[str, Any] = {"role": role, "content": _text(item.get("content"), f"{where}.content")}
        out.append(msg)
    return out


def _str_field(item: Mapping[str, Any], key: str, where: str) -> str:
    v = item.get(key)
    if not isinstance(v, str):
        raise bad(f"{where}.{key}", f"{where}.{key} must be a string")
    return v


def _tools(body: Mapping[str, Any]) -> dict[str, Any]:
    """Responses `tools`/`tool_choice` as chat completions keys (function tools only)."""
    out: dict[str, Any] = {}
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise bad("tools", "tools must be an array")
        chat_tools = []
        for i, t in enumerate(tools):
            if not isinstance(t, dict) or t.get("type") != "function":
                kind = t.get("type") if isinstance(t, dict) else None
                raise unsupported(f"tools[{i}]", f"tools[{i}]: tools of type {kind!r} are not supported (function tools only)")
            fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if k in t}
            chat_tools.append({"type": "function", "function": fn})
        out["tools"] = chat_tools
    tc = body.get("tool_choice")
    if tc is not None:
        out["tool_choice"] = {"type": "function", "function": {"name": tc.get("name")}} if isinstance(tc, dict) and tc.get("type") == "function" else tc
    return out


def to_chat_body(body: Mapping[str, Any], previous: Stored | None, m: ResponsesBody | None = None) -> tuple[dict[str, Any], ResponsesInput]:
    """The chat completions body for a Responses request (the one place where Responses maps onto chat)."""
    m = m if m is not None else validate_body(ResponsesBody, body)
    instructions = m.instructions
    if body.get("input") is None:
        raise bad("input", "input is required: a string or an array of input items", code="missing_required_parameter")
    new = _input_messages(body["input"])
    history = list(previous.messages) if previous is not None else []
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + history + new
    chat: dict[str, Any] = {"messages": messages}
    for src, dst in (("model", "model"), ("max_output_tokens", "max_completion_tokens"), ("temperature", "temperature"),
                     ("top_p", "top_p"), ("stream", "stream"), ("seed", "seed"), ("stop", "stop"), ("top_k", "top_k"),
                     ("min_p", "min_p"), ("repeat_penalty", "repeat_penalty"), ("presence_penalty", "presence_penalty"),
                     ("frequency_penalty", "frequency_penalty"), ("speculative", "speculative"), ("draft_max", "draft_max"),
                     ("show_draft", "show_draft"), ("parallel_tool_calls", "parallel_tool_calls")):
        if body.get(src) is not None:
            chat[dst] = body[src]
    text = m.text
    if text is not None:
        fmt = text.get("format")
        if fmt is not None:
            # Responses puts a JSON schema's name and schema beside "type"; chat completions nests them
            chat["response_format"] = fmt if not (isinstance(fmt, dict) and fmt.get("type") == "json_schema") else {
                "type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
        if text.get("verbosity") not in (None, "medium"):
            raise unsupported("text.verbosity", "text.verbosity is not supported")
    chat.update(_tools(body))
    for key, fine, what in (
        ("background", lambda v: v is False, "background responses are not supported"),
        ("reasoning", lambda v: not isinstance(v, dict) or not v.get("effort") and not v.get("summary"),
         "reasoning is not supported (not a reasoning model server)"),
        ("include", lambda v: v == [], "include is not supported (nothing extra to include)"),
        ("top_logprobs", lambda v: v == 0, "top_logprobs is not supported"),
        ("truncation", lambda v: v == "disabled", "truncation other than \"disabled\" is not supported"),
        ("conversation", lambda v: False, "conversations are not supported; use previous_response_id"),
        ("prompt", lambda v: False, "prompt templates are not supported"),
        ("stream_options", lambda v: body.get("stream") is True, "stream_options is only allowed when stream is true"),
    ):
        v = body.get(key)
        if v is not None and not fine(v):
            raise unsupported(key, what)
    ri = ResponsesInput(
        messages=history + new, instructions=instructions, previous_response_id=m.previous_response_id,
        max_output_tokens=body.get("max_output_tokens"), store=m.store is not False, metadata=dict(m.metadata or {}),
        echo={"parallel_tool_calls": body.get("parallel_tool_calls", True), "tool_choice": body.get("tool_choice", "auto"),
              "tools": body.get("tools") or [], "text": text or {"format": {"type": "text"}},
              "truncation": body.get("truncation") or "disabled", "user": body.get("user")},
    )
    return chat, ri


def parse_responses(body: Mapping[str, Any], store: ResponseStore) -> tuple[CompletionRequest, ResponsesInput]:
    m = validate_body(ResponsesBody, body)
    prev_id = m.previous_response_id
    previous = None
    if prev_id is not None:
        previous = store.get(prev_id)
        if previous is None:
            raise APIError(404, f"Previous response with id '{prev_id}' not found (this server keeps the last {store.size} "
                                f"stored responses, at most {store.max_bytes // 2**20} MiB of them, in memory)",
                           param="previous_response_id", code="previous_response_not_found")
    chat, ri = to_chat_body(body, previous, m)
    try:
        req = schema.parse_chat(chat)
    except APIError as e:
        p = e.param or ""
        head = p.split(".", 1)[0].split("[", 1)[0]
        if head in RENAMED:
            raise APIError(e.status, e.message.replace(head, RENAMED[head]), param=RENAMED[head] + p[len(head):], code=e.code) from None
        if head == "messages":
            raise APIError(e.status, e.message, param="input", code=e.code) from None
        raise
    return replace(req, ignored=tuple(sorted(k for k in body if k not in KNOWN))), ri


# --------------------------------------------------------------------------------------------- the answer
def _usage(stats: Any) -> dict[str, Any]:
    return {
        "input_tokens": stats.n_prompt,
        "input_tokens_details": {"cached_tokens": stats.n_cached},
        "output_tokens": stats.n_generated,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": stats.n_prompt + stats.n_generated,
    }


class ResponsesResponse(GenerationResponse):
    """One generation as a Responses object, or as its event stream."""

    ri: ResponsesInput

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.id = "resp_" + secrets.token_hex(24)
        self.msg_id = "msg_" + secrets.token_hex(24)
        self.seq = 0
        self._kept: dict[str, Any] = {}  # the assistant message stored for previous_response_id
        self._streamed: tuple[str | None, list[dict[str, Any]]] | None = None  # a stream's own reading of its calls

    def _message(self, text: str, status: str) -> dict[str, Any]:
        content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status != "in_progress" else []
        return {"id": self.msg_id, "type": "message", "status": status, "role": "assistant", "content": content}

    def _answer(self, text: str, status: str) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
        """(output items, the assistant message kept for previous_response_id, output_text) for the final text:
        with tools, the calls it holds become function_call items after the text around them."""
        content, calls = self._streamed if self._streamed is not None else self._tool_calls_in(text)
        if calls:
            items = [self._message(content, status)] if content else []
            for c in calls:
                items.append({"id": "fc_" + secrets.token_hex(24), "type": "function_call", "status": "completed",
                              "call_id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]})
            return items, {"role": "assistant", "content": content or "", "tool_calls": calls}, content or ""
        return [self._message(text, status)], {"role": "assistant", "content": text}, text

    def _object(self, status: str, text: str | None, reason: str | None = None, error: Any = None) -> dict[str, Any]:
        s = self.req.sampling
        ri = self.ri
        out: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "background": False, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if reason == "length" else None,
            "instructions": ri.instructions, "max_output_tokens": ri.max_output_tokens, "model": self.model,
            "output": [],
            "previous_response_id": ri.previous_response_id, "reasoning": {"effort": None, "summary": None},
            "store": ri.store, "temperature": s.temperature, "top_p": s.top_p, "metadata": ri.metadata,
            **ri.echo,
            "usage": None,
        }
        if text is not None and error is None:
            out["output"], self._kept, text = self._answer(text, "completed" if reason != "length" else "incomplete")
            stats = self.gen.stats
            out["usage"] = _usage(stats)
            out["timings"] = timings(stats)
            out["edgespec"] = edgespec_stats(stats, self.req, self.drafter)
            out["output_text"] = text
        return out

    def _keep(self, body: dict[str, Any]) -> None:
        if self.ri.store and body["status"] in ("completed", "incomplete"):
            self.state.stored.put(self.id, Stored(self.ri.messages + [self._kept], body))

    async def _complete(self, send: Send) -> None:
        reason = await self._run_to_end(send)
        if reason is None:
            return
        body = self._object("incomplete" if reason == "length" else "completed", self.gen.text, reason)
        self._keep(body)
        await send_json(send, 200, body, self.headers)

    def _event(self, kind: str, **data: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return f"event: {kind}\n".encode() + sse.event(payload)

    async def _stream(self, send: Send) -> None:
        await self._start(send, SSE_HEADERS)

        async def emit(kind: str, **data: Any) -> None:
            await send({"type": "http.response.body", "body": self._event(kind, **data), "more_body": True})

        start = self._object("in_progress", None)
        await emit("response.created", response=start)
        await emit("response.in_progress", response=start)
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        # with tools, text streams as it comes except what may start a tool call (structured.ToolCallSplitter): that
        # is held to the end, then becomes function_call items or the rest of the text
        splitter = self._tool_splitter()
        sent: list[str] = []
        if splitter is None:
            await self._open_message(emit, part)
        async for chunk in self._chunks():
            self._track(chunk)
            if self.client_left or not chunk.text:
                continue
            text = chunk.text if splitter is None else splitter.feed(chunk.text)
            if not text:
                continue
            if splitter is not None and not sent:
                await self._open_message(emit, part)
            sent.append(text)
            await emit("response.output_text.delta", item_id=self.msg_id, output_index=0, content_index=0, delta=text, logprobs=[])
        opened = splitter is None or bool(sent)
        if self.client_left:
            return
        api, reason = self._outcome()
        if api is not None:
            err = {"code": api.code or api.type, "message": api.message}
            await emit("error", code=err["code"], message=api.message, param=api.param)
            await emit("response.failed", response=self._object("failed", None, error=err))
        else:
            if splitter is not None:
                rest, calls = splitter.finish()
                self._streamed = ("".join(sent) + rest or None, calls)
            done = self._object("incomplete" if reason == "length" else "completed", self.gen.text, reason)
            for index, item in enumerate(done["output"]):
                if item["type"] == "message":
                    text = item["content"][0]["text"]
                    if not opened:
                        await self._open_message(emit, part, index)
                    more = text[len("".join(sent)) :]
                    if more:
                        await emit("response.output_text.delta", item_id=self.msg_id, output_index=index, content_index=0, delta=more, logprobs=[])
                    ids = {"item_id": self.msg_id, "output_index": index, "content_index": 0}
                    await emit("response.output_text.done", **ids, text=text, logprobs=[])
                    await emit("response.content_part.done", **ids, part={**part, "text": text})
                else:
                    await emit("response.output_item.added", output_index=index, item={**item, "arguments": "", "status": "in_progress"})
                    ids = {"item_id": item["id"], "output_index": index}
                    await emit("response.function_call_arguments.delta", **ids, delta=item["arguments"])
                    await emit("response.function_call_arguments.done", **ids, arguments=item["arguments"])
                await emit("response.output_item.done", output_index=index, item=item)
            self._keep(done)
            await emit("response.incomplete" if reason == "length" else "response.completed", response=done)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _open_message(self, emit: Any, part: dict[str, Any], index: int = 0) -> None:
        await emit("response.output_item.added", output_index=index, item=self._message("", "in_progress"))
        await emit("response.content_part.added", item_id=self.msg_id, output_index=index, content_index=0, part=part)


# --------------------------------------------------------------------------------------------- routes
async def create(request: Request) -> Any:
    state, body = await read_bound(request)
    holder: dict[str, ResponsesInput] = {}

    def parse(b: Mapping[str, Any]) -> CompletionRequest:
        req, holder["ri"] = parse_responses(b, state.stored)
        return req

    out = await generate(request, parse, "chat", ResponsesResponse, body=body, state=state)
    out.ri = holder["ri"]
    return out


async def retrieve(request: Request) -> Response:
    state = server_state(request)
    state.check_ready()
    rid = request.path_params["response_id"]
    item = state.stored.get(rid)
    if item is None:
        raise APIError(404, f"Response with id '{rid}' not found", param="response_id", code="not_found")
    return JSON(item.body, headers=ignored_headers(()))


__all__ = ["create", "retrieve", "to_chat_body", "parse_responses", "ResponseStore", "Stored"]

