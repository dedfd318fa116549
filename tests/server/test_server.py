"""`edgespec serve`: the OpenAI-compatible server (edgespec.server), tested through the official `openai` client
(sync, async, streaming) and raw HTTP against a real uvicorn server on 127.0.0.1 (a free port), on the tiny GGUF
models.

Cancellation is asserted on the server's own records (RequestRecord: the tokens generated after the cancel, whether
the job ever started) and counters, not only on what a client saw. To hold a request in the queue
deterministically, a test occupies the engine's worker with a job of its own (`engine_busy`) and releases it.
"""

from __future__ import annotations

import asyncio
import json
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import httpx
import openai
import pytest
from click.testing import CliRunner

from edgespec.llama.binding import C as llama_c
from edgespec.cli import main
from edgespec.config import ModelSpec, SamplingParams, SpecConfig
from edgespec.runtime.engine import Engine
from edgespec.server import Settings, create_app

from support.engines import FIXED, N_CTX, load
from support.server_thread import ServerThread, chat, sse_events, wait_for
from support.tiny import token_id, write_tiny_model

CYCLE = FIXED.draft_max + 1  # the most tokens one cycle can add (every cycle drafts 4: load's spec)
LONG = 16000  # max_tokens of a generation that a test cancels long before its end (seconds of work even on a fast CPU)
MAX_QUEUE = 2
IM_END = 262
GREEDY = SamplingParams(temperature=0)
PROMPTS = ["Hello there", "Write a story about a cat", "abc abc abc", "Ünïcödé prompt: 日本語"]


# --------------------------------------------------------------------------------------------- harness


def record(srv: ServerThread, rid: str) -> Any:
    return wait_for(lambda: next((r for r in list(srv.state.records) if r.id == rid), None), what=f"the record of {rid}")


@contextmanager
def engine_busy(engine: Engine) -> Iterator[threading.Event]:
    """Occupy the engine's worker until the yielded event is set (requests queue behind it meanwhile)."""
    started, release = threading.Event(), threading.Event()
    fut = engine.run_on_worker(lambda e: (started.set(), release.wait(60)))
    assert started.wait(20)
    try:
        yield release
    finally:
        release.set()
        fut.result(20)


def metric(srv: ServerThread, name: str) -> float:
    text = httpx.get(srv.url + "/metrics").text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


# --------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def engine(tiny):
    eng = load(tiny["target"], tiny["draft"], max_queue=MAX_QUEUE)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def reference(tiny):
    """A second, fresh engine: what the server answers must equal what it answers."""
    eng = load(tiny["target"], tiny["draft"])
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def srv(engine):
    s = ServerThread(create_app(engine))
    yield s
    s.stop()


