"""The server's memory across many requests: does it leak, or is it the prompt cache (docs/server.md, "KV reuse")?

Serves the tiny test pair (tests/support/tiny.py) from uvicorn in a thread and sends rounds of requests with distinct
prompts, in four kinds: a chat completion, a streamed chat completion closed after a few events (a cancel), a Responses
call (stored) and a streamed /completion closed early. After each round it prints the process's RSS (after gc and
glibc's malloc_trim, so freed heap does not count), the prompt caches' entries and bytes per model, the request records
and the Responses store kept, and with --trace what tracemalloc saw grow (tracemalloc's own bookkeeping then adds
RSS: compare RSS without it).

    .venv/bin/python bench/server_memory.py --prompt-cache-mb 0     # without the cache: what else grows
    .venv/bin/python bench/server_memory.py                         # the default cache (256 MiB per model)
    .venv/bin/python bench/server_memory.py --prompt-cache-mb 2 --trace
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the tests' support package (tiny models, the server thread)

import httpx  # noqa: E402

from edgespec.server import create_app  # noqa: E402
from support.engines import load  # noqa: E402
from support.server_thread import ServerThread  # noqa: E402
from support.tiny import write_tiny_set  # noqa: E402


def rss_mib() -> float:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def send(url: str, n: int, start: int) -> None:
    with httpx.Client(timeout=300) as c:
        for i in range(start, start + n):
            words = " ".join(f"w{i}x{j}" for j in range(40 + i % 30))  # distinct prompts: each leaves a conversation
            kind = i % 4
            if kind == 0:
                c.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": words}], "max_tokens": 24})
            elif kind == 2:
                c.post(url + "/v1/responses", json={"input": words, "max_output_tokens": 16})
            else:
                path, body = (("/v1/chat/completions", {"messages": [{"role": "user", "content": words}], "max_tokens": 400})
                              if kind == 1 else ("/completion", {"prompt": words, "n_predict": 400}))
                with c.stream("POST", url + path, json={**body, "stream": True}) as r:
                    for k, _ in enumerate(r.iter_lines()):
                        if k > 3:
                            break  # closed early: the server cancels the generation


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt-cache-mb", type=float, default=256)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--per-round", type=int, default=70)
    ap.add_argument("--trace", action="store_true", help="tracemalloc: what grew in the Python heap, per round")
    a = ap.parse_args()
    tiny = write_tiny_set(Path(tempfile.mkdtemp(prefix="edgespec-mem-")))
    eng = load(tiny["target"], tiny["draft"], prompt_cache_mb=a.prompt_cache_mb)
    srv = ServerThread(create_app(eng))

    def state() -> str:
        caches = []
        for name in ("target", "draft"):
            pc = getattr(getattr(eng, name, None), "prompt_cache", None)
            if pc is not None:
                caches.append(f"{name} cache {len(pc)} entries {pc.bytes / 2**20:.1f} MiB")
        st = srv.state
        return ", ".join(caches + [f"records {len(st.records)}", f"stored {len(st.stored)}", f"threads {threading.active_count()}"])

    try:
        if a.trace:
            tracemalloc.start(6)
        send(srv.url, 40, 0)  # warm up: first requests, worker threads
        base = rss_mib()
        snap = tracemalloc.take_snapshot() if a.trace else None
        print(f"prompt_cache_mb {a.prompt_cache_mb:g}; after 40 requests of warm-up: RSS {base:.1f} MiB; {state()}", flush=True)
        for k in range(1, a.rounds + 1):
            t0 = time.perf_counter()
            send(srv.url, a.per_round, 1000 * k)
            rss = rss_mib()
            print(f"+{a.per_round * k} requests ({time.perf_counter() - t0:.0f} s): RSS {rss:.1f} MiB ({rss - base:+.1f}); {state()}", flush=True)
            if snap is not None:
                new = tracemalloc.take_snapshot()
                for st in new.compare_to(snap, "traceback")[:4]:
                    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in list(st.traceback)[::-1][:4])
                    print(f"    {st.size_diff / 1024:+.0f} KiB {st.count_diff:+d} blocks: {where}")
                snap = new
    finally:
        srv.stop()
        eng.close()


if __name__ == "__main__":
    main()
