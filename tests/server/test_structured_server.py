"""Structured output and tool calls through `edgespec serve`, with the official `openai` client: parse() with a
Pydantic model, response_format json_object / json_schema, a tool call round trip (call -> tool message -> answer),
streamed tool-call deltas, and bad constraints as 400s; Ollama's `format` and `tools` on /api/chat and /api/generate.
Tiny models whose likely tokens are JSON's characters (so free JSON ends by itself); one test on the real pair (marked real)."""

from __future__ import annotations

import json
from typing import Literal

import pydantic
import pytest

from edgespec.config import ModelSpec, SpecConfig
from edgespec.runtime.engine import Engine
from edgespec.server import create_app

from support.server_thread import ServerThread  # the uvicorn-in-a-thread harness
from support.tiny import token_id, write_tiny_model


EOS = 262
JSON_HOT = tuple(token_id(c) for c in '{}[]":,ab1 ') + (EOS,)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["paris", "rome"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}


class Item(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=6)
    count: int = pydantic.Field(ge=0, le=99)
    kind: Literal["tool", "toy"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    d = tmp_path_factory.mktemp("json-srv")
    t = write_tiny_model(d / "t.gguf", seed=21, hot_tokens=JSON_HOT, name="json-t")
    dr = write_tiny_model(d / "d.gguf", seed=22, hot_tokens=JSON_HOT, layer_scale=0.4, name="json-d")
    eng = Engine.load(
        ModelSpec(str(t), n_ctx=2048, n_threads=1), ModelSpec(str(dr), n_ctx=2048, n_threads=1),
        spec=SpecConfig(draft_max=4, adaptive=False), calibrate_costs=False,
    )
    s = ServerThread(create_app(eng))
    yield s
    s.stop()
    eng.close()


def ask(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def test_parse_with_a_pydantic_model(srv):
    client = srv.client()
    for seed in range(5):
        r = client.chat.completions.parse(model="m", messages=ask("an item"), response_format=Item, temperature=1.0, seed=seed, max_tokens=300)
        item = r.choices[0].message.parsed
        assert isinstance(item, Item), r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop"


def test_json_object_and_json_schema(srv):
    client = srv.client()
    for seed in range(5):
        r = client.chat.completions.create(
            model="m", messages=ask("json please"), response_format={"type": "json_object"}, temperature=0.8, seed=seed, max_tokens=400
        )
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(r.choices[0].message.content), dict)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["ok", "n"], "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "s", "strict": True, "schema": schema}}
    for stream in (False, True):
        if stream:
            parts = client.chat.completions.create(model="m", messages=ask("x"), response_format=rf, temperature=1.0, seed=3, stream=True)
            text = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
        else:
            text = client.chat.completions.create(model="m", messages=ask("x"), response_format=rf, temperature=1.0, seed=3).choices[0].message.content
        obj = json.loads(text)
        assert set(obj) == {"ok", "n"} and isinstance(obj["ok"], bool) and 0 <= obj["n"] <= 9
    # the completions route takes response_format too
    r = srv.post("/v1/completions", {"prompt": "x", "response_format": rf, "temperature": 0})
    assert r.status_code == 200 and set(json.loads(r.json()["choices"][0]["text"])) == {"ok", "n"}


def test_tool_call_round_trip(srv):
    client = srv.client()
    messages = ask("What is the weather in Paris this week?")
    r = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER], tool_choice="required", temperature=0.7, seed=1)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    (call,) = choice.message.tool_calls[:1]
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    assert args["city"] in ("paris", "rome") and 1 <= args["days"] <= 7
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in choice.message.tool_calls]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"forecast": "sunny"})},
    ]
    answer = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=20)
    assert answer.choices[0].message.tool_calls is None and isinstance(answer.choices[0].message.content, str)
    # a named function
    named = client.chat.completions.create(
        model="m", messages=ask("w"), tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}, temperature=0
    )
    assert named.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_streamed_tool_call_deltas(srv):
    client = srv.client()
    stream = client.chat.completions.create(
        model="m", messages=ask("weather?"), tools=[WEATHER], tool_choice="required", temperature=0.5, seed=4, stream=True
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        for tc in c.delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            slot["id"] += tc.id or ""
            if tc.function is not None:
                slot["name"] += tc.function.name or ""
                slot["arguments"] += tc.function.arguments or ""
        finish = c.finish_reason or finish
    assert finish == "tool_calls" and calls
    for slot in calls.values():
        assert slot["name"] == "get_weather" and slot["id"].startswith("call_")
        assert json.loads(slot["arguments"])["city"] in ("paris", "rome")


def test_logprobs_on_chat_and_completions(srv):
    client = srv.client()
    r = client.chat.completions.create(model="m", messages=ask("x"), temperature=0.7, seed=2, max_tokens=12, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert "".join(c.token for c in content) == r.choices[0].message.content
    assert all(c.logprob <= 0 and 1 <= len(c.top_logprobs) <= 2 for c in content)
    chunks = list(client.chat.completions.create(model="m", messages=ask("x"), temperature=0.7, seed=2, max_tokens=12, logprobs=True,
                                                 top_logprobs=2, stream=True))
    streamed = [c for ch in chunks if ch.choices and ch.choices[0].logprobs for c in ch.choices[0].logprobs.content]
    assert [(c.token, round(c.logprob, 4)) for c in streamed] == [(c.token, round(c.logprob, 4)) for c in content]
    c = srv.post("/v1/completions", {"prompt": "x", "max_tokens": 8, "temperature": 0, "logprobs": 2}).json()["choices"][0]
    assert "".join(c["logprobs"]["tokens"]) == c["text"] and len(c["logprobs"]["top_logprobs"]) == len(c["logprobs"]["tokens"])
    bad = srv.post("/v1/chat/completions", {"messages": ask("x"), "top_logprobs": 2})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "top_logprobs"


@pytest.mark.parametrize(
    "body,param",
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}}, "response_format"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"grammar": "root ::= ("}, "grammar"),
        ({"json_schema": {"type": "nonsense"}}, "json_schema"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice"),
        ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_bad_constraints_are_400(srv, body, param):
    r = srv.post("/v1/chat/completions", {"messages": ask("x"), **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.real
def test_real_pair_parse_and_tool_call(real_pair):
    target, draft = real_pair
    eng = Engine.load(ModelSpec(str(target), n_ctx=4096), ModelSpec(str(draft), n_ctx=4096), calibrate_costs=False)
    s = ServerThread(create_app(eng))
    try:
        client = s.client()

        class City(pydantic.BaseModel):
            name: str
            country: str
            population_millions: float

        r = client.chat.completions.parse(
            model="m", messages=ask("Give the largest city of Japan as JSON."), response_format=City, temperature=0, max_tokens=100
        )
        city = r.choices[0].message.parsed
        assert isinstance(city, City) and "tokyo" in city.name.lower()
        t = client.chat.completions.create(
            model="m", messages=ask("What's the weather in Rome for the next 3 days?"), tools=[WEATHER], temperature=0, max_tokens=100
        )
        assert t.choices[0].finish_reason == "tool_calls"
        call = t.choices[0].message.tool_calls[0]
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "rome", "days": 3}
    finally:
        s.stop()
        eng.close()


# --------------------------------------------------------------------------------------------- the Responses API
RESP_WEATHER = {"type": "function", **WEATHER["function"]}  # Responses tools are flat


def test_responses_text_format_json_schema(srv):
    c = srv.client()
    schema = Item.model_json_schema()
    r = c.responses.create(model="m", input="an item", text={"format": {"type": "json_schema", "name": "item", "schema": schema, "strict": True}},
                           max_output_tokens=80, temperature=0.8, extra_body={"seed": 3})
    assert r.status == "completed", r
    Item.model_validate_json(r.output_text)  # it parses and matches the schema
    parsed = c.responses.parse(model="m", input="an item", text_format=Item, max_output_tokens=80, temperature=0.8, extra_body={"seed": 5})
    assert isinstance(parsed.output_parsed, Item)


def test_responses_tool_call_round_trip_and_stream(srv):
    c = srv.client()
    r = c.responses.create(model="m", input="weather?", tools=[RESP_WEATHER], tool_choice="required", temperature=0.7,
                           extra_body={"seed": 1}, max_output_tokens=400)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather", r.output
    args = json.loads(calls[0].arguments)
    assert args["city"] in ("paris", "rome") and 1 <= args["days"] <= 7
    # the result goes back as a function_call_output item (after the call item, as the Agents SDK sends them)
    follow = c.responses.create(
        model="m", previous_response_id=r.id, tools=[RESP_WEATHER], tool_choice="none", temperature=0, max_output_tokens=10,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": json.dumps({"forecast": "sunny"})}],
    )
    assert follow.status in ("completed", "incomplete") and all(o.type == "message" for o in follow.output)
    # the same without the store: the call item sent back in the input
    again = c.responses.create(
        model="m", store=False, tools=[RESP_WEATHER], tool_choice="none", temperature=0, max_output_tokens=10,
        input=[{"role": "user", "content": "weather?"}, calls[0].model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}],
    )
    assert again.status in ("completed", "incomplete")
    kinds, done = [], None
    with c.responses.stream(model="m", input="weather?", tools=[RESP_WEATHER], tool_choice="required", temperature=0.7, extra_body={"seed": 1},
                            max_output_tokens=400) as stream:
        for ev in stream:
            kinds.append(ev.type)
        done = stream.get_final_response()
    assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"
    streamed = [o for o in done.output if o.type == "function_call"]
    assert [(o.name, o.arguments) for o in streamed] == [(o.name, o.arguments) for o in calls]  # same seed, same call


# --------------------------------------------------------------------------------------------- Ollama routes
def _ndjson(r) -> list[dict]:
    return [json.loads(line) for line in r.text.splitlines() if line.strip()]


def test_ollama_format_json_and_schema(srv):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
    for route, key in (("/api/chat", "message"), ("/api/generate", "response")):
        body = {"model": "m", "options": {"temperature": 1.0, "seed": 5}}
        body.update({"messages": ask("x")} if route == "/api/chat" else {"prompt": "x"})
        one = srv.post(route, {**body, "format": schema, "stream": False}).json()
        text = one["message"]["content"] if key == "message" else one["response"]
        assert set(json.loads(text)) == {"ok"}, text
        lines = _ndjson(srv.post(route, {**body, "format": schema}))
        streamed = "".join(x["message"]["content"] if key == "message" else x["response"] for x in lines)
        assert streamed == text and lines[-1]["done"] is True  # same seed, same answer, streamed or not
        j = srv.post(route, {**body, "format": "json", "stream": False, "options": {"temperature": 0.8, "seed": 1, "num_predict": 400}})
        out = j.json()
        if out["done_reason"] == "stop":
            assert isinstance(json.loads(out["message"]["content"] if key == "message" else out["response"]), dict)


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_ollama_tools_answer_with_ollama_tool_calls(srv, choice):
    """Ollama has no tool_choice ("auto": the tiny model answers text) and edgespec takes OpenAI's values there
    ("required": every answer is a call). Every call is valid, in Ollama's shape (arguments an object), streamed in
    the line before the last; 8 seeds."""
    calls_seen = 0
    for seed in range(8):
        body = {"model": "m", "messages": ask("weather?"), "tools": [WEATHER], "options": {"temperature": 1.0, "seed": seed}}
        if choice == "required":
            body["tool_choice"] = "required"
        one = srv.post("/api/chat", {**body, "stream": False}).json()
        lines = _ndjson(srv.post("/api/chat", body))
        assert lines[-1]["done"] is True
        calls = one["message"].get("tool_calls")
        if not calls:
            assert not any(x["message"].get("tool_calls") for x in lines)
            continue
        calls_seen += 1
        for c in calls:
            assert set(c) == {"function"} and c["function"]["name"] == "get_weather"
            args = c["function"]["arguments"]
            assert isinstance(args, dict) and args["city"] in ("paris", "rome") and 1 <= args["days"] <= 7
        assert lines[-2]["message"]["tool_calls"] == calls and lines[-2]["done"] is False
    if choice == "required":
        assert calls_seen == 8, calls_seen
    # the call goes back into the conversation as Ollama sends it (arguments an object, a tool message)
    history = ask("weather?") + [
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "rome", "days": 2}}}]},
        {"role": "tool", "content": json.dumps({"forecast": "rain"}), "tool_name": "get_weather"},
    ]
    r = srv.post("/api/chat", {"model": "m", "messages": history, "tools": [WEATHER], "stream": False, "options": {"num_predict": 20}})
    assert r.status_code == 200, r.text
    bad = srv.post("/api/chat", {"model": "m", "messages": ask("x"), "tools": [WEATHER], "format": "json"})
    assert bad.status_code == 400 and "format" in bad.json()["error"]


