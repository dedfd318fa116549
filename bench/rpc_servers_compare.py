"""The target over RPC, served: edgespec serve --rpc side by side with llama.cpp's llama-server --rpc (plain and with a
local draft model, -md), on the same prompts, per added network delay (issue 35; docs/benchmarks.md).

    .venv/bin/python bench/rpc_servers_compare.py                        # delays 0,10 ms, 3 suites x 2 prompts
    .venv/bin/python bench/rpc_servers_compare.py --delays 0,5,10 --prompts-per-suite 3 --json out.json

Two `edgespec rpc-server`s on loopback (started once) hold the target's layers; per delay a `edgespec.bench.delay_proxy.DelayProxy`
in front of each adds the round trip. Then, one server at a time (an rpc-server serves one client at a time), each on
the default pair with the target over both proxies and the draft on this machine:

- `edgespec serve --rpc P1,P2`: every prompt twice, plain (`"speculative": false`) then its default drafter;
- `llama-server --rpc P1,P2 -ngl 99`: llama.cpp plain;
- `llama-server --rpc P1,P2 -ngl 99 -md DRAFT -ngld 0`: llama.cpp's speculative decoding, its defaults.

llama-server is built from the llama-cpp-python sdist's vendor/llama.cpp (the sources of edgespec's wheel) with
-DGGML_RPC=ON (bench/llamaserver_compare.py says how). Each request: temperature 0, --max-tokens tokens, one at a
time; tokens/s of generation = completion tokens / the generation time each server reports (its `timings`,
llama-server's field names: prefill left out, so edgespec's reuse of a prompt's cached prefix for the second request
of a prompt does not flatter it), per suite and overall, and each system's ratio against llama-server plain at the
same delay; end-to-end tokens/s (wall time, prefill included) beside it. edgespec's two requests per prompt
alternate their order. Loopback only: the
rpc-servers share this machine's cores with the draft, so the absolute rates are lower than a real remote target's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent), str(ROOT / "tests")]

from llamaserver_compare import Server, free_port  # noqa: E402
from support.rpc_process import RpcServer  # noqa: E402

from edgespec.bench import load_suites  # noqa: E402
from edgespec.bench.delay_proxy import DelayProxy  # noqa: E402
from edgespec.models import resolve_model  # noqa: E402


def request(url: str, entry: dict[str, Any], max_tokens: int, extra: dict[str, Any] | None = None) -> tuple[int, float, str, float]:
    """One request: (completion tokens, wall seconds, text, generation seconds as the server's `timings` say)."""
    body: dict[str, Any] = {"model": "m", "max_tokens": max_tokens, "temperature": 0, **(extra or {})}
    if "prompt" in entry:
        path, body["prompt"] = "/v1/completions", entry["prompt"]
    else:
        path, body["messages"] = "/v1/chat/completions", entry["messages"]
    t = time.perf_counter()
    r = httpx.post(url + path, json=body, timeout=900)
    took = time.perf_counter() - t
    r.raise_for_status()
    j = r.json()
    choice = j["choices"][0]
    text = choice.get("text") if "prompt" in entry else choice["message"].get("content")
    gen = (j.get("timings") or {}).get("predicted_ms")
    return int(j["usage"]["completion_tokens"]), took, text or "", gen / 1e3 if gen else float("nan")


def run_system(name: str, cmd: list[str], prompts: list[tuple[str, dict[str, Any]]], a: argparse.Namespace,
               variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    port = free_port()
    srv = Server(f"rpc-{name}", cmd + ["--port", str(port)], port)
    rows: dict[str, list[tuple[str, int, float, str, float]]] = {v: [] for v in variants}
    try:
        request(srv.url, prompts[0][1], 8)  # warm up (the first decodes over the link)
        for i, (suite, entry) in enumerate(prompts):
            order = list(variants.items())
            for v, extra in order if i % 2 == 0 else order[::-1]:  # the second request of a prompt reuses its cached prefill
                n, took, text, gen = request(srv.url, entry, a.max_tokens, extra)
                rows[v].append((suite, n, took, text, gen))
    finally:
        srv.stop()
    return rows


def summary(rows: list[tuple[str, int, float, str, float]]) -> dict[str, Any]:
    """Per suite and overall: tokens, wall seconds, tok/s end to end (prefill included) and tok/s of generation alone
    (the servers' own timings.predicted_ms: the measure that a reused prompt prefix does not flatter)."""
    out: dict[str, Any] = {}
    for suite in [*dict.fromkeys(r[0] for r in rows), "all"]:
        sel = [r for r in rows if suite in ("all", r[0])]
        n, t, g = sum(r[1] for r in sel), sum(r[2] for r in sel), sum(r[4] for r in sel)
        out[suite] = {"tokens": n, "seconds": round(t, 2), "e2e_tok_s": round(n / t, 2), "tok_s": round(n / g, 2) if g == g and g > 0 else None}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", default=str(Path.home() / ".cache/edgespec/llamacpp/server-build/bin/llama-server"))
    ap.add_argument("--delays", default="0,10", help="added round-trip delays in ms, comma-separated")
    ap.add_argument("--suites", default="code-completion,input-grounded,coding-chat")
    ap.add_argument("--prompts-per-suite", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--server-threads", type=int, default=2, help="threads per rpc-server (they compute in turn)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="threads of the local side (the draft)")
    ap.add_argument("--only", default="edgespec,llama,llama-md")
    ap.add_argument("--json", dest="json_out", default=None)
    a = ap.parse_args()
    if not Path(a.llama_server).exists():
        raise SystemExit(f"no llama-server at {a.llama_server} (build it with -DGGML_RPC=ON: bench/llamaserver_compare.py)")
    target, draft = str(resolve_model(None, "target")), str(resolve_model(None, "draft"))
    suites = load_suites()
    prompts = [(s, e) for s in a.suites.split(",") for e in suites[s][:a.prompts_per_suite]]
    edgespec = shutil.which("edgespec", path=str(ROOT / ".venv" / "bin")) or "edgespec"
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "max_tokens": a.max_tokens,
                           "prompts": len(prompts), "delays": {}}
    servers = [RpcServer(threads=a.server_threads) for _ in range(2)]
    try:
        for d in (float(x) for x in a.delays.split(",")):
            proxies = [DelayProxy(("127.0.0.1", s.port), d) for s in servers]
            eps = ",".join(p.endpoint for p in proxies)
            llama = [a.llama_server, "-m", target, "--rpc", eps, "-ngl", "99", "-c", "4096", "--parallel", "1", "-t", str(a.threads),
                     "--host", "127.0.0.1", "--log-disable"]
            systems = {
                "edgespec": ([edgespec, "serve", "--rpc", eps, "--parallel", "1", "--log-level", "warning"],
                             {"edgespec-plain": {"speculative": False}, "edgespec": {}}),
                "llama": (llama, {"llama": {}}),
                "llama-md": (llama + ["-md", draft, "-ngld", "0"], {"llama-md": {}}),
            }
            res: dict[str, Any] = {}
            texts: dict[str, list[str]] = {}
            try:
                for name in a.only.split(","):
                    t0 = time.strftime("%H:%M", time.gmtime())
                    cmd, variants = systems[name]
                    for v, rows in run_system(name, cmd, prompts, a, variants).items():
                        res[v] = summary(rows)
                        texts[v] = [r[3] for r in rows]
                        print(f"[{t0} UTC] +{d:g} ms {v}: {res[v]['all']['tok_s']} tok/s ({res[v]['all']['e2e_tok_s']} end to end)",
                              file=sys.stderr, flush=True)
            finally:
                for p in proxies:
                    p.close()
            base = res.get("llama", {}).get("all", {}).get("tok_s")
            for r in res.values():
                r["vs_llama_plain"] = round(r["all"]["tok_s"] / base, 2) if base else None
            if "edgespec" in texts and "edgespec-plain" in texts:
                res["edgespec"]["identical_to_plain"] = sum(x == y for x, y in zip(texts["edgespec"], texts["edgespec-plain"]))
            out["delays"][str(d)] = res
            if a.json_out:
                Path(a.json_out).write_text(json.dumps(out, indent=1))
    finally:
        for s in servers:
            s.stop()
    print(table(out))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(out, indent=1))


def table(out: dict[str, Any]) -> str:
    lines = ["| added RTT (ms) | system | " + " | ".join(["tok/s all"] + ["tok/s " + s for s in _suites(out)])
             + " | vs llama-server plain | end to end tok/s |",
             "|---|---|" + "---|" * (len(_suites(out)) + 3)]
    for d, res in out["delays"].items():
        for v, r in res.items():
            cells = [f"{r['all']['tok_s']}"] + [f"{r[s]['tok_s']}" if s in r else "-" for s in _suites(out)]
            lines.append(f"| {float(d):g} | {v} | " + " | ".join(cells) + f" | {r['vs_llama_plain']} | {r['all']['e2e_tok_s']} |")
    return "\n".join(lines)


def _suites(out: dict[str, Any]) -> list[str]:
    for res in out["delays"].values():
        for r in res.values():
            return [s for s in r if s not in ("all", "vs_llama_plain", "identical_to_plain")]
    return []


if __name__ == "__main__":
    main()
