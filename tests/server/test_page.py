"""The chat page `edgespec serve` shows at `/` (edgespec/server/page.py, docs/web.md): its files and headers, the API
extensions it uses (`show_sources`, `drafter`), and the page itself in headless Chromium (tests/support/browser.py)
against a server over the tiny pair with two slots: a message streamed, Stop, the token sources, race mode, hostile
text kept inert, the API key, no request leaving the origin, a narrow window, and the screenshot docs/ shows.

The browser tests skip with the reason when no Chromium can be driven here, and fail instead under
EDGESPEC_REQUIRE_BROWSER=1 (CI: .ci/run)."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from edgespec.server import Settings, create_app
from edgespec.server.page import CSP, files

from support import browser as B
from support.engines import load
from support.server_thread import ServerThread, sse_events, wait_for

KEY = "page-test-key"


@pytest.fixture(scope="module")
def engine(tiny: Any) -> Iterator[Any]:
    eng = load(tiny["target"], tiny["draft"], parallel=2)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def srv(engine: Any) -> Iterator[ServerThread]:
    s = ServerThread(create_app(engine))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def keyed(engine: Any) -> Iterator[ServerThread]:
    s = ServerThread(create_app(engine, Settings(api_key=KEY)))
    yield s
    s.stop()


def stream(srv: ServerThread, **body: Any) -> list[Any]:
    body = {"messages": [{"role": "user", "content": "the cat"}], "stream": True, "max_tokens": 80, "temperature": 0, **body}
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        return [e for e in sse_events(r.iter_lines()) if e != "[DONE]"]


def content(events: list[Any]) -> str:
    return "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices", []))


# --------------------------------------------------------------------------------------------- files and headers
def test_page_is_served_with_a_strict_policy(srv: ServerThread) -> None:
    r = httpx.get(srv.url + "/")
    assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=utf-8"
    assert r.headers["content-security-policy"] == CSP
    assert "default-src 'self'" in CSP and "script-src 'self';" in CSP and "unsafe" not in CSP
    assert r.headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in r.text and " on" + "click=" not in r.text  # no inline script: CSP would block it
    for tag in ('textarea name="message"', 'button type="submit" name="send"', 'name="stop"'):
        assert tag in r.text


def test_assets_have_their_types_and_nothing_else_is_served(srv: ServerThread) -> None:
    want = {"app.js": "text/javascript", "app.css": "text/css", "vendor/purify.min.js": "text/javascript",
            "vendor/marked.umd.js": "text/javascript", "vendor/highlight.min.js": "text/javascript",
            "vendor/dompurify.LICENSE.txt": "text/plain"}
    for name, media in want.items():
        r = httpx.get(f"{srv.url}/ui/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(media), name
        assert r.headers["content-security-policy"] == CSP
    for name in ("nope.js", "../page.py", "..%2fpage.py", "%2e%2e/core.py", "vendor", "/etc/passwd"):
        r = httpx.get(f"{srv.url}/ui/{name}")
        assert r.status_code == 404 and r.headers["content-type"] == "application/json", name
    counted = httpx.get(srv.url + "/metrics").text  # the page's files under one route label, not "other"
    assert 'edgespec_http_requests_total{route="/ui/{name}",code="200"}' in counted
    assert 'edgespec_http_requests_total{route="/ui/{name}",code="404"}' in counted
    # every file the page links is shipped, and each vendored library has its licence next to it
    html = files()["index.html"][0].decode()
    for ref in ("/ui/app.css", "/ui/app.js", "/ui/vendor/purify.min.js", "/ui/vendor/marked.umd.js", "/ui/vendor/highlight.min.js"):
        assert ref in html and ref[4:] in files()
    for lib in ("marked", "dompurify", "highlight"):
        assert f"vendor/{lib}.LICENSE.txt" in files()


def test_the_page_needs_no_key_but_its_api_calls_do(keyed: ServerThread) -> None:
    assert httpx.get(keyed.url + "/").status_code == 200
    assert httpx.get(keyed.url + "/ui/app.js").status_code == 200
    assert httpx.get(keyed.url + "/v1/models").status_code == 401
    assert httpx.get(keyed.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


# --------------------------------------------------------------------------------------------- the API extensions
def test_show_sources_names_each_tokens_source(srv: ServerThread) -> None:
    for drafter, drafted in (("model", "draft"), ("ngram", "lookup")):
        events = stream(srv, show_sources=True, drafter=drafter, max_tokens=120)
        pieces = [p for e in events for c in e.get("choices", []) for p in c.get("sources", [])]
        assert "".join(t for t, _ in pieces) == content(events)  # the pieces are the text, in order
        kinds = Counter(s for _, s in pieces)
        assert set(kinds) <= set(B.SOURCES) and kinds[drafted] > 0 and kinds["target"] > 0, kinds
        end = events[-1]
        assert end["edgespec"]["drafter"] == drafter
        assert end["edgespec"]["n_accepted"] == kinds[drafted] and len(pieces) == end["timings"]["predicted_n"]
    plain = stream(srv, show_sources=True, drafter="none")
    assert {s for e in plain for c in e.get("choices", []) for _, s in c.get("sources", [])} == {"target"}
    assert plain[-1]["edgespec"]["drafter"] == "none" and plain[-1]["edgespec"]["n_drafted"] == 0
    assert content(plain) == content(stream(srv, show_sources=True, drafter="model"))  # greedy: the same text


def test_sources_are_sent_only_when_asked(srv: ServerThread) -> None:
    assert not any("sources" in c for e in stream(srv) for c in e.get("choices", []))


def test_a_bad_drafter_is_a_400_naming_it(srv: ServerThread) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for bad in ("bogus", 3, "suffix"):  # suffix: this engine was not loaded with a suffix index
        r = srv.post("/v1/chat/completions", {**body, "drafter": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "drafter", (bad, r.text)
    for ok in ("auto", "none", "ngram", "model", "model+ngram"):
        r = srv.post("/v1/chat/completions", {**body, "drafter": ok})
        assert r.status_code == 200, (ok, r.text)


# --------------------------------------------------------------------------------------------- in a browser
@pytest.fixture(scope="module")
def drv() -> Iterator[Any]:
    why = B.browser_missing()
    if why is not None:
        if os.environ.get("EDGESPEC_REQUIRE_BROWSER") == "1":
            pytest.fail(f"the browser tests must run (EDGESPEC_REQUIRE_BROWSER=1): {why}")
        pytest.skip(f"no browser to drive: {why}")
    d = B.chrome()
    yield d
    d.quit()


def spans(drv: Any) -> list[tuple[str, str]]:
    return B.token_spans(drv)


def test_a_message_streams_an_answer_with_its_sources(srv: ServerThread, drv: Any) -> None:
    B.open_page(drv, srv.url, settings={"temperature": 0, "max_tokens": 60, "drafter": "model+ngram"})
    B.requests_made(drv)
    B.console_errors(drv)
    B.send(drv, "the cat")
    B.wait_answer(drv)
    assert drv.execute_script("return document.querySelectorAll('.message.user').length") == 1
    got = spans(drv)
    kinds = Counter(s for _, s in got)
    assert set(kinds) <= set(B.SOURCES) and kinds["target"] and (kinds["draft"] or kinds["lookup"]), kinds
    reference = stream(srv, drafter="model+ngram", max_tokens=60, temperature=0)
    assert "".join(t for t, _ in got) == content(reference)  # what the page shows is the answer, whole
    stats = drv.execute_script("return document.querySelector('.message.assistant .stats').textContent")
    assert "tok/s" in stats and "μ" in stats and "acceptance" in stats and "drafted/accepted" in stats and "model+ngram" in stats
    # the colours: off, the markdown view shows; on, the tokens with their sources' backgrounds
    assert drv.execute_script("return getComputedStyle(document.querySelector('.message.assistant .tokens')).display") == "none"
    drv.find_element("css selector", "input[name=sources]").click()
    colours = drv.execute_script(
        "return [...document.querySelectorAll('.message.assistant span[data-source]')].map(s => [s.dataset.source, getComputedStyle(s).backgroundColor]);")
    by = {s: {c for k, c in colours if k == s} for s in B.SOURCES}
    assert len(by["target"]) == 1 and all(not (by[s] & by["target"]) for s in ("draft", "lookup")), by
    drv.find_element("css selector", "input[name=sources]").click()
    # every request the page made went to this server, and nothing broke its policy
    made, blocked = B.requests_made(drv)
    assert made and all(u.startswith(srv.url + "/") for u in made) and not blocked, (made, blocked)
    assert B.console_errors(drv) == []


def test_stop_cancels_the_generation_on_the_server(srv: ServerThread, drv: Any) -> None:
    B.open_page(drv, srv.url, settings={"temperature": 0, "max_tokens": 16000})
    n_records = len(srv.state.records)
    B.send(drv, "write forever")
    B.wait(drv, lambda: len(spans(drv)) >= 20, what="the answer to stream")
    # while it streams: the markdown is rendered as it grows, or, with the sources shown, the coloured tokens
    shown = "return [...document.querySelectorAll('.message.assistant .' + arguments[0])].map(e => [getComputedStyle(e).display, e.textContent.length])[0]"
    first = B.wait(drv, lambda: (lambda d, n: n > 0 and d != "none" and n)(*drv.execute_script(shown, "markdown")),
                   what="the markdown to render while the answer streams")
    B.wait(drv, lambda: drv.execute_script(shown, "markdown")[1] > first, what="the markdown to render again")
    drv.find_element("css selector", "input[name=sources]").click()
    assert drv.execute_script(shown, "markdown")[0] == "none" and drv.execute_script(shown, "tokens")[0] != "none"
    drv.find_element("css selector", "input[name=sources]").click()
    drv.find_element("css selector", B.STOP).click()
    B.wait(drv, lambda: B.idle(drv), timeout=20, what="Stop to end the answer")
    rec = wait_for(lambda: next((r for r in list(srv.state.records)[n_records:] if r.done), None), what="the record")
    assert rec.client_left and rec.finish_reason == "cancelled" and rec.n_generated < 16000
    stats = drv.execute_script("return document.querySelector('.message.assistant .stats').textContent")
    assert "stopped" in stats
    assert drv.execute_script(f"return document.querySelector('{B.STOP}').disabled")


def test_race_shows_the_same_text_and_a_speedup(srv: ServerThread, drv: Any) -> None:
    B.open_page(drv, srv.url, settings={"temperature": 0, "max_tokens": 80, "seed": 7})
    drv.find_element("css selector", "input[name=race]").click()
    B.send(drv, "the cat")
    B.wait_answer(drv)
    cols = drv.execute_script(
        "return [...document.querySelectorAll('.race .message.assistant')].map(m => "
        "[...m.querySelectorAll('span[data-source]')].map(s => [s.textContent, s.dataset.source]));")
    assert len(cols) == 2
    spec, plain = cols
    assert "".join(t for t, _ in spec) == "".join(t for t, _ in plain) != ""
    assert {s for _, s in plain} == {"target"} and {s for _, s in spec} - {"target"}
    speedup = drv.execute_script("return document.querySelector('.race .speedup').dataset.speedup")
    assert float(speedup) > 0
    text = drv.execute_script("return document.querySelector('.race .speedup').textContent")
    assert "two slots" in text  # this server has two: both ran at once


HOSTILE = [
    "<img src=x onerror=\"window.__xss=1\"> <script>window.__xss=2</script>",
    "**bold** <img src=x onerror=window.__xss=3> [link](javascript:window.__xss=4) <iframe src=\"javascript:window.__xss=5\"></iframe>\n\n"
    "```html\n<script>window.__xss=6</script>\n```\n\n<svg><script>window.__xss=7</script></svg> ![pixel](http://203.0.113.7/pixel.png)",
]


def test_hostile_text_stays_inert(srv: ServerThread, drv: Any) -> None:
    conv = [{"id": "x", "title": HOSTILE[0], "messages": [
        {"role": "user", "content": HOSTILE[0]},
        {"role": "assistant", "content": HOSTILE[1], "sources": [[HOSTILE[1][:40], "draft"], [HOSTILE[1][40:], "target"]]},
    ]}]
    B.open_page(drv, srv.url)
    drv.execute_script("localStorage.setItem('edgespec.conversations', arguments[0]);", json.dumps(conv))
    B.requests_made(drv)
    B.open_page(drv, srv.url, clear=False)
    B.send(drv, HOSTILE[0])  # typed in by the user, and answered
    B.wait_answer(drv)
    assert drv.execute_script("return window.__xss") is None
    assert drv.execute_script("return document.querySelectorAll('#messages script, #conversations script, #title script').length") == 0
    assert drv.execute_script("return document.querySelectorAll('[onerror], iframe, a[href^=javascript]').length") == 0
    users = drv.execute_script("return [...document.querySelectorAll('.message.user')].map(m => m.textContent)")
    assert users == [HOSTILE[0], HOSTILE[0]]  # shown as the text it is
    assert drv.execute_script("return document.querySelector('#title').textContent") == HOSTILE[0]
    md = drv.find_element("css selector", ".message.assistant .markdown")
    assert drv.execute_script("return arguments[0].querySelector('strong').textContent", md) == "bold"
    assert "<script>window.__xss=6</script>" in drv.execute_script("return arguments[0].querySelector('pre code').textContent", md)
    assert "".join(t for t, _ in spans_of_first(drv)) == HOSTILE[1]
    made, blocked = B.requests_made(drv)  # the answer's image on another host is not fetched (the policy's img-src)
    assert made and all(u.startswith(srv.url + "/") for u in made), made
    assert blocked == {"http://203.0.113.7/pixel.png": "csp"}


def spans_of_first(drv: Any) -> list[tuple[str, str]]:
    return [tuple(x) for x in drv.execute_script(
        "return [...document.querySelector('.message.assistant').querySelectorAll('span[data-source]')]"
        ".map(s => [s.textContent, s.dataset.source]);")]


def test_the_page_asks_for_the_api_key_once(keyed: ServerThread, drv: Any) -> None:
    B.open_page(drv, keyed.url)
    B.wait(drv, lambda: drv.execute_script("return document.querySelector('#key-dialog').open"), what="the key dialog")
    drv.find_element("css selector", "input[name=apikey]").send_keys(KEY)
    drv.find_element("css selector", "button[name=use-key]").click()
    B.wait(drv, lambda: "tiny-target" in drv.execute_script("return document.querySelector('#model-line').textContent"),
           what="the model line")
    B.send(drv, "the cat")
    B.wait_answer(drv)
    assert spans(drv) and not drv.execute_script("return document.querySelector('.message.assistant .error-text')")
    B.open_page(drv, keyed.url, clear=False)  # the same tab: the key is kept for the session
    B.wait(drv, lambda: "tiny-target" in drv.execute_script("return document.querySelector('#model-line').textContent"),
           what="the model line")
    assert not drv.execute_script("return document.querySelector('#key-dialog').open")


def test_a_narrow_window_keeps_the_conversation_usable(srv: ServerThread, drv: Any) -> None:
    drv.set_window_size(390, 800)
    try:
        B.open_page(drv, srv.url, settings={"max_tokens": 8})
        rect = drv.execute_script("return document.querySelector('#sidebar').getBoundingClientRect().right")
        assert rect <= 0  # the conversation list is off screen until the menu button opens it
        assert drv.find_element("css selector", "button[name=menu]").is_displayed()
        assert drv.find_element("css selector", B.MESSAGE).is_displayed() and drv.find_element("css selector", B.SEND).is_displayed()
        assert drv.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
        drv.find_element("css selector", "button[name=menu]").click()
        B.wait(drv, lambda: drv.execute_script("return document.querySelector('#sidebar').getBoundingClientRect().left") >= 0,
               what="the menu to open")
    finally:
        drv.set_window_size(1200, 800)


def test_screenshot_and_a_long_answer_measured(srv: ServerThread, drv: Any, tmp_path: Path) -> None:
    """What scripts/web_page.py does for docs/, on the tiny pair; prints what it measured (asserting no timing)."""
    got = B.demo(drv, srv.url, tmp_path / "web.png", "the cat", max_tokens=60)
    png = (tmp_path / "web.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) < 200_000
    assert got["paint"].get("first-contentful-paint", 0) > 0
    print(f"\nfirst paint {got['paint']}")
    for sources in (False, True):  # the markdown rendered as it streams; the coloured tokens
        B.open_page(drv, srv.url, settings={"temperature": 0, "max_tokens": 1000})
        if sources:
            drv.find_element("css selector", "input[name=sources]").click()
        B.watch_frames(drv)
        B.send(drv, "the cat")
        B.wait_answer(drv)
        frames = B.frame_report(drv)
        n = len(spans(drv))
        print(f"streaming {n} tokens, {'sources shown' if sources else 'markdown'}: {frames}")
        assert n > 500 and frames["frames"] > 0
    got = drv.execute_async_script(RENDER_COST, LONG_MARKDOWN)
    print(f"a {len(LONG_MARKDOWN)}-character markdown answer with code rendered as it streams: {got['ms']} ms "
          "(longest, mean, final, longest task after)")
    # rendered piece by piece as it streamed, it ends as the whole text rendered at once (less the highlighting)
    drv.execute_script("document.querySelector('#messages').insertAdjacentHTML('beforeend', "
                       "'<div id=a>' + arguments[0] + '</div><div id=b>' + arguments[1] + '</div>');"
                       "document.querySelectorAll('#a button.copy').forEach(b => b.remove());", got["html"], got["whole"])
    a, b = (drv.execute_script(f"const e = document.querySelector('#{x}'); return [e.textContent, [...e.querySelectorAll('*')]"
                               ".map(t => t.tagName).filter(t => t !== 'SPAN' && t !== 'BUTTON')]") for x in "ab")
    assert a == b and a[0].count("is_palindrome") == 18 and a[1].count("PRE") == 18 and "TABLE" in a[1]


# about 1,000 tokens of a typical answer: prose, lists, a table, code blocks with and without a language
LONG_MARKDOWN = ("## Palindromes\n\nA *palindrome* reads the same **both ways**; `s == s[::-1]` checks it.\n\n"
                 "- strip spaces\n- fold case\n- keep letters and digits\n\n| input | result |\n|---|---|\n| `abba` | True |\n\n"
                 "```python\ndef is_palindrome(s: str) -> bool:\n    \"\"\"Whether s reads the same both ways.\"\"\"\n"
                 "    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]\n```\n\n"
                 "```\nfor i in range(10):\n    print(i, is_palindrome(str(i)))\n```\n\n") * 9
# the page's markdown rendering of LONG_MARKDOWN as it streams (rendered again every 16 characters, about 4 tokens), at
# the end, and the longest of the highlighting tasks after it: [longest streaming render, their mean, final, task], ms
RENDER_COST = """
const done = arguments[arguments.length - 1];
const text = arguments[0], el = document.createElement('div'); el.className = 'markdown';
document.querySelector('#messages').append(el);
const times = [], r = (x) => Math.round(x * 10) / 10;
for (let n = 16; n < text.length; n += 16) { const t0 = performance.now(); renderMarkdown(el, text.slice(0, n), false);
  el.offsetHeight; times.push(performance.now() - t0); }