# --------------------------------------------------------------------------------------------- basics
def test_health_models_and_metrics(srv, engine):
    r = httpx.get(srv.url + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    models = srv.client().models.list()
    (card,) = models.data
    assert card.id == "tiny-target" and card.owned_by == "edgespec"
    meta = card.model_extra["meta"]
    assert meta["n_ctx"] == N_CTX and meta["n_vocab"] == engine.target.n_vocab
    assert meta["size"] == Path(engine.target.spec.path).stat().st_size
    assert meta["draft"]["id"] == "tiny-draft" and meta["drafter"] == "model+ngram"
    assert srv.client().models.retrieve("tiny-target").model_dump() == card.model_dump()  # GET /v1/models/{id}
    assert httpx.get(srv.url + "/v1/models/").json()["data"][0]["id"] == "tiny-target"  # a trailing slash: the list
    with pytest.raises(openai.NotFoundError) as ei:
        srv.client().models.retrieve("gpt-4")
    assert ei.value.body["code"] == "model_not_found"
    m = httpx.get(srv.url + "/metrics")
    assert m.status_code == 200 and m.headers["content-type"].startswith("text/plain")
    for name in ("edgespec_up 1", "edgespec_queue_length 0", 'edgespec_requests_cancelled_total{stage="running"}',
                 'edgespec_tokens_total{kind="drafted"}', 'edgespec_http_requests_total{route="/health",code="200"}'):
        assert name in m.text


def test_health_is_503_while_loading_then_200(tiny):
    gate = threading.Event()

    def factory() -> Engine:
        assert gate.wait(30)
        return load(tiny["target"], tiny["draft"])

    s = ServerThread(create_app(factory))
    try:
        r = httpx.get(s.url + "/health")
        assert r.status_code == 503
        err = r.json()["error"]
        assert err["type"] == "unavailable_error" and err["message"] == "Loading model"
        assert s.post("/v1/chat/completions", {"messages": chat("hi")}).status_code == 503
        assert httpx.get(s.url + "/v1/models").status_code == 503
        gate.set()
        wait_for(lambda: httpx.get(s.url + "/health").status_code == 200, what="the model to load")
        r = s.client().chat.completions.create(model="m", messages=chat("hi"), max_tokens=3)
        assert r.choices[0].finish_reason == "length"
    finally:
        gate.set()
        s.stop()


def test_load_failure_is_reported(tmp_path):
    failures: list[BaseException] = []
    s = ServerThread(create_app(lambda: Engine.load(str(tmp_path / "missing.gguf")), on_load_error=failures.append))
    try:
        wait_for(lambda: failures, what="the load to fail")
        r = httpx.get(s.url + "/health")
        assert r.status_code == 503 and "failed to load" in r.json()["error"]["message"]
    finally:
        s.stop()


def test_cli_serve_registered_and_load_failure_exits_1(tmp_path):
    r = CliRunner().invoke(main, ["serve", "--help"])
    assert r.exit_code == 0 and "--api-key" in r.output and "--cors-origin" in r.output and "--max-queue" in r.output
    r = CliRunner().invoke(main, ["serve", "--target", str(tmp_path / "missing.gguf"), "--no-draft", "--port", "0", "--log-level", "error"])
    assert r.exit_code == 1 and "missing.gguf" in r.output


# --------------------------------------------------------------------------------------------- identity with the engine
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_chat_equals_engine_generate(srv, reference, prompt):
    want = reference.generate(messages=chat(prompt), sampling=GREEDY, max_tokens=40)
    r = srv.client().chat.completions.create(model="tiny", messages=chat(prompt), temperature=0, max_tokens=40)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want.text
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == want.stats.n_prompt and r.usage.completion_tokens == 40
    assert r.usage.total_tokens == want.stats.n_prompt + 40
    extra = r.to_dict()
    t, es = extra["timings"], extra["edgespec"]
    assert t["predicted_n"] == 40 and t["prompt_n"] + t["cache_n"] == want.stats.n_prompt
    assert t["cache_n"] == r.usage.prompt_tokens_details.cached_tokens
    assert t["draft_n"] == es["n_drafted"] and t["draft_n_accepted"] == es["n_accepted"] and t["draft_n"] > 0
    assert {"mu", "acceptance", "acceptance_by_pos", "sources", "seconds"} <= es.keys()
    assert {"prefill", "draft", "target", "queue", "wall"} <= es["seconds"].keys()


def test_greedy_completion_equals_engine_generate(srv, reference):
    want = reference.generate("Once upon a time", sampling=GREEDY, max_tokens=30)
    r = srv.client().completions.create(model="tiny", prompt="Once upon a time", temperature=0, max_tokens=30)
    assert r.object == "text_completion" and r.choices[0].text == want.text and r.choices[0].finish_reason == "length"
    ids = reference.prompt_tokens("Once upon a time")
    r2 = srv.post("/v1/completions", {"prompt": ids, "temperature": 0, "max_tokens": 30}).json()
    assert r2["choices"][0]["text"] == want.text


def test_seeded_sampling_is_reproducible_and_equals_engine(srv, reference):
    want = reference.generate(messages=chat("seeded"), sampling=SamplingParams(temperature=1.0, seed=42), max_tokens=50)
    c = srv.client()
    a = c.chat.completions.create(model="m", messages=chat("seeded"), temperature=1.0, seed=42, max_tokens=50)
    b = c.chat.completions.create(model="m", messages=chat("seeded"), temperature=1.0, seed=42, max_tokens=50, extra_body={"speculative": False})
    assert a.choices[0].message.content == b.choices[0].message.content == want.text


def test_llama_cpp_sampling_extras_are_used(srv, reference):
    s = SamplingParams(temperature=0.7, top_k=3, top_p=0.9, min_p=0.05, repeat_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.2, seed=7)
    want = reference.generate(messages=chat("extras"), sampling=s, max_tokens=40)
    r = srv.client().chat.completions.create(
        model="m", messages=chat("extras"), temperature=0.7, top_p=0.9, presence_penalty=0.5, frequency_penalty=0.2, seed=7, max_tokens=40,
        extra_body={"top_k": 3, "min_p": 0.05, "repeat_penalty": 1.3},
    )
    assert r.choices[0].message.content == want.text


# --------------------------------------------------------------------------------------------- streaming
def test_stream_framing_raw(srv, reference):
    want = reference.generate(messages=chat("stream me"), sampling=GREEDY, max_tokens=60)
    body = {"messages": chat("stream me"), "temperature": 0, "max_tokens": 60, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read()
    text = raw.decode("utf-8")
    assert text.endswith("data: [DONE]\n\n")
    frames = [f for f in text.split("\n\n") if f]
    assert all(f.startswith("data: ") and "\n" not in f for f in frames)  # one line per event
    events = list(sse_events(text.splitlines()))
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = events[:-1]
    assert len({c["id"] for c in chunks}) == 1 and all(c["object"] == "chat.completion.chunk" for c in chunks)
    first = chunks[0]["choices"][0]
    assert first["delta"]["role"] == "assistant" and first["finish_reason"] is None
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:] if c["choices"])
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finishes == ["length"]
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 60
    assert usage_chunk["usage"]["prompt_tokens"] == want.stats.n_prompt
    assert "cached_tokens" in usage_chunk["usage"]["prompt_tokens_details"]
    assert all(c["usage"] is None for c in chunks[:-1])
    finish_chunk = chunks[-2]
    assert finish_chunk["choices"][0]["finish_reason"] == "length" and finish_chunk["choices"][0]["delta"] == {}
    assert finish_chunk["timings"]["predicted_n"] == 60 and "mu" in finish_chunk["edgespec"]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == want.text


