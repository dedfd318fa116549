"""The path a chat request takes through the package, from the HTTP body to the first llama_decode, as it runs.

    python scripts/call_path.py [--tiny-dir DIR]

Loads the tests' tiny models (tests/support/tiny.py writes them) in an Engine, serves one POST /v1/chat/completions
through the server's app in-process, and records, with a profiler hook on every thread: the call stack when the
request thread queues the generation (the worker's submit), the call stack when the worker thread reaches the
function that calls llama.cpp's llama_decode, and every package file entered on the way (the prompt's tokenizing
and templating included). Prints both stacks (package frames only), the files, and the counts: hops (calls that
cross from one file to another along the two stacks) and files. A developer's measure of how readable the path is;
it changes nothing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path.cwd()
PKG = str(ROOT / "edgespec")


def _chain(frame) -> list[str]:
    out = []
    while frame is not None:
        f = frame.f_code.co_filename
        if f.startswith(PKG):
            out.append(f"{Path(f).relative_to(ROOT)}:{frame.f_code.co_name}")
        frame = frame.f_back
    return out[::-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny-dir", help="where to write the tiny models (default: a temporary folder)")
    a = ap.parse_args()
    for sub in ("tests/support", "tests"):
        if (ROOT / sub / "tiny.py").exists():
            sys.path.insert(0, str(ROOT / sub))
    from tiny import write_tiny_set

    files = write_tiny_set(Path(a.tiny_dir or tempfile.mkdtemp()))
    seen: dict[str, object] = {"on": False, "submit": None, "decode": None}
    entered: list[str] = []

    def hook(frame, event, arg):
        if event != "call" or not seen["on"]:
            return
        code = frame.f_code
        if code.co_filename.startswith(PKG):
            rel = str(Path(code.co_filename).relative_to(ROOT))
            if not entered or entered[-1] != rel:
                entered.append(rel)
        if seen["submit"] is None and code.co_name == "submit" and code.co_filename.endswith("generation.py"):
            seen["submit"] = _chain(frame)
        if seen["decode"] is None and "llama_decode" in code.co_names and code.co_filename.startswith(PKG):
            seen["decode"] = _chain(frame)
            seen["on"] = False

    threading.setprofile(hook)
    sys.setprofile(hook)
    from starlette.testclient import TestClient

    from edgespec import Engine, ModelSpec
    from edgespec.server import create_app

    with Engine.load(ModelSpec(str(files["target"]), n_ctx=512, n_threads=1), None, drafter="none",
                     calibrate_costs=False, memory=False) as eng:
        with TestClient(create_app(eng), base_url="http://127.0.0.1:8080") as client:
            seen["on"] = True
            r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
            seen["on"] = False
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]
    if r.status_code != 200 or seen["submit"] is None or seen["decode"] is None:
        print(f"the path was not seen whole (HTTP {r.status_code}: {r.text[:200]})", file=sys.stderr)
        return 1
    stacks = {"request thread, at the queueing": seen["submit"], "worker thread, at llama_decode": seen["decode"]}
    hops = 0
    for name, chain in stacks.items():
        print(f"{name}:")
        prev = None
        for fr in chain:
            f = fr.split(":")[0]
            hops += prev is not None and f != prev
            prev = f
            print("   ", fr)
    stack_files = {fr.split(":")[0] for c in stacks.values() for fr in c}
    print(f"hops across files along the two stacks: {hops}; files in them: {len(stack_files)}")
    print(f"package files entered on the way (prompt building included): {len(set(entered))}")
    for f in sorted(set(entered)):
        print("   ", f, f"(entered {sum(1 for e in entered if e == f)} times)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