# --------------------------------------------------------------------------------------------- several calls, every route
P2 = '{"name": "get_weather", "arguments": {"city": "paris", "days": 2}}'
R2 = '{"name": "get_weather", "arguments": {"city": "rome", "days": 2}}'
SEVERAL = {  # answers holding two calls, in the shapes small models write them
    "one fenced block": f"```json\n{P2}\n{R2}\n```",
    "bare one after another": f"{P2}\n{R2}",
    "an array": f"[{P2}, {R2}]",
    "tagged blocks": f"<tool_call>\n{P2}\n</tool_call>\n<tool_call>\n{R2}\n</tool_call>",
    "fenced blocks": f"Checking both.\n```json\n{P2}\n```\n```json\n{R2}\n```",
}
TWO_CALLS = [("get_weather", {"city": "paris", "days": 2}), ("get_weather", {"city": "rome", "days": 2})]


@pytest.fixture
def answers(monkeypatch):
    """The tiny model made to write exactly the answer set in holder["text"]: tool_choice "auto"'s constraint is
    replaced by a grammar of that one text (the tiny model writes one character per token), so the routes' own
    reading of the answer is what is tested."""
    from edgespec.decoding.constraint import Constraint
    from edgespec.server import schema

    holder: dict[str, str] = {}
    monkeypatch.setattr(schema, "tool_constraint", lambda tools, choice, parallel=True: Constraint.grammar(
        "start: " + json.dumps(holder["text"])))
    return holder