let t0 = performance.now(); renderMarkdown(el, text, true); el.offsetHeight; const fin = performance.now() - t0;
let longest = 0; t0 = performance.now();
const poll = () => { const t = performance.now(); longest = Math.max(longest, t - t0); t0 = t;
  if (toHighlight.length) setTimeout(poll, 0);
  else { done({ms: [r(Math.max(...times)), r(times.reduce((a, b) => a + b, 0) / times.length), r(fin), r(longest)],
               html: el.innerHTML, whole: DOMPurify.sanitize(marked.parse(text))}); el.remove(); } };
setTimeout(poll, 0);
"""


def test_conversations_regenerate_edit_and_keys(srv: ServerThread, drv: Any) -> None:
    from selenium.webdriver.common.keys import Keys

    B.open_page(drv, srv.url, settings={"temperature": 0, "max_tokens": 12})
    box = drv.find_element("css selector", B.MESSAGE)
    box.send_keys("first line", Keys.SHIFT, Keys.ENTER, Keys.SHIFT, "second line", Keys.ENTER)  # Shift+Enter: a new line
    B.wait_answer(drv)
    users = lambda: drv.execute_script("return [...document.querySelectorAll('.message.user')].map(m => m.textContent)")  # noqa: E731
    answers = lambda: drv.execute_script("return document.querySelectorAll('.message.assistant').length")  # noqa: E731
    assert users() == ["first line\nsecond line"] and answers() == 1
    first = B.token_spans(drv)
    drv.find_element("css selector", "button[name=regenerate]").click()  # the last answer again: greedy, the same
    B.wait_answer(drv)
    assert answers() == 1 and B.token_spans(drv) == first
    drv.find_element("css selector", "button[name=edit]").click()  # the message back in the box, without its answer
    assert users() == [] and answers() == 0
    assert drv.find_element("css selector", B.MESSAGE).get_attribute("value") == "first line\nsecond line"
    B.send(drv, "edited")
    B.wait_answer(drv)
    assert users() == ["edited"] and answers() == 1
    # kept in the browser: a reload shows the same conversation; a new one starts empty; delete removes it
    B.open_page(drv, srv.url, clear=False)
    assert users() == ["edited"] and answers() == 1
    drv.find_element("css selector", "button[name=new]").click()
    assert users() == [] and len(drv.find_elements("css selector", "#conversations li")) == 2
    drv.find_elements("css selector", "#conversations button[name=rename]")[1].click()
    alert = drv.switch_to.alert
    alert.send_keys("renamed")
    alert.accept()
    titles = lambda: [b.text for b in drv.find_elements("css selector", "#conversations button.open")]  # noqa: E731
    assert titles() == ["New chat", "renamed"]
    drv.find_elements("css selector", "#conversations button[name=delete]")[1].click()
    drv.switch_to.alert.accept()
    assert titles() == ["New chat"]


def test_a_server_with_no_pinned_model_answers_the_page(tiny: Any, drv: Any, tmp_path: Path) -> None:
    """`serve --models-dir DIR` with no --target: the page asks for the first model the server serves by name."""
    import shutil

    from edgespec.server.by_name import FolderSource
    from edgespec.server.pool import ModelPool

    shutil.copy(tiny["target"], tmp_path / "only.gguf")
    pool = ModelPool(FolderSource([tmp_path], n_ctx=512, n_threads=1), memory_budget=1 << 40)
    s = ServerThread(create_app(None, pool=pool))
    try:
        B.open_page(drv, s.url, settings={"temperature": 0, "max_tokens": 12})
        wait_for(lambda: "only" in drv.execute_script("return document.querySelector('#model-line').textContent"), 30,
                 "the model line")
        assert "undefined" not in drv.execute_script("return document.querySelector('#model-line').textContent")
        B.send(drv, "the cat")
        B.wait_answer(drv)
        text = drv.execute_script("return document.querySelector('.message.assistant').textContent")
        assert "model_required" not in text and "model is required" not in text and pool.get("only") is not None, text
    finally:
        s.stop()
        pool.close()
