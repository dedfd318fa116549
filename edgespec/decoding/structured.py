"""Request fields -> constraints, and tool calls in and out. Pure (no llama.cpp, no HTTP): every route (OpenAI chat
and completions, Responses, llama.cpp's and Ollama's) translates its own field names into these calls.

    constraint_from_response_format({"type": "json_schema", "json_schema": {"schema": {...}}})  -> Constraint | None
    tools = check_tools(body["tools"]); choice = check_tool_choice(body.get("tool_choice"), tools)
    tool_constraint(tools, choice, parallel=True)                                             -> Constraint | None
    tool_messages(messages, tools, template)   # OpenAI tool messages -> what the chat template renders
    parse_tool_calls(text)                     # the model's "<tool_call>{...}</tool_call>" -> OpenAI tool_calls

Tool calls follow the Hermes/Qwen2.5 convention: the model writes
`<tool_call>\\n{"name": "...", "arguments": {...}}\\n</tool_call>` (one block per call). When the template renders
tools itself (Qwen2.5's has a `tools` section) the tools go to the template; otherwise they are described in a system
message in the same convention and tool results become user messages in `<tool_response>` blocks (what Qwen2.5's
template does with them). A call, once made, is constrained to the named tool's argument schema.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgespec.prompts.chat_template import renders_tools
from .constraint import Constraint, ConstraintError
from edgespec.untrusted import JSONDepthError, check_json_depth, loads as loads_json

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"


def constraint_from_response_format(obj: Any) -> Constraint | None:
    """An OpenAI `response_format` object as a constraint (None for {"type": "text"}):
    {"type": "json_object"} (llama-server's extra "schema" key is honoured), {"type": "json_schema", "json_schema":
    {"name", "schema", "strict"}} (the schema is always enforced; strict changes nothing). ConstraintError otherwise."""
    if not isinstance(obj, Mapping):
        raise ConstraintError("response_format must be an object like {\"type\": \"json_object\"}")
    kind = obj.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = obj.get("schema")
        return Constraint.json_schema(schema) if schema is not None else Constraint.json_object()
    if kind == "json_schema":
        js = obj.get("json_schema")
        if not isinstance(js, Mapping):
            raise ConstraintError("response_format.json_schema must be an object with a schema")
        schema = js.get("schema")
        if schema is None:
            return Constraint.json_object()
        if "strict" in js and not isinstance(js["strict"], bool):
            raise ConstraintError("response_format.json_schema.strict must be true or false")
        return Constraint.json_schema(schema)
    raise ConstraintError(f"response_format.type must be text, json_object or json_schema, got {json.dumps(kind)[:40]}")


# --------------------------------------------------------------------------------------------- tools
@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]

    def as_openai(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


def check_tools(tools: Any) -> list[Tool]:
    """OpenAI `tools` ([{"type": "function", "function": {"name", "description", "parameters"}}]) checked."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ConstraintError("tools must be an array of {\"type\": \"function\", \"function\": {...}} objects")
    out: list[Tool] = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, Mapping) else None
        if not isinstance(t, Mapping) or t.get("type", "function") != "function" or not isinstance(fn, Mapping):
            raise ConstraintError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\", \"parameters\"}}}}")
        name = fn.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", name):
            raise ConstraintError(f"tools[{i}].function.name must be 1-64 letters, digits, _ . or -")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, Mapping):
            raise ConstraintError(f"tools[{i}].function.parameters must be a JSON schema object")
        try:
            check_json_depth(params, f"tools[{i}].function.parameters")
        except JSONDepthError as e:
            raise ConstraintError(str(e)) from None
        desc = fn.get("description", "")
        if not isinstance(desc, str):
            raise ConstraintError(f"tools[{i}].function.description must be a string")
        if any(o.name == name for o in out):
            raise ConstraintError(f"tools: the name {name!r} is used twice")
        out.append(Tool(name, desc, dict(params)))
    return out


def check_tool_choice(choice: Any, tools: Sequence[Tool]) -> str:
    """"none", "auto", "required", or the name of the one function to call (OpenAI's
    {"type": "function", "function": {"name": ...}})."""
    if choice is None:
        return "auto" if tools else "none"
    if choice in ("none", "auto", "required"):
        if choice != "none" and not tools:
            raise ConstraintError(f"tool_choice {choice!r} needs tools")
        return str(choice)
    if isinstance(choice, Mapping):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if choice.get("type") == "function" and isinstance(name, str):
            if not any(t.name == name for t in tools):
                raise ConstraintError(f"tool_choice names {name!r}, which is not among the tools")
            return name
    raise ConstraintError("tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}")


