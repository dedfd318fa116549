"""edgespec.decoding.structured and edgespec.decoding.constraint without a model: request fields -> constraints, tool calls in and out,
and the matcher on a byte vocabulary."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgespec.decoding.constraint import Constraint, ConstraintError, Matcher, Vocabulary, apply_mask
from edgespec.decoding.structured import (
    ToolCallSplitter,
    check_tool_choice,
    check_tools,
    constraint_from_response_format,
    parse_tool_calls,
    prompt_messages,
    tool_constraint,
    tool_history,
    tool_messages,
)

from support.templates import QWEN25_TEMPLATE

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


NAMES = ["get_weather", "add"]
CALL = '{"name": "get_weather", "arguments": {"city": "paris"}}'


def _names(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


@pytest.mark.parametrize("text, content", [
    (f"<tool_call>\n{CALL}\n</tool_call>", None),  # tagged
    (f"<tool_call>\n{CALL}", None),  # tagged, the model stopped before closing it
    (f"```json\n{CALL}\n```", None),  # fenced
    (f"I will check.\n```json\n{CALL}\n```", "I will check."),
    (f"```\n[{CALL}]\n```", None),  # fenced array, no language
    (f"  {CALL}", None),  # bare object
    (f"[{CALL}]", None),  # bare array
    (f"{CALL}\n\nThis gets the weather.", "This gets the weather."),
    ('{"name": "get_weather", "parameters": {"city": "paris"}}', None),  # "parameters" for "arguments"
    ('{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "paris"}}}', None),
])
def test_parse_tool_calls_reads_the_shapes_small_models_write(text, content):
    got, calls = parse_tool_calls(text, NAMES)
    assert got == content and _names(calls) == [("get_weather", {"city": "paris"})]


def test_parse_tool_calls_several_and_not_calls():
    two = parse_tool_calls(f'[{CALL}, {{"name": "add", "arguments": {{"a": 1, "b": 2}}}}]', NAMES)
    assert _names(two[1]) == [("get_weather", {"city": "paris"}), ("add", {"a": 1, "b": 2})]
    seq = parse_tool_calls(f"{CALL}\n{CALL}", NAMES)
    assert len(seq[1]) == 2 and seq[0] is None
    for text in (
        '{"name": "other", "arguments": {}}',  # JSON naming no offered tool: an answer
        '```json\n{"city": "paris", "temperature": 21}\n```',  # JSON that is not a call
        '[1, 2, 3]',
        '```python\nprint({"name": "get_weather", "arguments": {}})\n```',  # code, not a call
        "The weather tool takes {\"name\": \"get_weather\"} style input.",
        "[" * 5000,  # deep garbage: no RecursionError
    ):
        assert parse_tool_calls(text, NAMES) == (text, []), text
    # untagged JSON is a call only when the offered names are known
    assert parse_tool_calls(f"```json\n{CALL}\n```")[1] == []


ROME = '{"name": "get_weather", "arguments": {"city": "rome"}}'
TWO = [("get_weather", {"city": "paris"}), ("get_weather", {"city": "rome"})]
SEVERAL = [  # (an answer holding two calls, the content left around them)
    (f"```json\n{CALL}\n{ROME}\n```", None),  # one fenced block, the objects one after another
    (f"```json\n{CALL}\n\n{ROME}\n```", None),
    (f"```json\n{CALL},\n{ROME}\n```", None),  # ... with a comma between them
    (f"```\n{json.dumps(json.loads(CALL), indent=2)}\n{json.dumps(json.loads(ROME), indent=2)}\n```", None),  # pretty-printed
    (f"I'll check both.\n```json\n{CALL}\n{ROME}\n```", "I'll check both."),
    (f"{CALL}\n{ROME}", None),  # bare, one after another
    (f"{CALL}, {ROME}", None),
    (f"{CALL}\n{ROME}\nBoth cities.", "Both cities."),
    (f"[{CALL}, {ROME}]", None),  # an array
    (f"```json\n[{CALL}, {ROME}]\n```", None),
    (f"<tool_call>\n{CALL}\n</tool_call>\n<tool_call>\n{ROME}\n</tool_call>", None),  # several tagged blocks
    (f"<tool_call>\n{CALL}\n</tool_call>\n<tool_call>\n{ROME}", None),  # the last one not closed
    (f"<tool_call>\n{CALL}\n{ROME}\n</tool_call>", None),  # two in one tagged block
    (f"```json\n{CALL}\n```\n```json\n{ROME}\n```", None),  # several fenced blocks
    (f"Paris:\n```json\n{CALL}\n```\nRome:\n```json\n{ROME}\n```", "Paris:\nRome:"),
]


@pytest.mark.parametrize("text, content", SEVERAL)
def test_several_calls_in_one_answer_are_several_calls(text, content):
    got, calls = parse_tool_calls(text, NAMES)
    assert got == content and _names(calls) == TWO, text
    assert len({c["id"] for c in calls}) == 2
    pieces = ToolCallSplitter(NAMES)  # streamed one character at a time: the same calls, no call text sent
    sent = "".join(pieces.feed(ch) for ch in text)
    rest, streamed = pieces.finish()
    assert _names(streamed) == TWO and "get_weather" not in sent
    assert (sent + rest).strip() == (content or "")


# Captured (2026-12-05): the real pair (Qwen2.5-Coder 1.5B + 0.5B Q4_K_M) through /v1/chat/completions at
# temperature 0, tool_choice "auto", the one tool bench/tool_roundtrip.py's get_weather ({"city": string}), asked
# "What's the weather in Paris? And what's the weather in Tokyo?": two calls in one fenced block, pretty-printed.
REAL_PAIR_TWO_WEATHER = (
    '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n'
    '{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Tokyo"\n  }\n}\n```'
)


def test_several_calls_the_real_pair_wrote():
    content, calls = parse_tool_calls(REAL_PAIR_TWO_WEATHER, ["get_weather"])
    assert content is None and _names(calls) == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Tokyo"})]
    s = ToolCallSplitter(["get_weather"])
    sent = "".join(s.feed(REAL_PAIR_TWO_WEATHER[i : i + 3]) for i in range(0, len(REAL_PAIR_TWO_WEATHER), 3))
    assert sent == "" and _names(s.finish()[1]) == _names(calls)


def test_a_block_with_a_call_and_something_else_is_text():
    for text in (f"```json\n{CALL}\n{{\"city\": \"rome\"}}\n```", f"```json\n{CALL}\nnot json\n```",
                 f"<tool_call>\n{CALL} trailing words\n</tool_call>"):
        assert parse_tool_calls(text, NAMES) == (text, []), text
    # bare values from the start: the calls are read up to the first value that is not one; the rest is text
    content, calls = parse_tool_calls(f'{CALL}\n{{"city": "rome"}}', NAMES)
    assert _names(calls) == [("get_weather", {"city": "paris"})] and content == '{"city": "rome"}'


@pytest.mark.parametrize("text", [
    f"Let me look that up for you.\n<tool_call>\n{CALL}\n</tool_call>",
    f"Checking:\n```json\n{CALL}\n```\nDone.",
    f"{CALL}",
    "Here is code:\n```python\nx = {1: 2}\n```\nand more text <b>bold</b> `tick` and ``two``.",
    "It is sunny in Paris. <tool_call> is how I would call a tool, but not now",
    "  \n leading space, then [a list] and {braces}",
])
def test_the_splitter_streams_text_and_holds_only_possible_calls(text):
    whole = ToolCallSplitter(NAMES)
    head = whole.feed(text)
    rest, calls = whole.finish()
    pieces = ToolCallSplitter(NAMES)
    sent = [pieces.feed(ch) for ch in text]  # one character at a time, as a stream may come
    rest2, calls2 = pieces.finish()
    assert "".join(sent) + rest2 == head + rest and _names(calls2) == _names(calls)
    if not calls:
        assert "".join(sent) + rest2 == text
    else:
        assert "<tool_call>" not in "".join(sent) and "```" not in "".join(sent)
    assert _names(parse_tool_calls(text, NAMES)[1]) == _names(calls)
    assert bool(calls) == (text.lstrip().startswith("{") or "<tool_call>\n{" in text or "```json" in text)


def test_the_splitter_sends_text_before_the_answer_ends():
    s = ToolCallSplitter(NAMES)
    assert s.feed("The weather ") == "The weather"  # trailing space waits for what follows
    assert s.feed("in Paris is <") == " in Paris is"  # "<" may open <tool_call>
    assert s.feed("b>sunny</b>.") == " <b>sunny</b>."
    assert s.feed("\n```py") == ""  # a fence: its language decides
    assert s.feed("thon\nx = 1\n") == "\n```python\nx = 1"  # code: it streams on
    assert s.finish() == ("\n", [])
    held = ToolCallSplitter(NAMES)
    assert held.feed('{"name": "get_weather", ') == ""  # a bare object at the start: held to the end
    assert held.feed('"arguments": {"city": "rome"}}') == ""
    assert _names(held.finish()[1]) == [("get_weather", {"city": "rome"})]


def test_prompt_messages_use_the_template_where_it_renders_tools():
    tools = check_tools(TOOLS)
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                                  "function": {"name": "get_weather", "arguments": '{"city": "paris"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    hist = tool_history(msgs)
    assert hist[1]["tool_calls"] == [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "paris"}}}]
    native, tl = prompt_messages(QWEN25_TEMPLATE, hist, tools)
    assert native == hist and tl == [t.as_openai() for t in tools]
    plain, none = prompt_messages(None, hist, tools)  # ChatML fallback: no tools of its own
    assert none is None and plain == tool_messages(hist, tools) and plain[0]["role"] == "system"
    assert prompt_messages(QWEN25_TEMPLATE, msgs[:1], []) == (msgs[:1], None)
    with pytest.raises(ConstraintError):
        tool_history([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}])


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
