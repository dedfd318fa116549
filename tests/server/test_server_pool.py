"""Serving several models by name (server/pool.py, server/by_name.py; docs/server.md, "Serving several models"), against
a real uvicorn server over folders of tiny GGUF models: a model loads with its draft on the first request that names
it, several stay loaded, the least recently used idle one goes at the count, keep_alive unloads (0, a duration, the
server's default; Ollama's unload request), the listings (/v1/models, /api/tags, /api/ps) say what is there and what
is loaded, an unknown name is a 404 naming the close matches, a model that cannot load is that request's 400 and the
others are still served, an engine with a request in flight is never unloaded, and the pinned model behaves as
without a pool."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import anyio
import httpx
import pytest
from click.testing import CliRunner

from edgespec.config import SamplingParams
from edgespec.server import create_app
from edgespec.server.api_errors import APIError
from edgespec.server.by_name import FolderSource
from edgespec.server.pool import NEVER, LoadPlan, ModelPool, parse_keep_alive

from support.engines import FIXED, load
from support.server_thread import ServerThread, wait_for

N_CTX = 512
GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def models_dir(tiny, tmp_path_factory) -> Path:
    """alpha and beta (the tiny target under two names), gamma (the tiny draft), broken (a truncated file)."""
    d = tmp_path_factory.mktemp("served")
    shutil.copy(tiny["target"], d / "alpha.gguf")
    shutil.copy(tiny["target"], d / "beta.gguf")
    shutil.copy(tiny["draft"], d / "gamma.gguf")
    shutil.copy(tiny["truncated"], d / "broken.gguf")
    return d


class Counting:
    """Engine.load on a plan's files (tiny settings), counting the loads of each name."""

    def __init__(self) -> None:
        self.loads: dict[str, int] = {}
        self.events: list[str] = []  # the pool's on_event lines
        self.lock = threading.Lock()

    def __call__(self, plan: LoadPlan) -> Any:
        with self.lock:
            self.loads[plan.name] = self.loads.get(plan.name, 0) + 1
        time.sleep(0.2)  # a load takes a while: concurrent requests for the model overlap it
        return load(Path(plan.target.path), Path(plan.draft.path) if plan.draft else None, n_ctx=N_CTX, memory=False)


def make_pool(models_dir: Path, tiny, **kw: Any) -> tuple[ModelPool, Counting]:
    loader = Counting()
    source = FolderSource([models_dir], drafts={"alpha": tiny["draft"]}, n_ctx=N_CTX, n_threads=1)
    kw.setdefault("memory_budget", 1 << 40)
    pool = ModelPool(source, loader=loader, **kw)
    pool.on_event = loader.events.append
    return pool, loader


@pytest.fixture
def served(models_dir, tiny) -> Iterator[tuple[ServerThread, ModelPool, Counting]]:
    pool, loader = make_pool(models_dir, tiny)
    s = ServerThread(create_app(None, pool=pool))
    yield s, pool, loader
    s.stop()


def ask(srv: ServerThread, model: Any, **kw: Any) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": "abc d"}], "max_tokens": 6, "temperature": 0, **kw}
    if model is not None:
        body["model"] = model
    return srv.post("/v1/chat/completions", body)


def ps(srv: ServerThread) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in httpx.get(srv.url + "/api/ps").json()["models"]}


# --------------------------------------------------------------------------------------------- by name
def test_a_model_loads_with_its_draft_on_first_use_and_stays(served):
    srv, pool, loader = served
    assert httpx.get(srv.url + "/health").json() == {"status": "ok"}  # no pinned model to wait for
    assert ps(srv) == {} and loader.loads == {}
    r = ask(srv, "alpha")
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "alpha" and r.json()["choices"][0]["message"]["content"]
    held = pool.get("alpha")
    assert held is not None and held.engine.draft is not None and held.draft == "tiny-draft"  # its draft loaded with it
    assert ask(srv, "alpha:latest").status_code == 200  # Ollama's spelling reaches it
    assert loader.loads == {"alpha": 1}
    p = ps(srv)
    assert list(p) == ["alpha:latest"] and p["alpha:latest"]["draft"] == "tiny-draft"
    assert p["alpha:latest"]["expires_at"] != NEVER and p["alpha:latest"]["context_length"] == N_CTX