def test_stream_completions_raw(srv, reference):
    want = reference.generate("raw stream", sampling=GREEDY, max_tokens=20)
    with httpx.stream("POST", srv.url + "/v1/completions", json={"prompt": "raw stream", "temperature": 0, "max_tokens": 20, "stream": True}, timeout=30) as r:
        events = list(sse_events(r.iter_lines()))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]] == ["length"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == want.text
    assert chunks[-1]["usage"]["completion_tokens"] == 20 and chunks[-1]["timings"]["predicted_n"] == 20


def test_stream_with_openai_client_sync_and_async(srv, reference):
    want = reference.generate(messages=chat("client stream"), sampling=GREEDY, max_tokens=50)
    stream = srv.client().chat.completions.create(
        model="m", messages=chat("client stream"), temperature=0, max_tokens=50, stream=True, stream_options={"include_usage": True}
    )
    parts, finishes, usage = [], [], None
    for ch in stream:
        if ch.choices:
            parts.append(ch.choices[0].delta.content or "")
            if ch.choices[0].finish_reason:
                finishes.append(ch.choices[0].finish_reason)
        if ch.usage is not None:
            usage = ch.usage
    assert "".join(parts) == want.text and finishes == ["length"] and usage.completion_tokens == 50

    async def run() -> str:
        client = srv.aclient()
        s = await client.chat.completions.create(model="m", messages=chat("client stream"), temperature=0, max_tokens=50, stream=True)
        out = []
        async for ch in s:
            out.append(ch.choices[0].delta.content or "")
        r = await client.chat.completions.create(model="m", messages=chat("client stream"), temperature=0, max_tokens=50)
        await client.close()
        assert r.choices[0].message.content == want.text
        return "".join(out)

    assert asyncio.run(run()) == want.text


def test_stop_and_length_finish_reasons(srv, reference):
    full = reference.generate(messages=chat("stop here"), sampling=GREEDY, max_tokens=80).text
    stop = full[20:23]
    cut = full[: full.find(stop)]
    c = srv.client()
    r = c.chat.completions.create(model="m", messages=chat("stop here"), temperature=0, max_tokens=80, stop=[stop, "never-seen"])
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content == cut
    s = c.chat.completions.create(model="m", messages=chat("stop here"), temperature=0, max_tokens=80, stop=stop, stream=True)
    chunks = list(s)
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices[0].finish_reason] == ["stop"]
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == cut
    r = c.chat.completions.create(model="m", messages=chat("stop here"), temperature=0, max_completion_tokens=7)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 7 and r.choices[0].message.content == full[:7]


@pytest.fixture(scope="module")
def eos_srv(tmp_path_factory):
    """A tiny target that often emits <|im_end|>, so answers end like a chat model's."""
    d = tmp_path_factory.mktemp("eos")
    hot = tuple(token_id(c) for c in "abc ") + (IM_END,)
    eng = load(write_tiny_model(d / "eos-target.gguf", seed=1, hot_tokens=hot, name="eos-target"))
    s = ServerThread(create_app(eng))
    yield s, eng
    s.stop()
    eng.close()


def test_end_token_finishes_with_stop(eos_srv):
    s, eng = eos_srv
    for seed in range(20):
        want = eng.generate(messages=chat("end please"), sampling=SamplingParams(temperature=1.0, seed=seed), max_tokens=200)
        if want.finish_reason == "eos":
            break
    assert want.finish_reason == "eos"
    r = s.client().chat.completions.create(model="m", messages=chat("end please"), seed=seed, max_tokens=200)
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content == want.text
    assert "<|im_end|>" not in r.choices[0].message.content


@pytest.fixture(scope="module")
def utf8_srv(tmp_path_factory):
    """A target whose likely tokens are the bytes of é and è (0xC3 0xA9 / 0xA8): every such character spans two
    tokens, often two speculative cycles."""
    d = tmp_path_factory.mktemp("utf8")
    path = write_tiny_model(d / "utf8.gguf", seed=9, hot_tokens=(0xC3, 0xA9, 0xA8, 0x20, 0x61), hot_scale=0.5, name="tiny-utf8")
    eng = load(path, drafter="ngram")
    s = ServerThread(create_app(eng))
    yield s, eng
    s.stop()
    eng.close()