def _chat_calls(srv, stream: bool) -> tuple[list, str | None, str]:
    c = srv.client()
    kw = dict(model="m", messages=ask("weather in paris and rome?"), tools=[WEATHER], temperature=0, max_tokens=400)
    if not stream:
        r = c.chat.completions.create(**kw)
        calls = r.choices[0].message.tool_calls or []
        return [(x.function.name, json.loads(x.function.arguments)) for x in calls], r.choices[0].finish_reason, r.choices[0].message.content or ""
    slots: dict[int, dict[str, str]] = {}
    finish, content = None, ""
    for chunk in c.chat.completions.create(**kw, stream=True):
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        content += ch.delta.content or ""
        for tc in ch.delta.tool_calls or []:
            slot = slots.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            slot["id"] += tc.id or ""
            slot["name"] += (tc.function.name or "") if tc.function else ""
            slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
        finish = ch.finish_reason or finish
    assert len({s["id"] for s in slots.values()}) == len(slots)
    return [(s["name"], json.loads(s["arguments"])) for _, s in sorted(slots.items())], finish, content


@pytest.mark.parametrize("shape", SEVERAL)
def test_several_calls_come_back_as_several_calls_on_every_route(srv, answers, shape):
    answers["text"] = SEVERAL[shape]
    for stream in (False, True):
        calls, finish, content = _chat_calls(srv, stream)
        assert calls == TWO_CALLS and finish == "tool_calls", (shape, stream, calls, content)
        assert "get_weather" not in content
    c = srv.client()
    r = c.responses.create(model="m", input="weather in paris and rome?", tools=[RESP_WEATHER], temperature=0, max_output_tokens=400)
    assert [(o.name, json.loads(o.arguments)) for o in r.output if o.type == "function_call"] == TWO_CALLS, (shape, r.output)
    with c.responses.stream(model="m", input="weather in paris and rome?", tools=[RESP_WEATHER], temperature=0,
                            max_output_tokens=400) as s:
        done_args = [ev.arguments for ev in s if ev.type == "response.function_call_arguments.done"]
        final = s.get_final_response()
    assert [json.loads(a) for a in done_args] == [a for _, a in TWO_CALLS]
    assert [(o.name, json.loads(o.arguments)) for o in final.output if o.type == "function_call"] == TWO_CALLS
    body = {"model": "m", "messages": ask("weather in paris and rome?"), "tools": [WEATHER], "options": {"temperature": 0}}
    one = srv.post("/api/chat", {**body, "stream": False}).json()
    assert [(x["function"]["name"], x["function"]["arguments"]) for x in one["message"]["tool_calls"]] == TWO_CALLS, one
    lines = _ndjson(srv.post("/api/chat", body))
    assert lines[-2]["message"]["tool_calls"] == one["message"]["tool_calls"] and lines[-1]["done"] is True


