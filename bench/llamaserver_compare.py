"""edgespec serve --parallel 4 side by side with llama-server --parallel 4 (issue 34), on the same requests, on loopback.

    .venv/bin/python bench/llamaserver_compare.py --llama-server ~/.cache/edgespec/llamacpp/server-build/bin/llama-server

llama-server is built from the llama-cpp-python sdist's vendor/llama.cpp, the sources edgespec's wheel is built from,
with scripts/cmake_args.sh's CPU flags (bench/llamacpp_compare.py's fetch_sources unpacks them; configure with
-DLLAMA_BUILD_SERVER=ON and build the llama-server target). Three servers, one at a time, each on the default pair:
llama-server plain, llama-server with the draft model (-md), and edgespec serve (its default drafter; edgespec-plain:
`--no-draft`, on request with --only). Each gets:

1. aggregate: `--streams` chat requests of `--tokens` tokens sent at once (temperature 0); tokens/s = all completion
   tokens / wall seconds from the first request to the last answer;
2. short latency: a `--long-tokens` chat answer streams while `--shorts` 16-token completions are sent one at a time
   during it; their median and p95 latency against the same requests sent alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from edgespec.models import resolve_model  # noqa: E402
from parallel_bench import PROMPTS  # noqa: E402

SHORT_PROMPTS = ["def is_prime(n):\n    ", "import json\n\ndef load_config(path):\n    ",
                 "class Stack:\n    def push(self, x):\n        ", "for i in range(10):\n    "]
LONG = "Explain, with code examples in Python, how hash tables work: hashing, collisions, open addressing, chaining, resizing."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, name: str, cmd: list[str], port: int) -> None:
        self.name, self.url = name, f"http://127.0.0.1:{port}"
        self.log = open(f"/tmp/{name}.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name} did not start (log: /tmp/{name}.log)")
            time.sleep(0.5)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def chat(url: str, prompt: str, tokens: int) -> int:
    r = httpx.post(url + "/v1/chat/completions", timeout=600, json={
        "model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "temperature": 0})
    r.raise_for_status()
    return int(r.json()["usage"]["completion_tokens"])


def complete(url: str, prompt: str) -> float:
    t = time.perf_counter()
    r = httpx.post(url + "/v1/completions", timeout=600, json={"model": "m", "prompt": prompt, "max_tokens": 16, "temperature": 0})
    r.raise_for_status()
    return time.perf_counter() - t


def aggregate(url: str, streams: int, tokens: int) -> float:
    counts = [0] * streams

    def one(i: int) -> None:
        counts[i] = chat(url, PROMPTS[i % len(PROMPTS)], tokens)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def short_latency(url: str, shorts: int, long_tokens: int) -> dict[str, Any]:
    for p in SHORT_PROMPTS:  # warm: each short prompt once
        complete(url, p)
    alone = [complete(url, SHORT_PROMPTS[i % len(SHORT_PROMPTS)]) for i in range(shorts)]
    done = threading.Event()

    def long() -> None:
        chat(url, LONG, long_tokens)
        done.set()

    th = threading.Thread(target=long)
    th.start()
    time.sleep(2.0)  # the long answer is streaming
    during = []
    for i in range(shorts):
        if done.is_set():
            break
        during.append(complete(url, SHORT_PROMPTS[i % len(SHORT_PROMPTS)]))
    th.join()

    def stats(xs: list[float]) -> dict[str, float]:
        s = sorted(xs)
        return {"median_ms": round(statistics.median(s) * 1e3), "p95_ms": round(s[min(len(s) - 1, round(0.95 * (len(s) - 1)))] * 1e3)}

    return {"alone": stats(alone), "during": stats(during) if during else None, "during_count": len(during),
            "ratio_median": round(statistics.median(during) / statistics.median(alone), 2) if during else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", default=str(Path.home() / ".cache/edgespec/llamacpp/server-build/bin/llama-server"))
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--shorts", type=int, default=10)
    ap.add_argument("--long-tokens", type=int, default=400)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--only", default="llama,llama-md,edgespec")
    ap.add_argument("--rounds", type=int, default=1, help="aggregate rounds per server (each reported)")
    ap.add_argument("--aggregate-only", action="store_true", help="leave out the short-request latencies")
    ap.add_argument("--json", dest="json_out", default=None)
    a = ap.parse_args()
    target, draft = str(resolve_model(None, "target")), str(resolve_model(None, "draft"))
    ctx = 4096 * a.parallel
    common = [a.llama_server, "-m", target, "--parallel", str(a.parallel), "-c", str(ctx), "-t", str(a.threads),
              "--host", "127.0.0.1", "--log-disable"]
    edgespec = shutil.which("edgespec", path=str(ROOT / ".venv" / "bin")) or "edgespec"
    configs = {
        "llama": common,
        "llama-md": common + ["-md", draft],
        "edgespec": [edgespec, "serve", "--parallel", str(a.parallel), "--log-level", "warning"],
        "edgespec-plain": [edgespec, "serve", "--parallel", str(a.parallel), "--log-level", "warning", "--no-draft"],
    }
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "parallel": a.parallel,
                           "streams": a.streams, "tokens": a.tokens, "shorts": a.shorts, "long_tokens": a.long_tokens}
    for i, name in enumerate(a.only.split(",")):
        name_out = name if name not in out else f"{name} ({i + 1})"
        port = free_port()
        srv = Server(name, configs[name] + ["--port", str(port)], port)
        try:
            chat(srv.url, "warm up", 8)
            rounds = [round(aggregate(srv.url, a.streams, a.tokens), 2) for _ in range(max(1, a.rounds))]
            res: dict[str, Any] = {"aggregate_tok_s": rounds[0] if len(rounds) == 1 else rounds}
            if not a.aggregate_only:
                res["short"] = short_latency(srv.url, a.shorts, a.long_tokens)
        finally:
            srv.stop()
        out[name_out] = res
        print(name_out, res, file=sys.stderr)
    print(json.dumps(out, indent=1))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