@pytest.mark.parametrize("speculative", [True, False])
def test_utf8_never_split_inside_a_delta(utf8_srv, speculative):
    s, eng = utf8_srv
    want = eng.generate(messages=chat("héllo"), sampling=SamplingParams(temperature=1.0, seed=1), max_tokens=120, speculative=speculative)
    whole = b"".join(eng.target.token_bytes(t) for t in want.token_ids).decode("utf-8", "replace")
    assert sum(whole.count(ch) for ch in "éè") >= 3  # the test means something: multi-byte characters were generated
    body = {"messages": chat("héllo"), "temperature": 1.0, "seed": 1, "max_tokens": 120, "stream": True, "speculative": speculative}
    with httpx.stream("POST", s.url + "/v1/chat/completions", json=body, timeout=30) as r:
        raw = r.read()
    deltas = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            obj = json.loads(line[6:].decode("utf-8", "strict"))  # every event is valid UTF-8 by itself
            if obj["choices"]:
                deltas.append(obj["choices"][0]["delta"].get("content", ""))
    # Decoding the bytes per delta would turn each split character into U+FFFD: the joined deltas would differ.
    assert "".join(deltas) == whole
    assert len([d for d in deltas if d]) > 10


def test_show_draft_marks(srv):
    body = {"messages": chat("abc abc abc"), "temperature": 0, "max_tokens": 120, "stream": True, "show_draft": True}
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=30) as r:
        chunks = [c for c in sse_events(r.iter_lines()) if c != "[DONE]"]
    content = [c["choices"][0] for c in chunks if c["choices"][0]["delta"].get("content")]
    assert all(isinstance(c["from_draft"], bool) for c in content)
    accepted = chunks[-1]["timings"]["draft_n_accepted"]
    assert accepted > 0 and any(c["from_draft"] for c in content)
    text = "".join(c["delta"]["content"] for c in content)
    drafted_text = "".join(c["delta"]["content"] for c in content if c["from_draft"])
    spans = chunks[-1]["edgespec"]["draft_spans"]
    assert "".join(text[a:b] for a, b in spans) == drafted_text
    r = srv.post("/v1/chat/completions", {"messages": chat("abc abc abc"), "temperature": 0, "max_tokens": 120, "show_draft": True}).json()
    spans = r["edgespec"]["draft_spans"]
    assert spans and all(0 <= a < b <= len(r["choices"][0]["message"]["content"]) for a, b in spans)
    assert all(spans[i][1] < spans[i + 1][0] for i in range(len(spans) - 1))


def test_speculation_switch_and_draft_limit(srv, engine, reference):
    want = reference.generate(messages=chat("switch"), sampling=GREEDY, max_tokens=40).text
    for extra in ({"speculative": False}, {"draft_max": 0}):
        r = srv.post("/v1/chat/completions", {"messages": chat("switch"), "temperature": 0, "max_tokens": 40, **extra}).json()
        assert r["choices"][0]["message"]["content"] == want
        assert r["timings"]["draft_n"] == 0 and r["edgespec"]["drafter"] == "none"
    r = srv.post("/v1/chat/completions", {"messages": chat("switch"), "temperature": 0, "max_tokens": 40, "draft_max": 8}).json()
    assert r["choices"][0]["message"]["content"] == want and r["timings"]["draft_n"] > 0
    r = srv.post("/v1/chat/completions", {"messages": chat("switch"), "temperature": 0, "max_tokens": 40, "draft_max": 2})
    body = r.json()  # a per-generation SpecConfig: the limit is honoured
    assert body["choices"][0]["message"]["content"] == want and len(body["edgespec"]["drafted_by_pos"]) <= 2


# --------------------------------------------------------------------------------------------- cancellation
def test_closing_a_stream_cancels_the_running_job_within_one_cycle(srv, engine, reference):
    before = metric(srv, 'edgespec_requests_cancelled_total{stage="running"}')
    body = {"messages": chat("a long story"), "temperature": 0, "max_tokens": LONG, "stream": True}
    with engine_busy(engine) as release:
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=30) as r:
            events = sse_events(r.iter_lines())
            role = next(events)  # sent while the request waits in the queue
            assert role["choices"][0]["delta"]["role"] == "assistant"
            release.set()
            first = next(events)
            assert first["choices"][0]["delta"]["content"]
        # leaving the block closes the connection mid-stream
    rec = record(srv, role["id"])
    assert rec.client_left and rec.started and rec.finish_reason == "cancelled"
    assert rec.overrun <= CYCLE, f"{rec.overrun} tokens after the cancel"
    assert 0 < rec.n_generated < LONG
    assert metric(srv, 'edgespec_requests_cancelled_total{stage="running"}') == before + 1
    assert metric(srv, "edgespec_cancel_overrun_tokens_max") <= CYCLE
    # the caches stay consistent: the next answer equals a fresh engine's
    want = reference.generate(messages=chat("a long story"), sampling=GREEDY, max_tokens=60).text
    assert srv.client().chat.completions.create(model="m", messages=chat("a long story"), temperature=0, max_tokens=60).choices[0].message.content == want


