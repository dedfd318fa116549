#!/usr/bin/env python
"""What the HTTP server costs: tokens/s and time to first token through `edgespec serve` vs the same engine called
in-process, on the same prompts, interleaved.

    .venv/bin/python bench/bench_server.py                      # the real pair when cached, else the tiny pair
    .venv/bin/python bench/bench_server.py --tiny --reps 5      # the tiny test models (worst case for overhead)
    .venv/bin/python bench/bench_server.py --mode process       # the server as a separate `edgespec serve` process

Each measured run starts from a cold cache (a fresh nonce in the prompt, and in thread mode the engine's caches
emptied), greedy, so both sides generate the same tokens; the order of the two sides alternates run by run.

* thread mode (default): one Engine; the server runs in a thread of this process on it. Only the HTTP layer
  differs between the sides: request parsing, the queue hop, SSE framing, loopback, and the client's parsing.
* process mode: the real command in a subprocess with the same options, and an Engine of its own here.

Besides the totals, the median of the per-run ratios is printed: it is robust to the other processes of a shared
machine.

The wall-clock comparison is only as steady as the machine: on a shared or loaded one, other processes' work
lands on either side at random. The script therefore also reports (thread mode, Linux) the CPU time the HTTP
layer itself used: the server's event-loop thread and its helper threads (request parsing, tokenizing), as a
share of the server runs' wall time. That is what the server takes from the engine at most, whatever the noise.

Client side of the server runs: raw httpx streaming over a kept-alive connection; TTFT = request sent -> first
content delta; tok/s = completion tokens / (request sent -> `[DONE]`). In-process: `engine.stream(...)`,
TTFT = call -> first chunk, tok/s = tokens / (call -> end).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # edgespec from this checkout; the tests' support package (tiny models, the server process)

import httpx  # noqa: E402
from support.serve_process import ServeProcess  # noqa: E402
from support.tiny import write_tiny_set  # noqa: E402

from edgespec.config import ModelSpec, SamplingParams  # noqa: E402
from edgespec.runtime.engine import Engine  # noqa: E402

PROMPTS = [
    "Write a Python function that reverses a linked list.",
    "Describe the water cycle in three sentences.",
    "List five tips for writing readable code.",
    "Write a bash one-liner that counts lines in all .py files recursively.",
    "What is 17 * 23? Show the steps.",
    "Write a JavaScript debounce function.",
]


def models(args: argparse.Namespace) -> tuple[str, str | None, str]:
    if args.target:
        return args.target, args.draft, "given"
    if not args.tiny:
        try:
            from edgespec.models import resolve_model

            return str(resolve_model(None, "target")), str(resolve_model(None, "draft")), "real pair"
        except Exception as e:  # noqa: BLE001 - any reason: fall back to the tiny pair
            print(f"real pair not usable ({e}); using the tiny pair", file=sys.stderr)
    files = write_tiny_set(Path(tempfile.mkdtemp(prefix="edgespec-bench-")))
    return str(files["target"]), str(files["draft"]), "tiny pair"


def thread_cpu(native_ids: set[int]) -> float:
    """CPU seconds used so far by these threads of this process (Linux /proc; 0 elsewhere)."""
    total = 0
    for tid in native_ids:
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def server_threads(server: "ThreadServer") -> set[int]:
    """The uvicorn thread and anyio's worker threads (the HTTP layer); not the engine's worker or llama.cpp's."""
    ids = {server.thread.native_id} if server.thread.native_id else set()
    return ids | {t.native_id for t in threading.enumerate() if t.name.startswith("AnyIO worker") and t.native_id}