@pytest.mark.real
def test_real_pair_answers_two_questions_with_two_tool_calls(real_pair):
    """Two weather questions under tool_choice "auto": the real pair writes both calls in one fenced block
    (test_structured.REAL_PAIR_TWO_WEATHER); they come back as two tool_calls, streamed and not, and as two
    function_call items on the Responses API."""
    target, draft = real_pair
    eng = Engine.load(ModelSpec(str(target), n_ctx=4096), ModelSpec(str(draft), n_ctx=4096), calibrate_costs=False)
    s = ServerThread(create_app(eng))
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city.",
                                              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    question = "What's the weather in Paris? And what's the weather in Tokyo?"
    want = [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Tokyo"})]
    try:
        client = s.client(timeout=600)
        r = client.chat.completions.create(model="m", messages=ask(question), tools=[tool], temperature=0, max_tokens=200)
        calls = r.choices[0].message.tool_calls or []
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == want, r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and len({c.id for c in calls}) == 2
        slots: dict[int, dict[str, str]] = {}
        for chunk in client.chat.completions.create(model="m", messages=ask(question), tools=[tool], temperature=0, max_tokens=200, stream=True):
            for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                slot = slots.setdefault(tc.index, {"name": "", "arguments": ""})
                slot["name"] += (tc.function.name or "") if tc.function else ""
                slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
        assert [(v["name"], json.loads(v["arguments"])) for _, v in sorted(slots.items())] == want
        resp = client.responses.create(model="m", input=question, tools=[{"type": "function", **tool["function"]}], temperature=0,
                                       max_output_tokens=200)
        assert [(o.name, json.loads(o.arguments)) for o in resp.output if o.type == "function_call"] == want, resp.output
    finally:
        s.stop()
        eng.close()


# --------------------------------------------------------------------------------------------- text streams with tools
@pytest.fixture(scope="module")
def qwen_srv(tmp_path_factory):
    """A tiny model that writes letters (so an answer under tool_choice "auto" is text) with Qwen2.5's chat template."""
    from support.templates import QWEN25_TEMPLATE

    d = tmp_path_factory.mktemp("qwen-tools")
    t = write_tiny_model(d / "t.gguf", seed=31, name="letters-qwen", chat_template=QWEN25_TEMPLATE)
    eng = Engine.load(ModelSpec(str(t), n_ctx=2048, n_threads=1), drafter="ngram", calibrate_costs=False)
    s = ServerThread(create_app(eng))
    yield s, eng
    s.stop()
    eng.close()


def test_the_template_renders_the_tools_and_results_itself(qwen_srv):
    from edgespec.decoding.structured import check_tools, tool_history

    _, eng = qwen_srv
    msgs = tool_history([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                             "function": {"name": "get_weather", "arguments": '{"city": "paris", "days": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ])
    segs = eng.chat_segments(msgs, tools=check_tools([WEATHER]))
    text = "".join(t for t, _ in segs)
    assert text.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")  # Qwen's own tools branch
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "paris", "days": 1}}\n</tool_call><|im_end|>' in text
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n" in text
    assert [t for t, c in segs if c] == ["Weather in Paris?", "sunny"]


def test_text_answers_with_tools_stream_as_they_come(qwen_srv):
    srv, _ = qwen_srv
    c = srv.client()
    deltas, done = [], None
    for ev in c.responses.create(model="m", input="hello", tools=[RESP_WEATHER], tool_choice="auto", temperature=0,
                                 max_output_tokens=24, stream=True):
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
        if ev.type in ("response.completed", "response.incomplete"):
            done = ev.response
    assert done is not None and len(deltas) > 1, deltas  # not one delta at the end
    assert "".join(deltas) == done.output_text and done.output_text.strip()
    assert [o.type for o in done.output] == ["message"]
    parts = c.chat.completions.create(model="m", messages=ask("hello"), tools=[WEATHER], tool_choice="auto", temperature=0,
                                      max_tokens=24, stream=True)
    chat = [ch.choices[0].delta.content for ch in parts if ch.choices and ch.choices[0].delta.content]
    assert len(chat) > 1 and "".join(chat) == done.output_text  # greedy: the same text