def test_closing_an_openai_stream_cancels(srv, reference):
    s = srv.client().chat.completions.create(model="m", messages=chat("openai close"), temperature=0, max_tokens=LONG, stream=True)
    first = next(iter(s))
    s.close()
    rec = record(srv, first.id)
    assert rec.client_left and rec.finish_reason == "cancelled" and rec.overrun <= CYCLE and rec.n_generated < LONG
    want = reference.generate(messages=chat("openai close"), sampling=GREEDY, max_tokens=30).text
    assert srv.client().chat.completions.create(model="m", messages=chat("openai close"), temperature=0, max_tokens=30).choices[0].message.content == want


def test_a_queued_request_whose_client_left_never_starts(srv, engine):
    before = metric(srv, 'edgespec_requests_cancelled_total{stage="queued"}')
    body = {"messages": chat("queued then gone"), "temperature": 0, "max_tokens": LONG, "stream": True}
    with engine_busy(engine):
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=30) as r:
            events = sse_events(r.iter_lines())
            role = next(events)
            assert engine.pending == 1
        wait_for(lambda: engine.pending == 0, what="the queued job to be cancelled")  # cancelled jobs do not count
    rec = record(srv, role["id"])
    assert rec.client_left and rec.started is False and rec.n_generated == 0 and rec.finish_reason == "cancelled"
    assert metric(srv, 'edgespec_requests_cancelled_total{stage="queued"}') == before + 1


def test_leaving_during_prefill_stops_between_prefill_chunks(srv, engine, reference, monkeypatch):
    prompt = "long prompt " + "abcdefgh " * 1500  # ~13.5k tokens: ~27 prefill chunks of 512
    n_prompt = len(engine.prompt_tokens(messages=chat(prompt)))
    body = {"messages": chat(prompt), "temperature": 0, "max_tokens": 10, "stream": True}
    engine.reset_caches()
    # The engine holds after its third prefill chunk until the server has cancelled the job: the client leaves in
    # the middle of the prefill on any machine, however fast or busy.
    C = llama_c
    real_decode, decodes = C.llama_decode, [0]
    held, go = threading.Event(), threading.Event()

    def decode_then_hold(ctx: Any, batch: Any) -> Any:
        out = real_decode(ctx, batch)
        if threading.current_thread() is engine._worker.thread:
            decodes[0] += 1
            if decodes[0] == 3:
                held.set()
                go.wait(30)
        return out

    monkeypatch.setattr(C, "llama_decode", decode_then_hold)
    try:
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=30) as r:
            events = sse_events(r.iter_lines())  # (dropping the iterator would close the connection)
            role = next(events)
            assert held.wait(20), "the prefill never got to its third chunk"
            job = engine._worker.running()[0]
            in_slot = engine.target.slot(job.slot)
            assert 2 * engine.target.n_batch <= in_slot.n_past < n_prompt // 2
        # the connection closes while the prompt is processed: the server cancels the job, then the engine goes on
        wait_for(lambda: any(j.cancel_event.is_set() for j in engine._worker.running()), what="the server to cancel")
    finally:
        go.set()
        monkeypatch.setattr(C, "llama_decode", real_decode)
    rec = record(srv, role["id"])
    assert rec.client_left and rec.started and rec.finish_reason == "cancelled" and rec.n_generated == 0
    assert in_slot.n_past < n_prompt - 1  # stopped between chunks, not after the whole prompt
    want = reference.generate(messages=chat("after a cut prefill"), sampling=GREEDY, max_tokens=30).text
    got = srv.client().chat.completions.create(model="m", messages=chat("after a cut prefill"), temperature=0, max_tokens=30)
    assert got.choices[0].message.content == want


def test_a_non_streaming_client_timeout_cancels(srv, engine, reference):
    c = srv.client(timeout=1.0)
    n_records = len(srv.state.records)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            c.chat.completions.create(model="m", messages=chat("timeout me"), temperature=0, max_tokens=LONG)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    with engine_busy(engine):
        t = threading.Thread(target=call)
        t.start()
        wait_for(lambda: engine.pending == 1, what="the request to queue")
    # released: the job runs; the client gives up after 1 s and the server cancels
    t.join(30)
    assert errors and isinstance(errors[0], openai.APITimeoutError)
    rec = wait_for(lambda: len(srv.state.records) > n_records and srv.state.records[-1], what="the record")
    assert rec.kind == "chat" and not rec.stream
    assert rec.client_left and rec.finish_reason == "cancelled" and rec.overrun <= CYCLE and rec.n_generated < LONG
    want = reference.generate(messages=chat("timeout me"), sampling=GREEDY, max_tokens=40).text
    assert srv.client().chat.completions.create(model="m", messages=chat("timeout me"), temperature=0, max_tokens=40).choices[0].message.content == want