def _call_schema(tools: Sequence[Tool]) -> dict[str, Any]:
    variants = [
        {
            "type": "object",
            "properties": {"name": {"const": t.name}, "arguments": t.parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    schema: dict[str, Any] = variants[0] if len(variants) == 1 else {"anyOf": variants}
    # the layout Qwen2.5 and Hermes models write: {"name": "f", "arguments": {...}}
    schema["x-guidance"] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    return schema


def tool_constraint(tools: Sequence[Tool], choice: str, *, parallel: bool = True) -> Constraint | None:
    """The grammar of an answer under tool_choice: None for "none" (free text); for "required" or a named function
    one (or, with parallel, several) `<tool_call>` blocks whose JSON is {"name", "arguments"} with the arguments
    valid for that tool's schema; for "auto" the same, or such a JSON object alone (small models often drop the
    tags: it is a call too), or a text answer (one that starts with neither "<" nor "{")."""
    if choice == "none" or not tools:
        return None
    chosen = [t for t in tools if t.name == choice] if choice not in ("auto", "required") else list(tools)
    schema = json.dumps(_call_schema(chosen))
    call = f'call: "{TOOL_OPEN}\\n" %json {schema} "\\n{TOOL_CLOSE}"'
    calls = 'calls: call ("\\n" call)*' if parallel else "calls: call"
    if choice == "auto":
        lark = f"start: calls | bare | TEXT\nTEXT: /[^<{{](.|\\n)*/\nbare: %json {schema}\n{calls}\n{call}\n"
    else:
        lark = f"start: calls\n{calls}\n{call}\n"
    return Constraint.grammar(lark)


def tools_system_text(tools: Sequence[Tool]) -> str:
    """The tools section for templates without one (Qwen2.5's wording, Hermes format)."""
    lines = "\n".join(json.dumps(t.as_openai(), ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        f"{lines}\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def _call_text(call: Mapping[str, Any]) -> str:
    fn = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise ConstraintError("an assistant tool_calls entry must have function.name and function.arguments")
    args = fn.get("arguments", "{}")
    what = f"tool call {fn['name'][:64]!r}: arguments"
    try:
        if isinstance(args, str):
            args = loads_json(args, what) if args.strip() else {}
        else:
            check_json_depth(args, what)
    except JSONDepthError as e:
        raise ConstraintError(str(e)) from None
    except ValueError:
        raise ConstraintError(f"{what} is not valid JSON") from None
    return f"{TOOL_OPEN}\n{json.dumps({'name': fn['name'], 'arguments': args}, ensure_ascii=False)}\n{TOOL_CLOSE}"


def tool_history(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages with their assistant `tool_calls` checked and normalized to what Hugging Face chat templates
    read: [{"id", "type": "function", "function": {"name", "arguments": <the arguments as an object>}}] (OpenAI
    sends the arguments as a JSON string; a template writes them with `tojson`). ConstraintError for a malformed
    call. Other messages are copied."""
    out: list[Any] = []
    for m in messages:
        if not isinstance(m, Mapping):  # left to the chat template's checks
            out.append(m)
            continue
        msg = dict(m)
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = m["tool_calls"]
            if not isinstance(calls, list):
                raise ConstraintError("an assistant message's tool_calls must be an array")
            norm = []
            for c in calls:
                # _call_text checks the call (and its arguments' JSON); its block holds the call as {"name", "arguments"}
                obj = json.loads(_call_text(c)[len(TOOL_OPEN) : -len(TOOL_CLOSE)])
                cid = c.get("id")
                norm.append({"id": cid if isinstance(cid, str) else "call_" + secrets.token_hex(12), "type": "function",
                             "function": {"name": obj["name"], "arguments": obj["arguments"]}})
            msg["tool_calls"] = norm
        out.append(msg)
    return out


def tool_messages(messages: Sequence[Mapping[str, Any]], tools: Sequence[Tool]) -> list[dict[str, str]]:
    """OpenAI messages with tool calls and tool results as plain {"role", "content"} messages in the Hermes/Qwen2.5
    convention (what Qwen2.5's template renders for them), for templates that render no tools of their own:
    assistant tool_calls become `<tool_call>` blocks, tool results user messages with `<tool_response>` blocks
    (consecutive ones merged), and the tools' descriptions a system message (added to the first system message, or a
    new one)."""
    out: list[dict[str, str]] = []
    for m in messages:
        role, content = m.get("role"), m.get("content")
        text = content if isinstance(content, str) else "" if content is None else str(content)
        if role == "assistant" and m.get("tool_calls"):
            calls = m["tool_calls"]
            if not isinstance(calls, list):
                raise ConstraintError("an assistant message's tool_calls must be an array")
            parts = ([text] if text else []) + [_call_text(c) for c in calls]
            out.append({"role": "assistant", "content": "\n".join(parts)})
        elif role == "tool":
            block = f"<tool_response>\n{text}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1]["content"].startswith("<tool_response>"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block})
        else:
            out.append({"role": str(role), "content": text})
    if tools:
        section = tools_system_text(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + section}
        else:
            out.insert(0, {"role": "system", "content": section})
    return out


def has_tool_history(messages: Sequence[Any]) -> bool:
    return any(isinstance(m, Mapping) and (m.get("role") == "tool" or (m.get("role") == "assistant" and bool(m.get("tool_calls"))))
               for m in messages)


def prompt_messages(
    template: str | None, messages: Sequence[Mapping[str, Any]], tools: Sequence[Tool]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) to render with `template`: where the template renders tools, tool calls and tool results
    itself (Qwen2.5's, Llama 3.1's, Hermes'...: chat_template.renders_tools), the messages as Hugging Face templates
    take them (tool_history) and the tools in OpenAI's form; otherwise tool_messages' plain messages and no tools."""
    if not tools and not has_tool_history(messages):
        return [dict(m) for m in messages], None
    if renders_tools(template):
        return tool_history(messages), [t.as_openai() for t in tools] or None
    return tool_messages(tool_history(messages), tools), None


# --------------------------------------------------------------------------------------------- reading tool calls
# The shapes small models write a call in: `<tool_call>{...}</tool_call>` (Hermes/Qwen2.5; a last block the model
# did not close counts), a fenced ```json block, and at the start of an answer a bare JSON object or array. The
# JSON is {"name", "arguments"} ("parameters" is read as "arguments"; {"function": {...}} is unwrapped); untagged
# JSON is a call only when it names one of the offered tools. Several calls in one answer come in any of these
# shapes: several blocks (tagged or fenced), an array of calls, or several values one after another (white space or
# a comma between them) in one block or bare at the start; each is a call, in order.
_FENCE_LANGS = ("", "json", "tool_call", "tool_code", "tool_calls")
_BLOCK_RE = re.compile(
    r"<tool_call>\s*(?P<tag>.*?)\s*(?:</tool_call>|\Z)"
    r"|```[ \t]*(?P<lang>[A-Za-z_]*)[ \t]*\n(?P<fence>.*?)\n?[ \t]*```",
    re.S,
)
_STARTS = (TOOL_OPEN, "```")


def _as_calls(obj: Any, names: Sequence[str] | None) -> list[dict[str, Any]] | None:
    """A parsed JSON value as OpenAI tool calls (an object: one call; an array of them: several), or None when it is
    not one (a name outside `names`, when given)."""
    items = obj if isinstance(obj, list) else [obj]
    out = []
    for it in items:
        if isinstance(it, Mapping) and "name" not in it and isinstance(it.get("function"), Mapping):
            it = it["function"]
        if not isinstance(it, Mapping):
            return None
        name = it.get("name")
        args = it.get("arguments", it.get("parameters", {}))
        if not isinstance(name, str) or (names is not None and name not in names) or not isinstance(args, (Mapping, str)):
            return None
        out.append(_openai_call({"name": name, "arguments": args}))
    return out or None


_DECODER = json.JSONDecoder()


def _values_at(text: str, i: int, names: Sequence[str] | None) -> tuple[list[dict[str, Any]], int]:
    """The calls in the JSON values one after another from text[i] (white space, or a comma and white space, between
    them), and where the last call ends; stops at the first thing that is not such a value ([] and i when none)."""
    calls: list[dict[str, Any]] = []
    end = i
    while True:
        j = i + len(text[i:]) - len(text[i:].lstrip())
        if calls and j < len(text) and text[j] == ",":
            j += 1
            j += len(text[j:]) - len(text[j:].lstrip())
        if j >= len(text) or text[j] not in "{[":
            return calls, end
        try:
            obj, k = _DECODER.raw_decode(text, j)
        except (ValueError, RecursionError):
            return calls, end
        found = _as_calls(obj, names)
        if found is None:
            return calls, end
        calls += found
        i = end = k


def _block_calls(body: str, names: Sequence[str] | None) -> list[dict[str, Any]] | None:
    """The calls of a tagged or fenced block's body: one JSON value or several one after another, all of them calls
    and nothing else in the block (None otherwise)."""
    calls, end = _values_at(body, 0, names)
    return calls if calls and not body[end:].strip() else None


class ToolCallSplitter:
    """A streamed answer split into text that can be sent at once and a tail that may be a tool call:
    `feed(text)` returns what may be sent now (never a part of a possible call: the rest is held from the first
    `<tool_call>`, from a ```json fence whose body opens with `{` or `[`, or from the start when the answer opens with
    `{` or `[`; a possible start cut by the chunk's end, and trailing white space, wait for the next chunk);
    `finish()` returns (the rest of the text, the calls) once the answer is complete. Feeding the whole answer at once
    or piece by piece gives the same calls and the same text."""

    def __init__(self, names: Sequence[str] | None) -> None:
        self.names = list(names) if names is not None else None
        self.buf = ""  # received, not yet sent
        self.held = False  # buf is a possible call: kept until the end
        self.at_start = True  # nothing sent yet
        self.bare = False  # held from the answer's start (a bare JSON value)

    def feed(self, text: str) -> str:
        self.buf += text
        sent = []
        while not self.held:
            n = self._sendable()
            if n == 0:
                break
            sent.append(self.buf[:n])
            self.buf = self.buf[n:]
            self.at_start = False
        return "".join(sent)

    def _sendable(self) -> int:
        """How many characters of buf can be sent now (0: none; sets held when buf is a possible call)."""
        buf = self.buf
        lead = len(buf) - len(buf.lstrip())
        if self.at_start:
            if lead == len(buf):
                return 0
            if buf[lead] in "{[":
                self.held = self.bare = True
                return 0
        found = [i for i in (buf.find(s) for s in _STARTS) if i >= 0]
        if found:
            j = min(found)
            if buf[:j].strip():  # the text before a possible call goes first (its trailing space waits)
                return len(buf[:j].rstrip())
            if buf.startswith(TOOL_OPEN, j):
                self.held = True
                return 0
            nl = buf.find("\n", j + 3)
            if nl < 0:
                return 0 if len(buf) - j < 32 else j + 3  # the fence's language line is not complete yet
            body = buf[nl + 1 :].lstrip()
            if buf[j + 3 : nl].strip().lower() in _FENCE_LANGS and (not body or body[0] in "{["):
                if body:
                    self.held = True
                return 0
            return len(buf[: nl + 1].rstrip()) or nl + 1  # a fence of code, not a call: its opening line goes
        keep = max((k for s in _STARTS for k in range(1, len(s)) if buf.endswith(s[:k])), default=0)
        return len(buf[: len(buf) - keep].rstrip())

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """(the text not sent yet, minus the calls found in it; the calls)."""
        held, self.buf = self.buf, ""
        if not self.held:
            return held, []
        calls: list[dict[str, Any]] = []
        rest: list[str] = []
        pos = 0
        if self.bare and self.names is not None:  # one or more JSON values from the start
            calls, end = _values_at(held, 0, self.names)
            if calls:
                pos = end + len(held[end:]) - len(held[end:].lstrip())
        for m in _BLOCK_RE.finditer(held, pos):
            if m.group("tag") is not None:
                found = _block_calls(m.group("tag"), None)
            elif m.group("lang").lower() in _FENCE_LANGS and self.names is not None:
                found = _block_calls(m.group("fence"), self.names)
            else:
                found = None
            if found:
                rest.append(held[pos : m.start()])
                pos = m.end()
                calls += found
        if not calls:
            return held, []
        rest.append(held[pos:])
        text = "".join(rest).strip()
        return ("\n" + text if text and not self.at_start else text), calls


def parse_tool_calls(text: str, names: Sequence[str] | None = None) -> tuple[str | None, list[dict[str, Any]]]:
    """The model's answer as (content, tool_calls), the one reading of tool calls every route uses: the calls in the
    shapes ToolCallSplitter knows become OpenAI tool calls (arguments as a JSON string, an id "call_..."); the text
    around them is the content (None when empty). Without calls, (text, [])."""
    s = ToolCallSplitter(names)
    head = s.feed(text)
    rest, calls = s.finish()
    if not calls:
        return text, []
    return (head + rest).strip() or None, calls


def _openai_call(obj: Mapping[str, Any]) -> dict[str, Any]:
    args = obj.get("arguments", {})
    return {
        "id": "call_" + secrets.token_hex(12),
        "type": "function",
        "function": {"name": obj["name"], "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)},
    }


__all__ = [
    "Tool",
    "check_tool_choice",
    "check_tools",
    "constraint_from_response_format",
    "ToolCallSplitter",
    "has_tool_history",
    "parse_tool_calls",
    "prompt_messages",
    "tool_constraint",
    "tool_history",
    "tool_messages",
    "tools_system_text",
]
