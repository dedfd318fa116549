"""edgespec.structured and edgespec.constraint without a model: request fields -> constraints, tool calls in and out,
and the matcher on a byte vocabulary."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgespec.constraint import Constraint, ConstraintError, Matcher, Vocabulary, apply_mask
from edgespec.structured import (
    check_tool_choice,
    check_tools,
    constraint_from_response_format,
    parse_tool_calls,
    tool_constraint,
    tool_messages,
)

EOS = 258
TOKENS = [bytes([b]) for b in range(256)] + [b"<tool_call>", b"</tool_call>", b"<|im_end|>"]


@pytest.fixture(scope="module")
def vocab():
    def tokenize(text: str) -> list[int]:
        out, data = [], text.encode()
        i = 0
        while i < len(data):
            for j, special in ((256, b"<tool_call>"), (257, b"</tool_call>")):
                if data.startswith(special, i):
                    out.append(j)
                    i += len(special)
                    break
            else:
                out.append(data[i])
                i += 1
        return out

    return Vocabulary(TOKENS, [EOS], [EOS], tokenize)


def walk(m: Matcher, text: bytes) -> bool:
    return all(m.advance(b) for b in text)


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["paris", "rome"]}},
                                                     "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                                                    "required": ["a", "b"]}}},
]


def test_response_format_mapping():
    assert constraint_from_response_format({"type": "text"}) is None
    assert constraint_from_response_format({"type": "json_object"}).kind == "json_object"
    c = constraint_from_response_format({"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": {"type": "object"}}})
    assert c.kind == "json_schema" and c.value == {"type": "object"}
    assert constraint_from_response_format({"type": "json_object", "schema": {"type": "array"}}).value == {"type": "array"}
    for bad in ({"type": "xml"}, {"type": "json_schema"}, {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}, "json", None):
        with pytest.raises(ConstraintError):
            constraint_from_response_format(bad)


def test_tools_and_tool_choice_checks():
    tools = check_tools(TOOLS)
    assert [t.name for t in tools] == ["get_weather", "add"]
    assert check_tool_choice(None, tools) == "auto" and check_tool_choice(None, []) == "none"
    assert check_tool_choice({"type": "function", "function": {"name": "add"}}, tools) == "add"
    for bad in ("sometimes", {"type": "function", "function": {"name": "nope"}}, {"type": "function"}):
        with pytest.raises(ConstraintError):
            check_tool_choice(bad, tools)
    with pytest.raises(ConstraintError):
        check_tool_choice("required", [])
    for bad in ([{"type": "function"}], [{"type": "function", "function": {"name": "a b"}}], "x", TOOLS + TOOLS[:1],
                [{"type": "function", "function": {"name": "f", "parameters": []}}]):
        with pytest.raises(ConstraintError):
            check_tools(bad)


def test_required_tool_call_forces_the_scaffolding(vocab):
    tools = check_tools(TOOLS)
    m = Matcher(tool_constraint(tools, "get_weather"), vocab)
    forced = m.forced()
    text = b"".join(TOKENS[t] for t in forced)
    assert text.startswith(b"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"")
    for t in forced:
        assert m.advance(t)
    assert not m.allows(ord("x")) and m.allows(ord("p"))
    assert walk(m, b'paris"}}\n') and m.advance(257)
    assert m.accepting and m.mask()[EOS]


def test_auto_allows_text_or_calls_and_parallel_calls(vocab):
    tools = check_tools(TOOLS)
    m = Matcher(tool_constraint(tools, "auto"), vocab)
    assert walk(m, b"Hello there") and m.accepting
    m.rollback(m.n_advanced)
    call = b'\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
    assert m.advance(256) and walk(m, call) and m.advance(257)
    assert m.advance(ord("\n")) and m.advance(256) and walk(m, call) and m.advance(257) and m.accepting
    m.rollback(m.n_advanced)
    assert walk(m, b'{"name": "add", "arguments": {"a": 1, "b": 2}}') and m.accepting  # a call without its tags
    m.rollback(m.n_advanced)
    assert not m.allows(ord("{")) or walk(m, b'{"name": ')  # "{" opens a call, never free text
    m.rollback(m.n_advanced)
    assert walk(m, b'{"name": ') and not m.allows(ord("x"))
    single = Matcher(tool_constraint(tools, "required", parallel=False), vocab)
    assert single.advance(256) and walk(single, call) and single.advance(257)
    assert not single.allows(ord("\n")) and single.mask()[EOS]
    assert tool_constraint(tools, "none") is None


def test_parse_tool_calls():
    content, calls = parse_tool_calls('Let me check.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')
    assert content == "Let me check." and len(calls) == 1
    assert calls[0]["function"] == {"name": "add", "arguments": json.dumps({"a": 1, "b": 2})} and calls[0]["id"].startswith("call_")
    assert parse_tool_calls("plain text") == ("plain text", [])
    bare = parse_tool_calls(' {"name": "add", "arguments": {"a": 1}}', ["add"])
    assert bare[0] is None and bare[1][0]["function"]["name"] == "add"
    assert parse_tool_calls('{"name": "other", "arguments": {}}', ["add"])[1] == []
    assert parse_tool_calls('{"name": "add", "arguments": {}}')[1] == []  # without names: only tagged calls
    assert parse_tool_calls("<tool_call>not json</tool_call>")[1] == []
    two = parse_tool_calls('<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", "arguments": {}}</tool_call>')
    assert two[0] is None and [c["function"]["name"] for c in two[1]] == ["a", "b"]


def test_tool_messages_follow_the_qwen_convention():
    tools = check_tools(TOOLS)
    msgs = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "paris"}'}}]},
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "22C"},
    ]
    out = tool_messages(msgs, tools)
    assert out[0]["role"] == "system" and "<tools>" in out[0]["content"] and '"get_weather"' in out[0]["content"]
    assert out[2] == {"role": "assistant", "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "paris"}}\n</tool_call>'}
    assert out[3] == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>\n<tool_response>\n22C\n</tool_response>"}
    with_system = tool_messages([{"role": "system", "content": "Be brief."}] + msgs[:1], tools)
    assert with_system[0]["content"].startswith("Be brief.\n\n# Tools")
    with pytest.raises(ConstraintError):
        tool_messages([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}], tools)


def test_choice_and_mask_helpers(vocab):
    m = Matcher(Constraint.choice(["yes", "no"]), vocab)
    mask = m.mask()
    assert mask.dtype == bool and mask.size == len(TOKENS)
    assert set(np.flatnonzero(mask)) == {ord("y"), ord("n")}
    logits = np.arange(len(TOKENS), dtype=np.float32)
    masked = apply_mask(logits, mask)
    assert masked[ord("y")] == ord("y") and np.isneginf(masked[ord("a")]) and logits[ord("a")] == ord("a")
    assert apply_mask(logits, None) is logits
    assert not m.advance(ord("x")) and m.n_advanced == 0  # a refused token changes nothing
    assert m.advance(ord("n")) and m.forced() == [ord("o")]
    m.rollback(1)
    assert m.n_advanced == 0 and set(np.flatnonzero(m.mask())) == {ord("y"), ord("n")}
    with pytest.raises(RuntimeError):
        m.rollback(1)