class ThreadServer:
    def __init__(self, engine: Engine) -> None:
        import uvicorn

        from edgespec.server import create_app

        # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say so (accepted ones inherit it); without
        # it, Nagle's algorithm and the client's delayed ACK hold each small write back by up to 40 ms
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(create_app(engine), log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def process_server(args: argparse.Namespace, target: str, draft: str | None) -> ServeProcess:
    cmd = ["--target", target, "--ctx", str(args.ctx), "--log-level", "warning", "--n-gpu-layers", str(args.ngl)]
    cmd += ["--draft", draft] if draft else ["--no-draft"]
    if args.fixed_k:
        cmd += ["--fixed-k", "--draft-max", str(args.fixed_k)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    return ServeProcess(cmd, timeout=900)  # the real pair loads and measures its costs first


def run_inprocess(engine: Engine, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    gen = engine.stream(messages=messages, sampling=SamplingParams(temperature=0), max_tokens=max_tokens)
    first = None
    for chunk in gen:
        if first is None and chunk.text:
            first = time.perf_counter()
    end = time.perf_counter()
    r = gen.result()
    return {"tokens": len(r.token_ids), "wall": end - t0, "ttft": (first or end) - t0, "text": r.text}


def run_server(client: httpx.Client, url: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    body = {"messages": messages, "temperature": 0, "max_tokens": max_tokens, "stream": True}
    t0 = time.perf_counter()
    first = None
    text, tokens = [], 0
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                break
            ch = json.loads(line[6:])
            if ch.get("usage"):
                tokens = ch["usage"]["completion_tokens"]
            if ch["choices"]:
                piece = ch["choices"][0]["delta"].get("content")
                if piece:
                    if first is None:
                        first = time.perf_counter()
                    text.append(piece)
    end = time.perf_counter()
    return {"tokens": tokens, "wall": end - t0, "ttft": (first or end) - t0, "text": "".join(text)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--tiny", action="store_true", help="use the tiny test models")
    ap.add_argument("--mode", choices=["thread", "process"], default="thread")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--ngl", type=int, default=0, help="GPU layers (-1 = all)")
    ap.add_argument("--fixed-k", type=int, default=None, metavar="K", help="draft exactly K tokens per cycle (no adaptive controller: less variance)")
    ap.add_argument("--json-out")
    args = ap.parse_args()

    target, draft, what = models(args)
    spec = lambda p: ModelSpec(p, n_ctx=args.ctx, n_threads=args.threads, n_gpu_layers=args.ngl)  # noqa: E731
    from edgespec.config import SpecConfig

    sc = SpecConfig(draft_max=args.fixed_k, adaptive=False) if args.fixed_k else None
    engine = Engine.load(spec(target), spec(draft) if draft else None, spec=sc)
    server = ThreadServer(engine) if args.mode == "thread" else process_server(args, target, draft)
    print(f"{what}: {os.path.basename(target)}" + (f" + {os.path.basename(draft)}" if draft else "") + f"; server in a {args.mode}", flush=True)
    rows = []
    client = httpx.Client(timeout=600)
    try:
        # warm-up, untimed: first-call costs (template compile, thread pools, connection) on both sides
        warm = [{"role": "user", "content": "warm up"}]
        run_inprocess(engine, warm, 8)
        run_server(client, server.url, warm, 8)
        print(f"{'run':>4} {'side':<11} {'tokens':>6} {'wall s':>7} {'tok/s':>8} {'TTFT ms':>8}")
        k = 0
        for rep in range(args.reps):
            for p in PROMPTS[: args.prompts]:
                k += 1
                messages = [{"role": "user", "content": f"[{k}] {p}"}]  # a fresh nonce: a cold prompt for both sides
                sides = ["in-process", "server"] if k % 2 else ["server", "in-process"]
                texts = {}
                for side in sides:
                    if args.mode == "thread":
                        engine.reset_caches()
                    if side == "in-process":
                        r = run_inprocess(engine, messages, args.max_tokens)
                    else:
                        tids = server_threads(server) if args.mode == "thread" else set()
                        cpu0 = thread_cpu(tids)
                        r = run_server(client, server.url, messages, args.max_tokens)
                        r["server_cpu"] = thread_cpu(server_threads(server) if args.mode == "thread" else set()) - cpu0
                    texts[side] = r.pop("text")
                    r.update(run=k, side=side, rep=rep)
                    rows.append(r)
                    print(f"{k:>4} {side:<11} {r['tokens']:>6} {r['wall']:>7.3f} {r['tokens'] / r['wall']:>8.1f} {1000 * r['ttft']:>8.1f}", flush=True)
                if texts["in-process"] != texts["server"]:
                    print(f"     note: run {k}: the two sides' texts differ (greedy near-tie between batched and single decoding)")
    finally:
        client.close()
        server.stop()
        engine.close()

    summary: dict[str, Any] = {"models": what, "target": target, "draft": draft, "mode": args.mode, "max_tokens": args.max_tokens}
    for side in ("in-process", "server"):
        rs = [r for r in rows if r["side"] == side]
        summary[side] = {
            "tokens": sum(r["tokens"] for r in rs),
            "seconds": round(sum(r["wall"] for r in rs), 4),
            "tok_s": round(sum(r["tokens"] for r in rs) / sum(r["wall"] for r in rs), 3),
            "ttft_ms_median": round(1000 * statistics.median(r["ttft"] for r in rs), 2),
        }
    a, b = summary["in-process"], summary["server"]
    summary["ratio"] = round(b["tok_s"] / a["tok_s"], 4)
    pairs = {}
    for r in rows:
        pairs.setdefault(r["run"], {})[r["side"]] = r["tokens"] / r["wall"]
    summary["ratio_median"] = round(statistics.median(p["server"] / p["in-process"] for p in pairs.values()), 4)
    srv_rows = [r for r in rows if r["side"] == "server"]
    summary["http_cpu_share"] = round(sum(r.get("server_cpu", 0.0) for r in srv_rows) / sum(r["wall"] for r in srv_rows), 5)
    print(f"\nin-process {a['tok_s']:.1f} tok/s, TTFT median {a['ttft_ms_median']:.1f} ms")
    print(f"server     {b['tok_s']:.1f} tok/s, TTFT median {b['ttft_ms_median']:.1f} ms")
    print(f"server / in-process: {summary['ratio']:.3f} over all runs ({100 * (1 - summary['ratio']):+.1f}% cost), "
          f"median per-run ratio {summary['ratio_median']:.3f} ({100 * (1 - summary['ratio_median']):+.1f}% cost); "
          f"TTFT {b['ttft_ms_median'] - a['ttft_ms_median']:+.1f} ms")
    if args.mode == "thread":
        print(f"HTTP layer CPU (event loop + helper threads): {100 * summary['http_cpu_share']:.2f}% of the server runs' wall time")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"summary": summary, "runs": rows}, indent=2))


if __name__ == "__main__":
    main()