def test_two_models_loaded_and_the_listings(served, models_dir):
    srv, pool, loader = served
    assert ask(srv, "alpha").status_code == 200 and ask(srv, "gamma").status_code == 200
    assert set(ps(srv)) == {"alpha:latest", "gamma:latest"} and loader.loads == {"alpha": 1, "gamma": 1}
    cards = {c["id"]: c for c in httpx.get(srv.url + "/v1/models").json()["data"]}
    assert set(cards) == {"alpha", "beta", "gamma", "broken"}
    assert cards["alpha"]["meta"]["loaded"] is True and cards["beta"]["meta"]["loaded"] is False
    assert cards["alpha"]["meta"]["draft"] == "tiny-draft" and cards["gamma"]["meta"]["draft"] is None
    assert httpx.get(srv.url + "/v1/models/beta").json()["id"] == "beta"
    tags = {m["name"]: m for m in httpx.get(srv.url + "/api/tags").json()["models"]}
    assert set(tags) == {"alpha:latest", "beta:latest", "gamma:latest", "broken:latest"}
    assert tags["beta:latest"]["size"] == (models_dir / "beta.gguf").stat().st_size
    assert tags["beta:latest"]["details"]["family"] and tags["beta:latest"]["details"]["format"] == "gguf"
    assert tags["broken:latest"]["details"]["family"] == ""  # listed, its header unreadable
    shown = httpx.post(srv.url + "/api/show", json={"model": "beta"}).json()  # not loaded: from the list, no load
    assert shown["details"]["family"] and pool.get("beta") is None
    assert httpx.post(srv.url + "/api/show", json={"model": "alpha"}).json()["model_info"]["edgespec.n_ctx"] == N_CTX


