"""What the editor plugins (llama.vim, llama.vscode) and the official `ollama` Python client send, against a real
uvicorn server on the tiny FIM pair: the plugins' own /infill bodies (tests/support/editor_requests.py, copied from
their published sources), llama-server's `samplers`, `n_predict: 0`, `response_fields`, `n_indent`; and every Ollama
route through `ollama.Client` (`list`, `show`, `ps`, `chat`, `generate`, logprobs, `context`) plus /api/version.

Sampled answers are compared with a second engine given the same seed and the settings the chain maps to (the
server must answer what the library answers)."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import httpx
import ollama
import pytest

from edgespec.config import ModelSpec, SamplingParams, SpecConfig
from edgespec.runtime.engine import Engine
from edgespec.errors import ConfigError
from edgespec.prompts.infill import indent_cut
from edgespec.server import create_app
from edgespec.server.responses import IGNORED_HEADER
from edgespec.server.routes_llamacpp import pick_fields
from edgespec.server.routes_ollama import OLLAMA_VERSION
from edgespec.server.samplers import ChainError, apply_chain, parse_names

from support.editor_requests import VIM_RESPONSE_FIELDS, vim_fim, vim_inst, vim_warmup, vscode_fim, vscode_warmup
from support.server_thread import ServerThread, chat, sse_events
from support.tiny import token_id, write_tiny_model

GREEDY = SamplingParams(temperature=0)
BASE = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.1)
EXTRA = [{"filename": "util.py", "text": "def helper(x):\n    return x + 1\n"}]


@pytest.fixture(scope="module")
def nl_path(tmp_path_factory):
    """A FIM model that writes newlines and spaces often (the tiny pair never does): n_indent has lines to cut."""
    hot = tuple(token_id(ch) for ch in "ab\n ")
    return write_tiny_model(tmp_path_factory.mktemp("nl") / "nl.gguf", seed=3, hot_tokens=hot, name="tiny-nl", fim=True)


def _nl_engine(path):
    return Engine.load(ModelSpec(str(path), n_ctx=2048, n_threads=1), calibrate_costs=False, drafter="ngram",
                       spec=SpecConfig(draft_max=4, adaptive=False))


@pytest.fixture(scope="module")
def nl(nl_path):
    """(server, reference engine) over the newline model."""
    eng, ref = _nl_engine(nl_path), _nl_engine(nl_path)
    s = ServerThread(create_app(eng))
    yield s, ref
    s.stop()
    eng.close()
    ref.close()


# --------------------------------------------------------------------------------------------- the chain, pure
def test_the_plugins_chains_map_onto_the_engine():
    s = apply_chain(["top_k", "top_p", "infill"], BASE)
    assert (s.top_k, s.top_p, s.min_p, s.temperature, s.repeat_penalty, s.infill) == (40, 0.9, 0.0, 1.0, 1.0, True)
    s = apply_chain([], BASE)  # nothing in the chain: llama-server samples the plain distribution
    assert (s.top_k, s.top_p, s.min_p, s.temperature, s.repeat_penalty, s.infill) == (0, 1.0, 0.0, 1.0, 1.0, False)
    s = apply_chain(["temperature"], BASE)
    assert (s.top_k, s.top_p, s.min_p, s.temperature) == (0, 1.0, 0.0, 0.8)
    # llama.vim's instruct chain: min_p on the untempered distribution = min_p ** (1/T) after the temperature
    s = apply_chain(["min_p", "temperature"], SamplingParams(temperature=0.1, min_p=0.1))
    assert s.temperature == 0.1 and math.isclose(s.min_p, 1e-10, rel_tol=1e-9)
    # llama-server's default order, and letters
    s = apply_chain(parse_names("ekpmt"), replace_t(BASE, 1.0))
    assert (s.top_k, s.top_p, s.min_p, s.repeat_penalty) == (40, 0.9, 0.05, 1.1)
    assert apply_chain(["dry", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"], replace_t(BASE, 0.0)).temperature == 0.0
    # infill last (letters too), after a temperature, or before samplers left neutral
    assert apply_chain(parse_names("kpi"), BASE).infill and apply_chain(["temperature", "infill"], BASE).infill
    assert apply_chain(["infill", "min_p"], SamplingParams(min_p=0.0)).infill  # min_p 0 does nothing there


def replace_t(s: SamplingParams, t: float) -> SamplingParams:
    from dataclasses import replace

    return replace(s, temperature=t)


@pytest.mark.parametrize("chain,names", [
    (["top_p", "top_k"], ("'top_p' before 'top_k'",)),
    (["top_k", "top_p", "temperature"], ("'top_p' before 'temperature'",)),
    (["min_p", "top_p"], ("'min_p' before 'top_p'",)),
    (["top_k", "penalties"], ("'top_k' before 'penalties'",)),
    (["top_p", "top_p"], ("'top_p' is listed twice",)),
    (["infill", "top_k"], ("'infill' before 'top_k'",)),
    (["top_k", "infill", "temperature"], ("'infill' before 'temperature'",)),
    (["infill", "infill"], ("'infill' is listed twice",)),
    (["mirostat"], ("unknown sampler 'mirostat'",)),
    ("kq", ("unknown sampler letter 'q'",)),
])
def test_a_chain_the_engine_cannot_honour_names_the_sampler(chain, names):
    with pytest.raises(ChainError) as e:
        apply_chain(parse_names(chain), BASE)
    assert all(n in str(e.value) for n in names), str(e.value)


def test_pick_fields_and_indent_cut():
    obj = {"content": "x", "timings": {"prompt_n": 3}, "stop": True}
    assert pick_fields(obj, ("content", "timings/prompt_n", "timings/nope", "")) == {"content": "x", "timings/prompt_n": 3}
    assert pick_fields(obj, ("",)) == {}
    assert indent_cut("abc\n    d\n  e", 4) == 12  # the line indented by 2 < 4: cut after its indentation
    assert indent_cut("abc\n    d\n  ", 4) is None  # that line has nothing yet
    assert indent_cut("x\n\ny", 1) == 2  # an empty line stops too, as llama-server does
    assert indent_cut("first line only", 8) is None and indent_cut("a\nb", 0) is None


# --------------------------------------------------------------------------------------------- the plugins' bodies
def test_llama_vim_completion_answers_only_the_fields_it_asks(fim_srv):
    body = vim_fim("def f(a):\n    ", "\n    return a\n", "ret", EXTRA, indent=4)
    r = fim_srv.post("/infill", body)
    assert r.status_code == 200, r.text
    j = r.json()
    assert set(j) == set(VIM_RESPONSE_FIELDS)  # flattened keys as llama-server writes them: what llama.vim reads
    assert j["timings/prompt_n"] > 0 and j["truncated"] is False and isinstance(j["content"], str)
    assert r.headers[IGNORED_HEADER] == "t_max_prompt_ms"  # the infill sampler is applied


def test_an_editors_completion_does_not_wait_behind_a_long_generation(fim_srv, fim_engine):
    """llama.vim's /infill (n_predict 128) posted while a 1,500-token generation holds the engine: it runs at that
    generation's next cycle boundary (GenerationRequest(short=True), test_short_first.py) and answers before it
    ends, instead of after."""
    import threading

    from edgespec.runtime.request import GenerationRequest

    go = threading.Event()
    long = fim_engine.start(GenerationRequest(prompt="def long(x):", sampling=GREEDY, max_tokens=1500,
                                          on_prefill=lambda d, t: go.wait(30)))  # holds the worker until `go`
    answer: list[httpx.Response] = []
    t = threading.Thread(target=lambda: answer.append(fim_srv.post("/infill", vim_fim("def f(a):\n    ", "\n", "", EXTRA, indent=4))))
    t.start()
    deadline = time.monotonic() + 30
    while fim_engine.pending < 1 and time.monotonic() < deadline:  # the infill is queued behind the held generation
        time.sleep(0.01)
    go.set()
    t.join(60)
    done_before = long.done
    assert answer and answer[0].status_code == 200, answer
    assert not done_before  # answered while the long generation still had tokens to go
    assert len(long.result(timeout=120).token_ids) == 1500


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_llama_vim_seeded_answer_is_the_engines_with_the_mapped_chain_and_n_indent(nl, seed):
    fim_srv, fim_reference = nl
    prefix, suffix = "if x:\n  ", "\n"
    # without the chain's infill step, which keeps this model on "b" (no lines to cut: see the next test)
    body = {**vim_fim(prefix, suffix, "", [], indent=2, n_predict=64, t_max_predict_ms=0), "seed": seed, "samplers": ["top_k", "top_p"]}
    got = fim_srv.post("/infill", {**body, "response_fields": []}).json()  # [] = every field
    want = fim_reference.infill(prefix, suffix, max_tokens=64, sampling=SamplingParams(temperature=1.0, top_k=40, top_p=0.9, seed=seed)).text
    cut = indent_cut(want, 2)
    assert cut is not None and got["content"] == want[:cut] and got["stop_type"] == "limit"
    # streamed: the same cut text, nothing past it
    events = list(sse_events(fim_srv.post("/infill", {**body, "stream": True, "response_fields": []}).iter_lines()))
    assert "".join(e["content"] for e in events) == want[:cut] and events[-1]["stop_type"] == "limit"
    # without n_indent: the whole completion
    assert fim_srv.post("/infill", {**body, "n_indent": 0, "response_fields": ["content"]}).json() == {"content": want}
    assert fim_srv.post("/infill", {**body, "n_indent": -1}).json()["error"]["param"] == "n_indent"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_plugins_chain_runs_the_infill_sampler(nl, seed):
    """llama.vim's body as sent (samplers ["top_k", "top_p", "infill"]): the answer is the engine's with infill on,
    which is not the answer without it, streamed or not, and nothing is reported ignored for it."""
    fim_srv, fim_reference = nl
    prefix, suffix = "if x:\n  ", "\n"
    body = {**vim_fim(prefix, suffix, "", [], indent=0, n_predict=48, t_max_predict_ms=0), "seed": seed, "response_fields": []}
    assert body["samplers"] == ["top_k", "top_p", "infill"]
    r = fim_srv.post("/infill", body)
    assert r.status_code == 200, r.text
    assert "infill" not in r.headers.get(IGNORED_HEADER, "")
    sp = SamplingParams(temperature=1.0, top_k=40, top_p=0.9, seed=seed)
    want = fim_reference.infill(prefix, suffix, max_tokens=48, sampling=replace(sp, infill=True)).text
    assert r.json()["content"] == want
    assert want != fim_reference.infill(prefix, suffix, max_tokens=48, sampling=sp).text
    events = list(sse_events(fim_srv.post("/infill", {**body, "stream": True}).iter_lines()))
    assert "".join(e["content"] for e in events) == want
    # speculative on the engine (n-gram drafts) == plain
    assert fim_reference.infill(prefix, suffix, max_tokens=48, sampling=replace(sp, infill=True), speculative=False).text == want


def test_the_infill_sampler_is_refused_with_a_constraint(fim_srv, fim_reference):
    r = fim_srv.post("/completion", {"prompt": "x", "n_predict": 4, "samplers": ["top_k", "infill"], "grammar": 'root ::= "a"'})
    assert r.status_code == 400 and r.json()["error"]["param"] == "samplers", r.text
    with pytest.raises(ConfigError, match="infill"):
        fim_reference.generate("x", max_tokens=2, sampling=SamplingParams(infill=True), constraint={"type": "json_object"})


def test_warm_up_requests_fill_the_cache_and_answer_like_llama_server(fim_srv):
    extra = [{"filename": "a.py", "text": "import os\nimport sys\n" * 8}]
    w = fim_srv.post("/infill", vim_warmup(extra))
    assert w.status_code == 200 and w.json() == {}  # response_fields [""]: a path to nothing
    chunks = [{**extra[0], "time": 1700000000000}]  # llama.vscode's chunks carry a time stamp
    v = fim_srv.post("/infill", vscode_warmup(chunks))
    assert v.status_code == 200, v.text
    j = v.json()
    assert j["content"] == "" and j["tokens_predicted"] == 0 and j["stop"] is True and j["stop_type"] == "limit"
    # the same prompt again: all cached but the last token, evaluated again for its logits
    assert j["tokens_evaluated"] > 20 and j["tokens_cached"] >= j["tokens_evaluated"] - 1
    assert j["timings"]["predicted_n"] == 0
    # the completion after it reuses the warmed context
    r = fim_srv.post("/infill", vscode_fim("x = ", "\n", "", chunks, None, n_predict=4))
    assert r.status_code == 200, r.text
    c = r.json()
    assert c["tokens_cached"] >= j["tokens_evaluated"] - 3 and c["tokens_predicted"] <= 4
    assert r.headers[IGNORED_HEADER] == "n_cmpl, t_max_prompt_ms"
    # n_predict 0 on /completion too; stream: only the final event
    k = fim_srv.post("/completion", {"prompt": "hello", "n_predict": 0}).json()
    assert k["content"] == "" and k["tokens_predicted"] == 0
    ev = list(sse_events(fim_srv.post("/completion", {"prompt": "hello", "n_predict": 0, "stream": True,
                                                  "response_fields": ["stop", "timings/predicted_n"]}).iter_lines()))
    assert ev == [{"stop": True, "timings/predicted_n": 0}]


def test_engine_max_tokens_0_only_evaluates_the_prompt(fim_reference):
    r = fim_reference.generate("a prompt to keep", max_tokens=0)
    assert r.text == "" and r.token_ids == [] and r.finish_reason == "length" and r.stats.n_prompt > 0
    again = fim_reference.generate("a prompt to keep going", max_tokens=1)
    assert again.stats.n_cached >= r.stats.n_prompt - 1  # it was in the cache


def test_llama_vscode_completion_works(fim_srv):
    r = fim_srv.post("/infill", vscode_fim("def add(a, b):\n    ", "\n", "return", EXTRA, 4, model="m"))
    assert r.status_code == 200, r.text
    assert r.json()["stop"] is True and isinstance(r.json()["content"], str)  # one completion (n_cmpl ignored)


def test_samplers_on_completion_and_chat(fim_srv, fim_reference):
    want = fim_reference.generate("abc", sampling=GREEDY, max_tokens=8).text
    j = fim_srv.post("/completion", {"prompt": "abc", "n_predict": 8, "temperature": 0, "samplers": ["temperature"]}).json()
    assert j["content"] == want
    j = fim_srv.post("/completion", {"prompt": "abc", "n_predict": 8, "temperature": 0, "samplers": "kt"}).json()
    assert j["content"] == want
    bad = fim_srv.post("/completion", {"prompt": "abc", "n_predict": 8, "top_k": 5, "top_p": 0.5, "samplers": ["top_p", "top_k"]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "samplers" and "'top_p' before 'top_k'" in bad.json()["error"]["message"]
    # llama.vim's instruct mode posts its chain to /v1/chat/completions
    body = {**vim_inst(chat("hi")), "seed": 5, "max_tokens": 8}
    text = "".join((e["choices"][0]["delta"].get("content") or "") for e in sse_events(fim_srv.post("/v1/chat/completions", body).iter_lines())
                   if isinstance(e, dict) and e.get("choices"))
    ref = fim_reference.generate(messages=chat("hi"), max_tokens=8, sampling=SamplingParams(temperature=0.1, min_p=0.1 ** 10, seed=5))
    assert text == ref.text


# --------------------------------------------------------------------------------------------- the ollama client
def test_ollama_client_list_show_ps_version(fim_srv, fim_engine):
    c = ollama.Client(host=fim_srv.url)
    (m,) = c.list().models
    assert m.model == "tiny-fim-target:latest" and m.details.format == "gguf"
    s = c.show("tiny-fim-target:latest")
    assert "insert" in s.capabilities and s.template == fim_engine.target.chat_template
    (p,) = c.ps().models
    assert p.model == p.name == "tiny-fim-target:latest" and p.context_length == fim_engine.target.n_ctx
    assert p.size == fim_engine.target.info.file_size and p.expires_at is not None and p.expires_at.year > 2100
    v = httpx.get(fim_srv.url + "/api/version").json()
    assert v["version"] == OLLAMA_VERSION and tuple(map(int, v["version"].split("."))) >= (0, 12, 11)


def test_ollama_client_chat_with_logprobs(fim_srv, fim_reference):
    c = ollama.Client(host=fim_srv.url)
    opts = {"temperature": 0, "num_predict": 8}
    want = fim_reference.generate(messages=chat("hi"), sampling=GREEDY, max_tokens=8)
    ref_lps = [lp for ch in fim_reference.stream(messages=chat("hi"), sampling=GREEDY, max_tokens=8, logprobs=3) for lp in (ch.logprobs or [])]
    r = c.chat(model="m", messages=chat("hi"), options=opts, logprobs=True, top_logprobs=3)
    assert r.message.content == want.text and r.done
    lps = r.logprobs
    assert lps and [x.token for x in lps] == [fim_reference.target.token_bytes(lp.token).decode("utf-8", "replace") for lp in ref_lps]
    assert [x.logprob for x in lps] == pytest.approx([lp.logprob for lp in ref_lps], abs=1e-6)
    assert all(len(x.top_logprobs) == 3 and x.logprob <= 0 for x in lps)
    assert all(math.isclose(x.logprob, x.top_logprobs[0].logprob) for x in lps)  # greedy: the token is the most likely
    parts = list(c.chat(model="m", messages=chat("hi"), options=opts, logprobs=True, stream=True))
    assert "".join(p.message.content for p in parts) == want.text
    assert [x.token for p in parts for x in (p.logprobs or [])] == [x.token for x in lps]
    plain = c.chat(model="m", messages=chat("hi"), options=opts)
    assert plain.logprobs is None and plain.message.content == want.text
    with pytest.raises(ollama.ResponseError) as e:
        c.chat(model="m", messages=chat("hi"), options=opts, logprobs=True, top_logprobs=21)
    assert "top_logprobs" in str(e.value)


def test_ollama_client_generate_context_and_logprobs(fim_srv, fim_reference, fim_engine):
    c = ollama.Client(host=fim_srv.url)
    opts = {"temperature": 0, "num_predict": 6}
    first = c.generate(model="m", prompt="hi", options=opts, logprobs=True)
    want = fim_reference.generate(messages=[{"role": "user", "content": "hi"}], sampling=GREEDY, max_tokens=6)
    assert first.response == want.text and 0 < len(first.logprobs) <= len(want.token_ids)
    ctx = list(first.context)
    prompt_ids = fim_engine.prompt_tokens(messages=[{"role": "user", "content": "hi"}])
    assert ctx == prompt_ids + list(want.token_ids)
    # sent back: the next turn continues those tokens
    turn = fim_engine.segment_tokens(fim_engine.chat_segments([{"role": "user", "content": "more"}]), add_bos=False)
    again = c.generate(model="m", prompt="more", options=opts, context=ctx)
    assert again.response == fim_reference.generate(tokens=ctx + turn, sampling=GREEDY, max_tokens=6).text
    assert list(again.context)[: len(ctx) + len(turn)] == ctx + turn
    streamed = list(c.generate(model="m", prompt="hi", options=opts, stream=True))
    assert "".join(p.response for p in streamed) == want.text and list(streamed[-1].context) == ctx
    raw = c.generate(model="m", prompt="hi", raw=True, options=opts)
    assert raw.context is None and raw.response == fim_reference.generate("hi", sampling=GREEDY, max_tokens=6).text
    with pytest.raises(ollama.ResponseError) as e:
        c.generate(model="m", prompt="more", options=opts, context=[10**9])
    assert "context" in str(e.value)