def test_two_concurrent_streams_equal_their_sequential_output(srv):
    reqs = [("first prompt", 11), ("second, different prompt", 12)]

    async def one(client: openai.AsyncOpenAI, prompt: str, seed: int) -> str:
        s = await client.chat.completions.create(model="m", messages=chat(prompt), temperature=1.0, seed=seed, max_tokens=150, stream=True)
        return "".join([ch.choices[0].delta.content or "" async for ch in s])

    async def run() -> tuple[list[str], list[str]]:
        client = srv.aclient()
        seq = [await one(client, p, s) for p, s in reqs]
        conc = await asyncio.gather(*(one(client, p, s) for p, s in reqs))
        await client.close()
        return seq, list(conc)

    seq, conc = asyncio.run(run())
    assert seq == conc and seq[0] != seq[1]


def test_full_queue_answers_503_with_retry_after(srv, engine):
    body = {"messages": chat("queue"), "max_tokens": 5, "stream": True}
    before = metric(srv, 'edgespec_requests_rejected_total{reason="queue_full"}') if "queue_full" in httpx.get(srv.url + "/metrics").text else 0
    with engine_busy(engine):
        with httpx.Client(timeout=30) as a, httpx.Client(timeout=30) as b:
            streams = [a.stream("POST", srv.url + "/v1/chat/completions", json=body), b.stream("POST", srv.url + "/v1/chat/completions", json=body)]
            lines = [s.__enter__().iter_lines() for s in streams]  # (dropping an iterator would close its connection)
            for it in lines:
                next(it)  # both are queued (their role chunk came)
            assert engine.pending == MAX_QUEUE
            r = srv.post("/v1/chat/completions", {"messages": chat("one too many")})
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert r.json()["error"]["code"] == "queue_full"
            for s in streams:
                s.__exit__(None, None, None)
    assert metric(srv, 'edgespec_requests_rejected_total{reason="queue_full"}') == before + 1
    assert srv.client().chat.completions.create(model="m", messages=chat("after"), max_tokens=3).choices[0].finish_reason == "length"


def test_shutdown_ends_streams_with_an_error_event(engine):
    s = ServerThread(create_app(engine))
    try:
        body = {"messages": chat("until shutdown"), "temperature": 0, "max_tokens": LONG, "stream": True}
        with httpx.stream("POST", s.url + "/v1/chat/completions", json=body, timeout=30) as r:
            events = sse_events(r.iter_lines())
            role = next(events)
            assert next(events)["choices"][0]["delta"]["content"]
            s.state.begin_shutdown()  # what `edgespec serve` does on Ctrl-C / SIGTERM, before uvicorn stops
            rest = list(events)
        assert rest[-1]["error"]["code"] == "shutting_down" and "[DONE]" not in rest
        rec = record(s, role["id"])
        assert not rec.client_left and rec.finish_reason == "cancelled" and rec.n_generated < LONG
        r = s.post("/v1/chat/completions", {"messages": chat("too late")})
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
        assert httpx.get(s.url + "/health").status_code == 503
    finally:
        s.stop()


# --------------------------------------------------------------------------------------------- KV reuse, context
def test_multi_turn_conversation_decodes_only_new_tokens(srv):
    c = srv.client()
    msgs = chat("first question", system="be brief")
    r1 = c.chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=30)
    # another conversation in between: the first one's cache comes back from its host-memory snapshot
    c.chat.completions.create(model="m", messages=chat("something else entirely, long enough to move the cache " * 3), temperature=0, max_tokens=10)
    msgs2 = msgs + [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "second"}]
    r2 = c.chat.completions.create(model="m", messages=msgs2, temperature=0, max_tokens=10)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    n_new = r2.usage.prompt_tokens - r1.usage.prompt_tokens - r1.usage.completion_tokens
    assert cached >= r1.usage.prompt_tokens + r1.usage.completion_tokens - 1
    assert r2.to_dict()["timings"]["prompt_n"] <= n_new + 1


