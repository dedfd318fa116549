"""Headless Chromium driven through selenium, for the chat page's tests (tests/server/test_page.py) and
scripts/web_page.py (the screenshot in docs/ and the page's measurements): `browser_missing` (why no browser can run
here, or None), `chrome` (a driver), and what both run on the page: `open_page`, `send`, `wait_answer`,
`watch_frames` / `frame_report`, `first_paint`, `requests_made`, `screenshot`.

Uses Debian's chromium and chromium-driver (/usr/bin/chromium, /usr/bin/chromedriver; scripts/setup.sh installs them),
or EDGESPEC_CHROMIUM / EDGESPEC_CHROMEDRIVER; selenium is given both paths, so it never looks for a driver online."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from .server_thread import wait_for

MESSAGE = "textarea[name=message]"
SEND = "button[name=send]"
STOP = "button[name=stop]"
SOURCES = ("draft", "lookup", "target")


def _paths() -> tuple[str | None, str | None]:
    browser = os.environ.get("EDGESPEC_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    driver = os.environ.get("EDGESPEC_CHROMEDRIVER") or shutil.which("chromedriver")
    return browser, driver


def browser_missing() -> str | None:
    """Why headless Chromium cannot be driven here (one line), or None when it can."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    browser, driver = _paths()
    if browser is None:
        return "no chromium on PATH (Debian: apt-get install chromium chromium-driver; or set EDGESPEC_CHROMIUM)"
    if driver is None:
        return "no chromedriver on PATH (Debian: apt-get install chromium-driver; or set EDGESPEC_CHROMEDRIVER)"
    return None


