"""The chat page's screenshot in docs/ and its measurements: drives headless Chromium (tests/support/browser.py, the
same code as tests/server/test_page.py) against a running `edgespec serve`, asks one question with the token sources
coloured, then races it, saves a screenshot, and prints the page's first paint and the animation frames seen while
the first answer streamed.

    edgespec serve --port 8080 &                         # the default pair, one slot
    python scripts/web_page.py --url http://127.0.0.1:8080 --out docs/web.png
    python scripts/web_page.py --tiny --out /tmp/web.png  # a server over the tests' tiny models, started here

Needs chromium, chromium-driver and selenium (scripts/setup.sh installs them with the test extras)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

PROMPT = "Write a Python function that checks whether a string is a palindrome, with a one-line docstring."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running edgespec serve (default with --tiny: one started here)")
    ap.add_argument("--tiny", action="store_true", help="start a server over the tests' tiny models instead")
    ap.add_argument("--out", default=str(ROOT / "docs" / "web.png"), help="the screenshot (PNG)")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--max-tokens", type=int, default=120)
    ap.add_argument("--width", type=int, default=1200)
    ap.add_argument("--height", type=int, default=860)
    args = ap.parse_args()

    from support import browser as B

    why = B.browser_missing()
    if why is not None:
        print(f"web_page: {why}", file=sys.stderr)
        return 1
    srv = eng = None
    url = args.url
    if args.tiny:
        from edgespec.server import create_app
        from support.engines import load
        from support.server_thread import ServerThread
        from support.tiny import write_tiny_set

        tiny = write_tiny_set(tempfile.mkdtemp(prefix="edgespec-web-"))
        eng = load(tiny["target"], tiny["draft"])
        srv = ServerThread(create_app(eng))
        url = srv.url
    if not url:
        print("web_page: give --url of a running edgespec serve, or --tiny", file=sys.stderr)
        return 2
    drv = B.chrome(args.width, args.height)
    try:
        got = B.demo(drv, url.rstrip("/"), args.out, args.prompt, max_tokens=args.max_tokens)
    finally:
        drv.quit()
        if srv is not None:
            srv.stop()
        if eng is not None:
            eng.close()
    size = Path(args.out).stat().st_size
    print(json.dumps({"screenshot": args.out, "bytes": size, **got}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