def test_context_overflow_is_a_400_with_both_numbers(srv, engine):
    prompt = "ab" * (N_CTX // 2 + 50)
    n = len(engine.prompt_tokens(messages=chat(prompt)))
    assert n > N_CTX
    for stream in (False, True):
        r = srv.post("/v1/chat/completions", {"messages": chat(prompt), "stream": stream})
        assert r.status_code == 400 and r.headers["content-type"] == "application/json"
        err = r.json()["error"]
        assert err["code"] == "context_length_exceeded" and f"{n} tokens" in err["message"] and str(N_CTX) in err["message"]
        assert err["n_prompt_tokens"] == n and err["n_ctx"] == N_CTX
    with pytest.raises(openai.BadRequestError, match="context holds"):
        srv.client().chat.completions.create(model="m", messages=chat(prompt))


# --------------------------------------------------------------------------------------------- bad input
BAD = [
    ({"messages": "hi"}, 400, "messages"),
    ({}, 400, "messages"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, 400, "messages[0].content"),
    ({"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "messages[0].content[0]"),
    ({"messages": [{"role": "function", "content": "x", "name": "f"}]}, 400, "messages[0]"),
    ({"messages": chat("x"), "temperature": "hot"}, 400, "temperature"),
    ({"messages": chat("x"), "temperature": 5}, 400, "temperature"),
    ({"messages": chat("x"), "top_p": 1.5}, 400, "top_p"),
    ({"messages": chat("x"), "max_tokens": 0}, 400, "max_tokens"),
    ({"messages": chat("x"), "max_tokens": 2.5}, 400, "max_tokens"),
    ({"messages": chat("x"), "max_tokens": True}, 400, "max_tokens"),
    ({"messages": chat("x"), "seed": -5}, 400, "seed"),
    ({"messages": chat("x"), "seed": 2**64}, 400, "seed"),
    ({"messages": chat("x"), "stop": [1, 2]}, 400, "stop"),
    ({"messages": chat("x"), "stream": "yes"}, 400, "stream"),
    ({"messages": chat("x"), "presence_penalty": 3}, 400, "presence_penalty"),
    ({"messages": chat("x"), "top_k": "many"}, 400, "top_k"),
    ({"messages": chat("x"), "min_p": 1}, 400, "min_p"),
    ({"messages": chat("x"), "repeat_penalty": 0}, 400, "repeat_penalty"),
    ({"messages": chat("x"), "repeat_penalty": 1e-9}, 400, "repeat_penalty"),
    ({"messages": chat("x"), "temperature": 10**400}, 400, "temperature"),  # past float's range: not a 500
    ({"messages": chat("x"), "frequency_penalty": -(10**400)}, 400, "frequency_penalty"),
    ({"messages": chat("x"), "stream": True, "stream_options": {"include_usage": "yes"}}, 400, "stream_options.include_usage"),
    ({"messages": chat("x"), "n": 0}, 400, "n"),
    ({"messages": chat("x"), "speculative": "no"}, 400, "speculative"),
    ({"messages": chat("x"), "draft_max": 99}, 400, "draft_max"),
    ({"messages": chat("x"), "n": 2}, 400, "n"),
    ({"messages": chat("x"), "tools": [{"type": "function", "function": {"name": "no spaces allowed"}}]}, 400, "tools"),
    ({"messages": chat("x"), "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "maybe"}, 400, "tool_choice"),
    ({"messages": chat("x"), "logprobs": "yes"}, 400, "logprobs"),
    ({"messages": chat("x"), "response_format": {"type": "xml"}}, 400, "response_format"),
    ({"messages": chat("x"), "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}}, 400, "response_format"),
    ({"messages": chat("x"), "logit_bias": {"5": 10}}, 400, "logit_bias"),
    ({"messages": chat("x"), "grammar": "root ::= 'a'"}, 400, "grammar"),
]


@pytest.mark.parametrize("body,status,param", BAD, ids=[f"{i}-{p}" for i, (_, _, p) in enumerate(BAD)])
def test_bad_chat_requests_get_openai_shaped_errors(srv, body, status, param):
    r = srv.post("/v1/chat/completions", body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]


def test_bad_bodies_paths_and_prompts(srv, engine):
    url = srv.url + "/v1/chat/completions"
    cases = [
        (dict(content=b'{"messages": [', headers={"content-type": "application/json"}), 400, "not valid JSON"),
        (dict(content=b"[1, 2]", headers={"content-type": "application/json"}), 400, "JSON object"),
        (dict(content=b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', headers={"content-type": "application/json"}), 400, "NaN"),
        (dict(content=b"\xff\xfe", headers={"content-type": "application/json"}), 400, "UTF-8"),
        (dict(content=b"", headers={"content-type": "application/json"}), 400, "empty"),
        (dict(content=b'{"messages": []}', headers={"content-type": "text/plain"}), 415, "Content-Type"),
        (dict(content=b"messages=hi", headers={"content-type": "application/x-www-form-urlencoded"}), 415, "Content-Type"),
        (dict(content=b"[" * 100000 + b"]" * 100000, headers={"content-type": "application/json"}), 400, "nested"),
    ]
    for kw, status, words in cases:
        r = httpx.post(url, timeout=30, **kw)
        assert r.status_code == status and words in r.json()["error"]["message"], (kw, r.text)
    r = httpx.get(srv.url + "/v2/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.get(url)
    assert r.status_code == 405 and "error" in r.json()
    for prompt, words in ([["a", "b"], "several prompts"], [[engine.target.n_vocab + 5], "outside the vocabulary"], ["", "empty"], [5, "prompt"]):
        r = srv.post("/v1/completions", {"prompt": prompt})
        assert r.status_code == 400 and words in r.json()["error"]["message"], (prompt, r.text)
    # text parts are joined; a lone surrogate from a JSON escape does not crash anything
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    r = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": parts}], "max_tokens": 3})
    assert r.status_code == 200
    r = httpx.post(url, content=b'{"messages": [{"role": "user", "content": "\\ud800 x"}], "max_tokens": 3}', headers={"content-type": "application/json"})
    assert r.status_code == 200
    assert httpx.get(srv.url + "/health").json() == {"status": "ok"}


# --------------------------------------------------------------------------------------------- security
@pytest.fixture(scope="module")
def locked_srv(engine):
    s = ServerThread(create_app(engine, Settings(api_key="sekret", cors_origins=("https://app.example",), max_body_bytes=4096)))
    yield s
    s.stop()


def test_api_key(locked_srv):
    s = locked_srv
    assert httpx.get(s.url + "/health").status_code == 200  # open without the key
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Basic sekret"}, {"authorization": "sekret"}):
        for path in ("/v1/models", "/metrics"):
            r = httpx.get(s.url + path, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
    r = httpx.post(s.url + "/v1/chat/completions", json={"messages": chat("x")})
    assert r.status_code == 401
    with pytest.raises(openai.AuthenticationError):
        s.client(api_key="wrong").chat.completions.create(model="m", messages=chat("x"), max_tokens=2)
    ok = s.client(api_key="sekret").chat.completions.create(model="m", messages=chat("x"), max_tokens=2)
    assert ok.choices[0].finish_reason == "length"
    assert httpx.get(s.url + "/v1/models", headers={"authorization": "Bearer sekret"}).status_code == 200


def test_request_body_limit(locked_srv):
    r = httpx.post(locked_srv.url + "/v1/chat/completions", json={"messages": chat("x" * 5000)}, headers={"authorization": "Bearer sekret"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def _preflight(url: str, origin: str) -> httpx.Response:
    # the headers the OpenAI JS SDK sends with every request, as a browser page's preflight names them
    return httpx.options(url + "/v1/chat/completions", headers={
        "origin": origin, "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type, x-stainless-os, x-stainless-retry-count"})


def test_cors_allows_only_local_origins_unless_widened(srv, locked_srv):
    for origin in ("http://localhost:5173", "http://127.0.0.1:8000", "http://[::1]:3000", "https://localhost"):
        r = _preflight(srv.url, origin)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
        allowed = r.headers["access-control-allow-headers"].lower()
        assert "authorization" in allowed and "x-stainless-retry-count" in allowed
        assert httpx.get(srv.url + "/v1/models", headers={"origin": origin}).headers["access-control-allow-origin"] == origin
    for origin in ("https://evil.example", "http://localhost.evil.example", "https://app.example"):
        r = _preflight(srv.url, origin)
        assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
        assert "access-control-allow-origin" not in httpx.get(srv.url + "/v1/models", headers={"origin": origin}).headers
    # --cors-origin widens it; preflights need no API key; the 401 carries CORS headers so a page can read it
    r = _preflight(locked_srv.url, "https://app.example")
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
    assert _preflight(locked_srv.url, "https://evil.example").status_code == 400
    r = httpx.get(locked_srv.url + "/v1/models", headers={"origin": "https://app.example"})
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == "https://app.example"


def test_host_header_must_name_this_machine(srv):
    r = httpx.get(srv.url + "/v1/models", headers={"host": "evil.example"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host"
    for host in (f"localhost:{srv.port}", f"127.0.0.1:{srv.port}", "localhost"):
        assert httpx.get(srv.url + "/v1/models", headers={"host": host}).status_code == 200


# --------------------------------------------------------------------------------------------- the real pair
@pytest.mark.real
@pytest.mark.slow
def test_real_pair_through_the_server(real_pair):
    # no cost measurements (fixed K needs none; they take minutes on a busy CPU): this test is about the HTTP layer
    target, draft = real_pair
    spec = SpecConfig(draft_max=4, adaptive=False)
    with Engine.load(ModelSpec(str(target), n_ctx=1024), ModelSpec(str(draft), n_ctx=1024), spec=spec, calibrate_costs=False) as eng:
        s = ServerThread(create_app(eng))
        try:
            msgs = chat("Write a Python function that adds two numbers.")
            want = eng.generate(messages=msgs, sampling=GREEDY, max_tokens=24)
            r = s.client().chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=24)
            assert r.choices[0].message.content == want.text
            t = r.to_dict()["timings"]
            assert t["predicted_n"] == 24 and t["draft_n"] > 0 and t["cache_n"] > 0  # the prompt came from the KV cache
            stream = s.client().chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=24, stream=True)
            assert "".join(ch.choices[0].delta.content or "" for ch in stream) == want.text
        finally:
            s.stop()