def test_concurrent_requests_for_one_model_wait_for_one_load(served):
    srv, pool, loader = served
    codes: list[int] = []
    threads = [threading.Thread(target=lambda: codes.append(ask(srv, "beta").status_code)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert codes == [200] * 4 and loader.loads == {"beta": 1}


def test_least_recently_used_unloads_at_max_loaded_1(models_dir, tiny):
    pool, loader = make_pool(models_dir, tiny, max_loaded=1)
    srv = ServerThread(create_app(None, pool=pool))
    try:
        assert ask(srv, "alpha").status_code == 200
        assert ask(srv, "beta").status_code == 200
        assert list(ps(srv)) == ["beta:latest"] and pool.unloaded == ["alpha"]
        assert ask(srv, "alpha").status_code == 200  # loads again
        assert loader.loads == {"alpha": 2, "beta": 1} and pool.unloaded == ["alpha", "beta"]
        assert loader.events[:3] == ["loaded alpha + draft tiny-draft in " + loader.events[0].rsplit(" in ", 1)[1],
                                     "unloaded alpha (to make room for beta)", loader.events[2]]
        assert loader.events[2].startswith("loaded beta (no draft model) in ")
    finally:
        srv.stop()


def test_memory_short_unloads_the_least_recently_used(models_dir, tiny):
    one = (models_dir / "beta.gguf").stat().st_size * 1.2  # pool.MEMORY_FACTOR x the file: what a model is estimated to take
    pool, _ = make_pool(models_dir, tiny, max_loaded=3, memory_budget=int(one * 1.5))  # room for one model, not two
    srv = ServerThread(create_app(None, pool=pool))
    try:
        assert ask(srv, "beta").status_code == 200
        assert ask(srv, "gamma").status_code == 200
        assert [h.name for h in pool.loaded()] == ["gamma"] and pool.unloaded == ["beta"]
    finally:
        srv.stop()


def test_a_model_in_use_is_never_unloaded(models_dir, tiny):
    pool, _ = make_pool(models_dir, tiny, max_loaded=1, keep_alive=0)
    srv = ServerThread(create_app(None, pool=pool))
    try:
        # a request in flight on alpha: its lease, as core.generate holds it until the answer is written
        lease = anyio.run(pool.acquire, pool.plan("alpha"), 0.0)
        r = ask(srv, "beta")
        assert r.status_code == 503 and r.json()["error"]["code"] == "models_busy" and "Retry-After" in r.headers
        time.sleep(0.3)  # keep_alive 0: it would go at once if it were idle
        assert pool.get("alpha") is lease.held and not lease.held.engine.closed
        lease.release()
        wait_for(lambda: pool.get("alpha") is None, timeout=10, what="alpha to unload once idle")
        assert ask(srv, "beta").status_code == 200 and pool.unloaded[0] == "alpha"
    finally:
        srv.stop()


# --------------------------------------------------------------------------------------------- keep_alive
def test_keep_alive_zero_unloads_after_the_request_and_ollamas_unload(served):
    srv, pool, _ = served
    r = srv.post("/api/chat", {"model": "alpha", "messages": [{"role": "user", "content": "abc"}], "stream": False,
                               "options": {"num_predict": 4}, "keep_alive": 0})
    assert r.status_code == 200, r.text
    assert "keep_alive" not in r.headers.get("x-edgespec-ignored-params", "")  # honoured, not ignored
    wait_for(lambda: pool.get("alpha") is None, timeout=10, what="alpha to unload")
    assert pool.unloaded == ["alpha"]
    # Ollama's load request (no prompt) and unload request (no prompt, keep_alive 0)
    r = srv.post("/api/generate", {"model": "gamma"})
    assert r.json()["done_reason"] == "load" and pool.get("gamma") is not None
    r = srv.post("/api/generate", {"model": "gamma", "keep_alive": 0})
    assert r.json()["done_reason"] == "unload"
    wait_for(lambda: pool.get("gamma") is None, timeout=10, what="gamma to unload")
    r = srv.post("/api/chat", {"model": "beta", "messages": [], "keep_alive": "-1m"})
    assert r.json()["done_reason"] == "load" and ps(srv)["beta:latest"]["expires_at"] == NEVER


def test_keep_alive_expiry(models_dir, tiny):
    pool, _ = make_pool(models_dir, tiny, keep_alive=0.5)
    srv = ServerThread(create_app(None, pool=pool))
    try:
        assert ask(srv, "alpha").status_code == 200
        r = srv.post("/api/generate", {"model": "beta", "prompt": "abc", "stream": False, "options": {"num_predict": 3},
                                       "keep_alive": "1h"})
        assert r.status_code == 200, r.text
        t0 = time.monotonic()
        wait_for(lambda: pool.get("alpha") is None, timeout=10, what="alpha's keep-alive to run out")
        assert time.monotonic() - t0 < 8 and pool.get("beta") is not None  # beta asked for an hour
        assert list(ps(srv)) == ["beta:latest"]
    finally:
        srv.stop()


def test_parse_keep_alive():
    assert parse_keep_alive("5m") == 300 and parse_keep_alive("30s") == 30 and parse_keep_alive("1h30m") == 5400
    assert parse_keep_alive(0) == 0 and parse_keep_alive("0") == 0 and parse_keep_alive(2.5) == 2.5 and parse_keep_alive("10") == 10
    assert parse_keep_alive(-1) is None and parse_keep_alive("-1m") is None and parse_keep_alive("500ms") == 0.5
    for forever in (10**400, 10**12, "100000000h", float("inf")):  # past ~31 years (no date /api/ps could show): for ever
        assert parse_keep_alive(forever) is None
    for bad in ("soon", "5 minutes", "", True, [], "1e400", float("nan")):
        with pytest.raises(APIError) as e:
            parse_keep_alive(bad)
        assert e.value.status == 400 and e.value.param == "keep_alive"


# --------------------------------------------------------------------------------------------- errors
def test_unknown_name_is_a_404_naming_the_close_matches(served):
    srv, _, loader = served
    r = ask(srv, "alpah")
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "model_not_found" and err["param"] == "model" and "alpha" in err["close_matches"] and "'alpha'" in err["message"]
    r = srv.post("/api/chat", {"model": "gama", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404 and "gamma" in r.json()["error"] and set(r.json()) == {"error"}  # Ollama's shape
    assert httpx.get(srv.url + "/v1/models/betta").status_code == 404
    assert srv.post("/api/show", {"model": "nothing-like-it"}).status_code == 404
    r = ask(srv, None)
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_required" and "'alpha'" in r.json()["error"]["message"]
    assert ask(srv, 7).json()["error"]["code"] == "model_required"  # not a name
    r = srv.post("/api/chat", {"model": "alpha", "messages": [{"role": "user", "content": "x"}], "keep_alive": "soon"})
    assert r.status_code == 400 and "keep_alive" in r.json()["error"]
    assert loader.loads == {}


def test_a_model_that_fails_to_load_is_that_requests_error(served):
    srv, pool, loader = served
    r = ask(srv, "broken")
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "model_load_failed" and "'broken' failed to load" in err["message"] and "Traceback" not in r.text
    assert ask(srv, "alpha").status_code == 200  # the others are still served
    r = srv.post("/api/generate", {"model": "broken", "prompt": "x", "stream": False})
    assert r.status_code == 400 and "failed to load" in r.json()["error"]
    assert loader.loads == {"broken": 1, "alpha": 1}  # remembered until the file changes: not tried again
    assert httpx.get(srv.url + "/health").json() == {"status": "ok"}
    # a model unloading frees memory, so a failure is tried again (it may have been for want of memory)
    r = srv.post("/api/generate", {"model": "alpha", "keep_alive": 0})
    assert r.json()["done_reason"] == "unload"
    wait_for(lambda: pool.get("alpha") is None, timeout=10, what="alpha to unload")
    assert ask(srv, "broken").status_code == 400 and loader.loads["broken"] == 2


# --------------------------------------------------------------------------------------------- the pinned model
def test_the_pinned_model_with_a_pool(models_dir, tiny):
    eng = load(tiny["target"], tiny["draft"], n_ctx=N_CTX, spec=FIXED)
    pool, loader = make_pool(models_dir, tiny)
    srv = ServerThread(create_app(eng, pool=pool))
    try:
        for model in (None, "tiny-target", "tiny-target:latest"):  # no name, or the pinned one's: the pinned engine
            r = ask(srv, model)
            assert r.status_code == 200 and r.json()["model"] == "tiny-target"
        for model in ("gpt-4o", "local"):  # what OpenAI clients send, unknown here: the pinned model, as without a pool
            r = ask(srv, model)
            assert r.status_code == 200 and r.json()["model"] == "tiny-target"
        for model in ("gama:latest", "org/gama", "gama.gguf"):  # written as a local model's name: 404, the close matches
            r = ask(srv, model)
            assert r.status_code == 404 and "gamma" in r.json()["error"]["close_matches"], (model, r.text)
        assert loader.loads == {}
        assert ask(srv, "gamma").json()["model"] == "gamma" and loader.loads == {"gamma": 1}
        ids = [c["id"] for c in httpx.get(srv.url + "/v1/models").json()["data"]]
        assert ids[0] == "tiny-target" and set(ids[1:]) == {"alpha", "beta", "gamma", "broken"}
        p = ps(srv)
        assert p["tiny-target:latest"]["expires_at"] == NEVER and "gamma:latest" in p
        r = srv.post("/api/generate", {"model": "tiny-target", "keep_alive": 0})  # the pinned model never unloads
        assert r.status_code == 200 and not eng.closed
        r = srv.post("/tokenize", {"model": "gamma", "content": "abc"})
        assert r.status_code == 200 and r.json()["tokens"]
        r = srv.post("/completion", {"model": "beta", "prompt": "abc", "n_predict": 3})
        assert r.status_code == 200 and r.json()["model"] == "beta"
        r = srv.post("/v1/responses", {"model": "beta", "input": "abc", "max_output_tokens": 3})
        assert r.status_code == 200 and r.json()["model"] == "beta"
        assert loader.loads == {"gamma": 1, "beta": 1}
    finally:
        srv.stop()
        eng.close()
    assert pool.closed and pool.loaded() == []  # the app closed the pool's engines


def test_without_a_pool_any_name_reaches_the_one_model(tiny):
    eng = load(tiny["target"], tiny["draft"], n_ctx=N_CTX, spec=FIXED)
    srv = ServerThread(create_app(eng))
    try:
        assert ask(srv, "gpt-4o").json()["model"] == "tiny-target"
        assert [m["name"] for m in httpx.get(srv.url + "/api/tags").json()["models"]] == ["tiny-target:latest"]
    finally:
        srv.stop()
        eng.close()


def test_serve_rejects_a_bad_keep_alive():
    from edgespec.cli.serve import serve

    r = CliRunner().invoke(serve, ["--keep-alive", "soon", "--port", "0"])
    assert r.exit_code == 2 and "--keep-alive" in r.output and "Traceback" not in r.output


# --------------------------------------------------------------------------------------------- discovered models
def test_discovered_models_are_served_by_name_with_their_best_draft(tmp_path):
    """`edgespec serve`'s source: the catalog over fake Ollama/LM Studio/HF/llama.cpp trees (support.model_trees).
    The Ollama target loads with the draft discovery paired; a file path is not a name; a near miss is a 404 with the
    close matches; a hostile entry (a manifest pointing outside its blobs) is not offered."""
    from edgespec.models import Catalog, places
    from edgespec.server.by_name import CatalogSource

    from support.model_trees import write_model_trees

    home = write_model_trees(tmp_path)
    catalog = Catalog(places({"EDGESPEC_MODEL_DIRS": str(home["mine"])}, home["home"], system=False), use_cache=False)
    source = CatalogSource(catalog, n_ctx=N_CTX, n_threads=1)
    loader = Counting()
    pool = ModelPool(source, loader=loader, memory_budget=1 << 40)
    srv = ServerThread(create_app(None, pool=pool))
    try:
        best = catalog.best_draft("tinybig:latest")
        assert best is not None
        r = ask(srv, "tinybig")
        assert r.status_code == 200, r.text
        held = pool.get(catalog.find("tinybig").name)
        assert held is not None and held.engine.draft is not None
        assert Path(held.engine.draft.spec.path) == best.path  # the draft discovery paired, loaded with it
        tags = {m["name"] for m in httpx.get(srv.url + "/api/tags").json()["models"]}
        assert any(t.startswith("tinybig") for t in tags) and not any("escape" in t for t in tags)
        r = ask(srv, str(home["target"]))  # a path on the server's disk is not a model name
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        r = ask(srv, "tinybg")
        assert r.status_code == 404 and any("tinybig" in m for m in r.json()["error"]["close_matches"]), r.text
        # a model added after the server started: an unknown name makes the catalog look again (at most every REFRESH_S)
        from support.tiny import write_tiny_model

        write_tiny_model(home["mine"] / "newcomer.gguf", seed=5, name="newcomer")
        source._looked -= 60
        assert ask(srv, "newcomer").status_code == 200
    finally:
        srv.stop()
        pool.close()


def test_serve_sources(tmp_path):
    """serve's model source: discovery unless --no-discover; --models-dir's folders added; nothing with neither."""
    from edgespec.cli.serve import model_source
    from edgespec.server.by_name import CatalogSource

    kw: dict[str, Any] = {"n_ctx": N_CTX}
    assert model_source({"pool": {"discover": False, "models_dirs": []}, "model_kw": kw}) is None
    (tmp_path / "m").mkdir()
    write_dir = tmp_path / "m"
    from support.tiny import write_tiny_model

    write_tiny_model(write_dir / "solo.gguf", seed=1, name="solo")
    only = model_source({"pool": {"discover": False, "models_dirs": [str(write_dir)]}, "model_kw": kw})
    assert isinstance(only, CatalogSource) and [e.name for e in only.entries()] == ["solo"]
    assert only.plan("solo").target.path == str(write_dir / "solo.gguf") and only.plan("solo").target.n_ctx == N_CTX
    assert isinstance(model_source({"pool": {"models_dirs": []}, "model_kw": kw}), CatalogSource)