def chrome(width: int = 1200, height: int = 800) -> Any:
    """A headless Chromium (selenium WebDriver) with a window of width x height CSS pixels and its network log on."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = _paths()
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(browser)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run",
                "--disable-extensions", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-default-apps", "--hide-scrollbars", "--force-device-scale-factor=1",
                f"--window-size={width},{height}", "--force-color-profile=srgb"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    drv = webdriver.Chrome(options=opts, service=Service(executable_path=str(driver)))
    drv.set_script_timeout(30)
    return drv


def wait(drv: Any, cond: Callable[[], Any], timeout: float = 60.0, what: str = "a condition") -> Any:
    """Poll the page until cond() is true (server_thread.wait_for with a browser's timeout)."""
    return wait_for(cond, timeout, what)


def open_page(drv: Any, url: str, *, settings: dict[str, Any] | None = None, clear: bool = True) -> None:
    """Load the chat page at `url` (with a fresh local storage when `clear`), and set settings fields by name."""
    from selenium.webdriver.common.by import By

    drv.get(url + "/")
    if clear:
        drv.execute_script("localStorage.clear(); sessionStorage.clear();")
        drv.get(url + "/")
    wait(drv, lambda: drv.execute_script("return document.readyState") == "complete", what="the page to load")
    wait(drv, lambda: drv.find_elements(By.CSS_SELECTOR, MESSAGE), what="the message box")
    for name, value in (settings or {}).items():
        drv.execute_script(
            "const el = document.querySelector(`#settings-panel [name='${arguments[0]}']`); el.value = arguments[1];"
            "el.dispatchEvent(new Event('change', {bubbles: true}));", name, str(value))


def send(drv: Any, text: str) -> None:
    """Type `text` into the message box and press Enter."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = drv.find_element(By.CSS_SELECTOR, MESSAGE)
    box.clear()
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def idle(drv: Any) -> bool:
    """Whether no answer is streaming (Send enabled again)."""
    return bool(drv.execute_script(f"return !document.querySelector('{SEND}').disabled"))


def wait_answer(drv: Any, timeout: float = 120.0) -> None:
    wait(drv, lambda: drv.execute_script(f"return document.querySelector('{STOP}').disabled === false") or idle(drv),
         timeout=10, what="the answer to start")
    wait(drv, lambda: idle(drv), timeout=timeout, what="the answer to end")


def token_spans(drv: Any, root: str = ".message.assistant") -> list[tuple[str, str]]:
    """(text, data-source) of each token span of the last element matching `root`."""
    return [tuple(x) for x in drv.execute_script(
        "const all = document.querySelectorAll(arguments[0]); if (!all.length) return [];"
        "return [...all[all.length - 1].querySelectorAll('span[data-source]')].map(s => [s.textContent, s.dataset.source]);",
        root)]


WATCH_FRAMES = """
window.__frames = {gaps: [], longTasks: 0, longTaskMs: 0, running: true};
let last = performance.now();
const tick = (t) => { window.__frames.gaps.push(t - last); last = t; if (window.__frames.running) requestAnimationFrame(tick); };
requestAnimationFrame(tick);
try {
  new PerformanceObserver((list) => { for (const e of list.getEntries()) { window.__frames.longTasks++;
    window.__frames.longTaskMs += e.duration; } }).observe({type: 'longtask'});
} catch (e) {}
"""


def watch_frames(drv: Any) -> None:
    """Start counting animation frames and long tasks (>50 ms of script) in the page."""
    drv.execute_script(WATCH_FRAMES)


def frame_report(drv: Any) -> dict[str, Any]:
    """What watch_frames saw: frames, frame gaps over 2 frame times (a dropped frame, at 60 Hz: > 33.4 ms), the
    longest gap, long tasks."""
    f = drv.execute_script("window.__frames.running = false; return window.__frames;")
    gaps = f["gaps"][1:]
    return {"frames": len(gaps), "dropped": sum(1 for g in gaps if g > 33.4), "max_gap_ms": round(max(gaps, default=0), 1),
            "long_tasks": f["longTasks"], "long_task_ms": round(f["longTaskMs"], 1)}


def first_paint(drv: Any) -> dict[str, float]:
    """The page's paint timings (ms from navigation start): first-paint, first-contentful-paint."""
    entries = drv.execute_script("return performance.getEntriesByType('paint').map(e => [e.name, e.startTime]);")
    return {name: round(t, 1) for name, t in entries}


def requests_made(drv: Any) -> tuple[list[str], dict[str, str]]:
    """What the browser's network log holds since the last call: the URLs of the requests it sent, and {URL: why} of
    those it blocked before sending (`csp`: the page's Content-Security-Policy)."""
    asked, blocked = {}, {}
    for entry in drv.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        params = msg.get("params", {})
        if msg.get("method") == "Network.requestWillBeSent":
            asked[params["requestId"]] = params["request"]["url"]
        elif msg.get("method") == "Network.loadingFailed" and params.get("blockedReason"):
            blocked[params["requestId"]] = params["blockedReason"]
    return [u for r, u in asked.items() if r not in blocked], {asked.get(r, r): why for r, why in blocked.items()}


def console_errors(drv: Any) -> list[str]:
    """Severe messages in the browser's console since the last call (a CSP violation is one)."""
    return [e["message"] for e in drv.get_log("browser") if e.get("level") == "SEVERE"]


def screenshot(drv: Any, path: str | Path) -> Path:
    """A PNG of the window at `path`."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if not drv.save_screenshot(str(p)):
        raise AssertionError("the browser made no screenshot")
    return p


def demo(drv: Any, url: str, out: str | Path, prompt: str, *, max_tokens: int = 120) -> dict[str, Any]:
    """The page as docs/ shows it: one question answered with the sources coloured and a race under it, a screenshot
    of the window at `out`. Returns what was measured (first paint, frames while streaming the first answer)."""
    from selenium.webdriver.common.by import By

    open_page(drv, url, settings={"temperature": 0, "max_tokens": max_tokens, "seed": 1})
    paint = first_paint(drv)
    drv.find_element(By.CSS_SELECTOR, "input[name=sources]").click()
    watch_frames(drv)
    send(drv, prompt)
    wait_answer(drv, timeout=600)
    frames = frame_report(drv)
    drv.find_element(By.CSS_SELECTOR, "input[name=race]").click()
    send(drv, prompt)
    wait_answer(drv, timeout=600)
    screenshot(drv, out)
    return {"paint": paint, "frames": frames}


__all__ = ["MESSAGE", "SEND", "STOP", "SOURCES", "browser_missing", "chrome", "wait", "open_page", "send", "idle", "wait_answer",
           "token_spans", "watch_frames", "frame_report", "first_paint", "requests_made", "console_errors", "screenshot", "demo"]
