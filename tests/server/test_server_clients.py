"""The endpoints other clients call, against a real uvicorn server on the tiny models: llama-server's native routes
(`/v1/health`, `/props`, `/completion`, `/infill`, `/tokenize`, `/detokenize`, `/apply-template`) and Ollama's
(`/api/tags`, `/api/show`, `/api/chat`, `/api/generate`) over raw HTTP, with the shapes of llama.cpp's
tools/server/README.md and Ollama's docs/api.md; OpenAI's Responses API through the official `openai` client (sync,
async, streaming) and the OpenAI Agents SDK's default path; and the "no silent surprises" checks on the OpenAI
routes (ignored parameters reported, stream_options without stream, max_tokens conflicts, message names).

Greedy answers are compared with a second engine (the server must answer what the library answers)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest

from edgespec.config import ModelSpec, SamplingParams, SpecConfig
from edgespec.runtime.engine import Engine
from edgespec.server import create_app
from edgespec.server.responses import IGNORED_HEADER

from support.engines import load
from support.server_thread import ServerThread, chat, sse_events
from support.tiny import token_id, write_tiny_model

GREEDY = SamplingParams(temperature=0)
N_CTX = 2048


@pytest.fixture(scope="module")
def plain_srv(tiny):
    """A server over the standard tiny pair, whose vocabulary has no FIM tokens."""
    eng = load(tiny["target"], tiny["draft"], n_ctx=N_CTX)
    s = ServerThread(create_app(eng))
    yield s
    s.stop()
    eng.close()


def ndjson(r: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line) for line in r.text.splitlines() if line.strip()]


# --------------------------------------------------------------------------------------------- llama-server routes
def test_health_props_and_v1_health(fim_srv, fim_engine):
    assert httpx.get(fim_srv.url + "/v1/health").json() == {"status": "ok"}
    p = httpx.get(fim_srv.url + "/props").json()
    for key in ("default_generation_settings", "total_slots", "model_path", "chat_template", "build_info", "modalities"):
        assert key in p
    assert p["default_generation_settings"]["n_ctx"] == N_CTX and p["total_slots"] >= 1 and p["infill"] is True
    assert p["model_path"] == fim_engine.target.spec.path and p["eos_token"] == "<|im_end|>"
    assert p["deterministic"] is False  # serve --deterministic: true


def test_completion_matches_the_engine_and_has_llama_server_fields(fim_srv, fim_reference):
    body = {"prompt": "Hello there", "n_predict": 12, "temperature": 0, "cache_prompt": True, "return_tokens": True}
    r = fim_srv.post("/completion", body)
    assert r.status_code == 200, r.text
    j = r.json()
    want = fim_reference.generate("Hello there", sampling=GREEDY, max_tokens=12)
    assert j["content"] == want.text and j["tokens"] == want.token_ids
    for key in ("id_slot", "model", "tokens_predicted", "tokens_evaluated", "generation_settings", "prompt", "has_new_line",
                "truncated", "stop_type", "stopping_word", "tokens_cached", "timings"):
        assert key in j, key
    assert j["stop"] is True and j["tokens_predicted"] == 12 and j["prompt"] == "Hello there"
    assert j["stop_type"] == ("limit" if want.finish_reason == "length" else "eos")
    assert j["timings"]["predicted_n"] == 12 and "draft_n_accepted" in j["timings"] and "mu" in j["edgespec"]
    assert IGNORED_HEADER not in r.headers  # every key was read


def test_completion_stream_and_stop_word(fim_srv, fim_reference):
    want = fim_reference.generate("abc abc abc", sampling=GREEDY, max_tokens=20)
    r = fim_srv.post("/completion", {"prompt": "abc abc abc", "n_predict": 20, "temperature": 0, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = list(sse_events(r.iter_lines()))
    assert "[DONE]" not in events  # llama-server's native stream has no [DONE]
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == want.text
    assert events[-1]["timings"]["predicted_n"] == 20
    # a stop word: stop_type "word" and the word reported
    word = want.text[5:7]
    j = fim_srv.post("/completion", {"prompt": "abc abc abc", "n_predict": 20, "temperature": 0, "stop": [word]}).json()
    assert j["stop_type"] == "word" and j["stopping_word"] == word and j["content"] == want.text[: want.text.index(word)]


def test_completion_refuses_what_it_cannot_honour_and_reports_the_rest(fim_srv):
    r = fim_srv.post("/completion", {"prompt": "x", "n_predict": 2, "mirostat": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "mirostat"
    r = fim_srv.post("/completion", {"prompt": "x", "n_predict": 2, "id_slot": 0, "n_keep": 4, "my_flag": 1})
    assert r.status_code == 200 and r.headers[IGNORED_HEADER] == "my_flag, n_keep"


def test_infill_raw_http(fim_srv, fim_reference):
    body = {"input_prefix": "def f(", "input_suffix": "):\n    pass\n", "input_extra": [{"filename": "u.py", "text": "import os\n"}],
            "n_predict": 16, "temperature": 0}
    r = fim_srv.post("/infill", body)
    assert r.status_code == 200, r.text
    j = r.json()
    want = fim_reference.infill("def f(", "):\n    pass\n", extra=[("u.py", "import os\n")], sampling=GREEDY, max_tokens=16)
    assert j["content"] == want.text and j["stop"] is True and j["tokens_evaluated"] == want.stats.n_prompt
    events = list(sse_events(fim_srv.post("/infill", {**body, "stream": True}).iter_lines()))
    assert "".join(e["content"] for e in events) == want.text and events[-1]["stop"] is True
    # `prompt` is text typed after the prefix
    j2 = fim_srv.post("/infill", {"input_prefix": "def f", "prompt": "(", "input_suffix": "):\n    pass\n", "n_predict": 8, "temperature": 0}).json()
    assert j2["content"] == fim_reference.infill("def f", "):\n    pass\n", prompt="(", sampling=GREEDY, max_tokens=8).text
    bad = fim_srv.post("/infill", {"input_prefix": "a", "input_extra": [{"text": 3}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input_extra[0]"


def test_infill_t_max_predict_ms_stops_after_a_newline(tmp_path):
    # a FIM model that writes newlines often; 0.001 ms: the limit is past at the first newline, so the answer ends
    # within one cycle of it (stop_type "limit"); without the limit it runs to n_predict
    hot = tuple(token_id(c) for c in "ab\n")
    path = write_tiny_model(tmp_path / "nl.gguf", seed=3, hot_tokens=hot, name="tiny-nl", fim=True)
    eng = Engine.load(ModelSpec(str(path), n_ctx=N_CTX, n_threads=1), calibrate_costs=False, drafter="ngram",
                      spec=SpecConfig(draft_max=4, adaptive=False))
    s = ServerThread(create_app(eng))
    try:
        body = {"input_prefix": "x", "input_suffix": "", "n_predict": 300, "temperature": 0}
        full = s.post("/infill", body).json()
        assert full["stop_type"] == "limit" and full["tokens_predicted"] == 300 and "\n" in full["content"]
        j = s.post("/infill", {**body, "t_max_predict_ms": 0.001}).json()
        assert j["stop"] is True and j["stop_type"] == "limit" and j["tokens_predicted"] < 300
        first_nl = full["content"].index("\n")
        assert full["content"].startswith(j["content"]) and len(j["content"]) > first_nl
        assert srv_bad_t_max(s)
    finally:
        s.stop()
        eng.close()


def srv_bad_t_max(s: ServerThread) -> bool:
    r = s.post("/infill", {"input_prefix": "x", "t_max_predict_ms": "soon"})
    return r.status_code == 400 and r.json()["error"]["param"] == "t_max_predict_ms"


def test_suffix_on_v1_completions_is_infill(fim_srv, fim_reference):
    c = fim_srv.client()
    r = c.completions.create(model="m", prompt="hello wor", suffix=" and more", max_tokens=10, temperature=0)
    assert r.choices[0].text == fim_reference.infill("hello wor", " and more", sampling=GREEDY, max_tokens=10).text
    bad = fim_srv.post("/v1/completions", {"prompt": [1, 2, 3], "suffix": "x", "max_tokens": 2})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "suffix"


def test_infill_on_a_model_without_fim_tokens_is_a_400(plain_srv):
    r = plain_srv.post("/infill", {"input_prefix": "a", "input_suffix": "b", "n_predict": 2})
    assert r.status_code == 400
    err = r.json()["error"]
    assert "cannot fill in the middle" in err["message"] and err["param"] == "input_prefix"
    r = plain_srv.post("/v1/completions", {"prompt": "a", "suffix": "b", "max_tokens": 2})
    assert r.status_code == 400 and "cannot fill in the middle" in r.json()["error"]["message"]
    assert httpx.get(plain_srv.url + "/props").json()["infill"] is False


def test_tokenize_detokenize_apply_template(fim_srv, fim_engine):
    j = fim_srv.post("/tokenize", {"content": "abc <|im_end|>"}).json()
    assert j == {"tokens": fim_engine.target.tokenize("abc <|im_end|>", parse_special=True)}
    pieces = fim_srv.post("/tokenize", {"content": "hé", "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == fim_engine.target.tokenize("hé")
    assert all(isinstance(p["piece"], (str, list)) for p in pieces)
    assert fim_srv.post("/detokenize", {"tokens": j["tokens"]}).json() == {"content": "abc <|im_end|>"}
    assert fim_srv.post("/detokenize", {"tokens": [10**9]}).status_code == 400
    assert fim_srv.post("/tokenize", {}).json()["error"]["param"] == "content"
    t = fim_srv.post("/apply-template", {"messages": chat("hi", system="be brief")}).json()
    assert t == {"prompt": fim_engine.render(chat("hi", system="be brief"))}


# --------------------------------------------------------------------------------------------- Ollama routes
def test_ollama_tags_show_version(fim_srv, fim_engine):
    tags = httpx.get(fim_srv.url + "/api/tags").json()
    (m,) = tags["models"]
    assert m["name"] == m["model"] == "tiny-fim-target:latest"
    assert m["size"] == fim_engine.target.info.file_size and m["details"]["format"] == "gguf" and m["modified_at"].endswith("Z")
    s = fim_srv.post("/api/show", {"model": "tiny-fim-target:latest"}).json()
    assert s["template"] == fim_engine.target.chat_template and "insert" in s["capabilities"]
    assert s["model_info"]["general.architecture"] == "llama" and s["details"]["family"] == "llama"
    r = fim_srv.post("/api/show", {"model": "llama3"})
    assert r.status_code == 404 and set(r.json()) == {"error"}
    assert "version" in httpx.get(fim_srv.url + "/api/version").json()


def test_ollama_chat_stream_is_ndjson_by_default(fim_srv, fim_reference):
    want = fim_reference.generate(messages=chat("hi"), sampling=GREEDY, max_tokens=10)
    body = {"model": "tiny-fim-target", "messages": chat("hi"), "options": {"temperature": 0, "num_predict": 10, "num_thread": 2},
            "keep_alive": "5m"}
    r = fim_srv.post("/api/chat", body)
    assert r.headers["content-type"] == "application/x-ndjson"
    lines = ndjson(r)
    assert all(not x["done"] for x in lines[:-1]) and lines[-1]["done"] is True
    assert "".join(x["message"]["content"] for x in lines) == want.text
    last = lines[-1]
    for key in ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration", "done_reason"):
        assert key in last, key
    assert last["eval_count"] == 10 and last["done_reason"] == "length" and last["message"]["role"] == "assistant"
    assert r.headers[IGNORED_HEADER] == "keep_alive, options.num_thread"
    one = fim_srv.post("/api/chat", {**body, "stream": False}).json()
    assert one["message"]["content"] == want.text and one["done"] is True


def test_ollama_generate_prompt_raw_suffix_and_load(fim_srv, fim_reference):
    want = fim_reference.generate(messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}], sampling=GREEDY, max_tokens=8)
    j = fim_srv.post("/api/generate", {"model": "m", "prompt": "hi", "system": "s", "stream": False, "options": {"temperature": 0, "num_predict": 8}}).json()
    assert j["response"] == want.text and j["done"] is True
    raw = fim_srv.post("/api/generate", {"model": "m", "prompt": "hi", "raw": True, "stream": False, "options": {"temperature": 0, "num_predict": 8}}).json()
    assert raw["response"] == fim_reference.generate("hi", sampling=GREEDY, max_tokens=8).text
    fim = ndjson(fim_srv.post("/api/generate", {"model": "m", "prompt": "def f(", "suffix": "):", "options": {"temperature": 0, "num_predict": 8}}))
    assert "".join(x["response"] for x in fim) == fim_reference.infill("def f(", "):", sampling=GREEDY, max_tokens=8).text
    load = fim_srv.post("/api/generate", {"model": "m"}).json()
    assert load["done"] is True and load["done_reason"] == "load" and load["response"] == ""


@pytest.mark.parametrize("body,param", [
    ({"messages": chat("x"), "options": {"mirostat": 2}}, "options.mirostat"),
    ({"messages": chat("x"), "options": {"num_ctx": 10**6}}, "options.num_ctx"),
    ({"messages": chat("x"), "options": {"bogus": 1}}, "options.bogus"),
    ({"messages": chat("x"), "format": "yaml"}, "format"),
    ({"messages": chat("x"), "format": {"type": "nonsense"}}, "format"),
    ({"messages": chat("x"), "tools": [{"type": "function"}]}, "tools"),
    ({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "messages[0].images"),
    ({"messages": chat("x"), "options": {"temperature": "hot"}}, "temperature"),
])
def test_ollama_errors_name_the_field(fim_srv, body, param):
    r = fim_srv.post("/api/chat", body)
    assert r.status_code == 400 and set(r.json()) == {"error"} and param in r.json()["error"], r.text


# --------------------------------------------------------------------------------------------- Responses API
def test_responses_create_matches_chat(fim_srv, fim_reference):
    c = fim_srv.client()
    r = c.responses.create(model="m", input="hi", instructions="be brief", max_output_tokens=9, temperature=0)
    want = fim_reference.generate(messages=chat("hi", system="be brief"), sampling=GREEDY, max_tokens=9)
    assert r.output_text == want.text and r.status == ("incomplete" if want.finish_reason == "length" else "completed")
    assert r.usage.input_tokens == want.stats.n_prompt and r.usage.output_tokens == 9
    assert r.usage.input_tokens_details.cached_tokens >= 0 and r.instructions == "be brief"
    assert r.model_extra["edgespec"]["drafter"] == "model+ngram"
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"
    # input as items; previous_response_id continues the stored conversation (instructions are not carried over)
    r2 = c.responses.create(model="m", previous_response_id=r.id, max_output_tokens=6, temperature=0,
                            input=[{"role": "user", "content": [{"type": "input_text", "text": "more"}]}])
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": r.output_text}, {"role": "user", "content": "more"}]
    assert r2.output_text == fim_reference.generate(messages=history, sampling=GREEDY, max_tokens=6).text
    assert r2.previous_response_id == r.id
    assert r2.usage.input_tokens_details.cached_tokens > 0  # the first turn's tokens came from the KV cache
    assert c.responses.retrieve(r2.id).output_text == r2.output_text


def test_responses_stream_and_async(fim_srv, fim_reference):
    want = fim_reference.generate(messages=chat("stream me"), sampling=GREEDY, max_tokens=12)
    c = fim_srv.client()
    with c.responses.stream(model="m", input="stream me", max_output_tokens=12, temperature=0) as stream:
        kinds, deltas = [], []
        for ev in stream:
            kinds.append(ev.type)
            if ev.type == "response.output_text.delta":
                deltas.append(ev.delta)
        last = ev
        if want.finish_reason == "length":  # as with OpenAI, the SDK's final response needs response.completed
            assert last.type == "response.incomplete" and last.response.incomplete_details.reason == "max_output_tokens"
            final = last.response
        else:
            final = stream.get_final_response()
    assert "".join(deltas) == want.text and final.output_text == want.text and final.usage.output_tokens == len(want.token_ids)
    # a stream that ends before the limit (here at a stop string, an edgespec extra) completes
    word = want.text[4:6]
    with c.responses.stream(model="m", input="stream me", max_output_tokens=12, temperature=0, extra_body={"stop": [word]}) as stream:
        done = stream.get_final_response()
    assert done.status == "completed" and done.output_text == want.text[: want.text.index(word)]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    # create(stream=True): sequence numbers count up from 0
    seqs = [ev.sequence_number for ev in c.responses.create(model="m", input="stream me", max_output_tokens=3, stream=True)]
    assert seqs == list(range(len(seqs)))

    async def run() -> str:
        ac = fim_srv.aclient()
        r = await ac.responses.create(model="m", input="stream me", max_output_tokens=12, temperature=0)
        return r.output_text

    assert asyncio.run(run()) == want.text


def test_responses_input_items_as_the_agents_sdk_sends_them(fim_srv, fim_reference):
    """Multi-turn input the way SDKs replay it: message items with ids and statuses, assistant output_text parts,
    a developer message."""
    items = [
        {"role": "developer", "content": "be brief"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "hello", "annotations": []}]},
        {"role": "user", "content": "again"},
    ]
    r = fim_srv.client().responses.create(model="m", input=items, max_output_tokens=5, temperature=0, store=False)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "again"}]
    assert r.output_text == fim_reference.generate(messages=msgs, sampling=GREEDY, max_tokens=5).text
    with pytest.raises(openai.NotFoundError):  # store: false keeps nothing
        fim_srv.client().responses.retrieve(r.id)


@pytest.mark.parametrize("kw,param", [
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}}, "text.format"),
    ({"text": {"format": {"type": "xml"}}}, "text.format"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"previous_response_id": "resp_nope"}, "previous_response_id"),
    ({"input": [{"type": "custom_tool_call_output", "call_id": "c", "output": "x"}]}, "input[0]"),
    ({"input": [{"type": "function_call_output", "call_id": 3, "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}, "input[0].content[0]"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
])
def test_responses_refusals_name_the_parameter(fim_srv, kw, param):
    c = fim_srv.client()
    args = {"model": "m", "input": "x", **kw}
    with pytest.raises(openai.APIStatusError) as ei:
        c.responses.create(**args)
    assert ei.value.status_code in (400, 404) and ei.value.body["param"] == param, ei.value.body


def test_agents_sdk_default_path(fim_srv, fim_reference):
    import agents  # openai-agents, a test dependency

    agents.set_tracing_disabled(True)
    client = fim_srv.aclient()
    agents.set_default_openai_client(client, use_for_tracing=False)
    agents.set_default_openai_api("responses")
    want = fim_reference.generate(messages=chat("hi", system="be brief"), sampling=GREEDY, max_tokens=12)
    # The SDK treats an incomplete response (max_output_tokens reached) as a failure, as it does with OpenAI's
    # server; the tiny model never ends by itself, so a stop string (an edgespec extra) ends it
    word = want.text[4:6]
    settings = agents.ModelSettings(temperature=0, max_tokens=12, extra_body={"stop": [word]})
    agent = agents.Agent(name="a", instructions="be brief", model="tiny", model_settings=settings)
    result = agents.Runner.run_sync(agent, "hi")
    assert result.final_output == want.text[: want.text.index(word)]

    async def streamed() -> Any:  # Runner.run_streamed: the Responses event stream
        agents.set_default_openai_client(fim_srv.aclient(), use_for_tracing=False)  # a client for this event loop
        run = agents.Runner.run_streamed(agent, "hi")
        async for _ in run.stream_events():
            pass
        return run.final_output

    assert asyncio.run(streamed()) == result.final_output


PARIS = '{"name": "get_weather", "arguments": {"city": "paris"}}'
ROME = '{"name": "get_weather", "arguments": {"city": "rome"}}'


@pytest.mark.parametrize("api,streamed", [("responses", False), ("responses", True), ("chat_completions", False)])
def test_agents_sdk_runs_both_tool_calls_of_one_answer(fim_srv, monkeypatch, api, streamed):
    """Issue 44 (4): an agent whose model answers with two tool calls in one answer (the real pair's shape: two JSON
    objects in one fenced block, tests/decoding/test_structured.py REAL_PAIR_TWO_WEATHER) has both function tools run by
    the OpenAI Agents SDK, and the next turn carries both results. The tiny model is made to write the answers: each
    request's tool constraint is replaced by a grammar of the next answer (as in test_structured_server.py), so the
    server's own reading of the answer and the SDK's handling of it are what is tested."""
    import agents  # openai-agents, a test dependency
    from edgespec.decoding.constraint import Constraint
    from edgespec.server import schema

    final = "Both sunny."
    answers = [f"```json\n{PARIS}\n{ROME}\n```", final]
    monkeypatch.setattr(schema, "tool_constraint", lambda tools, choice, parallel=True: Constraint.grammar(
        "start: " + json.dumps(answers.pop(0))))
    histories: list[list[dict[str, Any]]] = []
    real_history = schema.tool_history

    def history(messages):  # what each request sent, as chat messages (the calls' arguments as objects)
        out = real_history(messages)
        histories.append(out)
        return out

    monkeypatch.setattr(schema, "tool_history", history)
    ran: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"sunny in {city}"

    agents.set_tracing_disabled(True)
    agents.set_default_openai_api(api)
    settings = agents.ModelSettings(temperature=0, max_tokens=200)
    agent = agents.Agent(name="w", instructions="be brief", model="tiny", tools=[get_weather], model_settings=settings)
    try:
        if streamed:
            async def run() -> Any:
                agents.set_default_openai_client(fim_srv.aclient(), use_for_tracing=False)
                r = agents.Runner.run_streamed(agent, "weather in paris and rome?")
                async for _ in r.stream_events():
                    pass
                return r
            result = asyncio.run(run())
        else:
            agents.set_default_openai_client(fim_srv.aclient(), use_for_tracing=False)
            result = agents.Runner.run_sync(agent, "weather in paris and rome?")
    finally:
        agents.set_default_openai_api("responses")
    assert sorted(ran) == ["paris", "rome"], ran  # the SDK ran both calls
    assert result.final_output == final and answers == []
    kinds = [item.type for item in result.new_items]
    assert kinds.count("tool_call_item") == 2 and kinds.count("tool_call_output_item") == 2, kinds
    assert len(histories) == 2  # the second request carried both calls and both results
    second = histories[1]
    calls = [c for m in second if m.get("role") == "assistant" for c in m.get("tool_calls") or []]
    assert [c["function"]["arguments"] for c in calls] == [{"city": "paris"}, {"city": "rome"}], second
    outputs = [m for m in second if m.get("role") == "tool"]
    assert sorted(m["content"] for m in outputs) == ["sunny in paris", "sunny in rome"], second
    assert {m["tool_call_id"] for m in outputs} == {c["id"] for c in calls} and len(outputs) == 2


# --------------------------------------------------------------------------------------------- no silent surprises
def test_ignored_parameters_are_reported(fim_srv, caplog):
    with caplog.at_level("WARNING", logger="edgespec.server"):
        for _ in range(2):
            r = fim_srv.post("/v1/chat/completions", {"messages": chat("x"), "max_tokens": 1, "zz_unique_param": 1})
            assert r.headers[IGNORED_HEADER] == "zz_unique_param"
    logged = [rec.getMessage() for rec in caplog.records if "zz_unique_param" in rec.getMessage()]
    assert len(logged) == 1 and IGNORED_HEADER in logged[0]  # once per parameter name
    c = fim_srv.client()
    raw = c.chat.completions.with_raw_response.create(model="m", messages=chat("x"), max_tokens=2, user="u", store=False,
                                                      metadata={"a": "b"}, service_tier="auto")
    assert raw.headers[IGNORED_HEADER] == "metadata, service_tier, store, user"
    r = fim_srv.post("/v1/chat/completions", {"messages": chat("x"), "max_tokens": 2, "stream": True, "user": "u"})
    assert r.headers[IGNORED_HEADER] == "user"
    r = fim_srv.post("/v1/chat/completions", {"messages": chat("x"), "max_tokens": 2})
    assert IGNORED_HEADER not in r.headers
    # a browser page may read it (CORS)
    r = fim_srv.post("/v1/chat/completions", {"messages": chat("x"), "max_tokens": 1, "user": "u"}, headers={"Origin": "http://localhost:3000"})
    assert IGNORED_HEADER.lower() in r.headers["access-control-expose-headers"].lower()


@pytest.mark.parametrize("body,param", [
    ({"messages": chat("x"), "stream_options": {"include_usage": True}}, "stream_options"),
    ({"messages": chat("x"), "max_tokens": 5, "max_completion_tokens": 6}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages[0].name"),
])
def test_surprises_are_400s(fim_srv, body, param):
    r = fim_srv.post("/v1/chat/completions", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_equal_max_tokens_and_max_completion_tokens_are_fine(fim_srv):
    r = fim_srv.post("/v1/chat/completions", {"messages": chat("x"), "max_tokens": 3, "max_completion_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3
