"""Speculation across a network: the target's layers on two loopback rpc-servers behind delaying proxies, the
draft local, plain vs speculative per added round-trip delay (issue 35; docs/rpc.md, docs/benchmarks.md).

    .venv/bin/python bench/rpc_bench.py                                  # delays 0,2,5,10 ms, 3 suites x 3 prompts
    .venv/bin/python bench/rpc_bench.py --delays 0,10 --prompts-per-suite 2 --max-tokens 64 --json out.json

Per delay it starts two `edgespec.bench.delay_proxy.DelayProxy`s in front of two `edgespec rpc-server`s (started once, loopback) and
runs `edgespec bench --rpc P1,P2` in a fresh process with a fresh cache folder (so the engine calibrates its cost
curve over this link, as a user's first load there does; the models are linked in from the user cache): plain and
speculative runs interleaved prompt by prompt, greedy. It reports per delay: the verify-cost curve the engine
measured (one token in ms, a batch of n relative to one), whether the draft model was used, and plain tok/s,
speculative tok/s and their ratio per suite.

On one machine the rpc-servers share its cores with the local draft: the absolute rates are lower than a real
remote target's; the ratios and the curve's shape are what this measures. Loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # this checkout; the server fixture

from support.rpc_process import RpcServer  # noqa: E402

from edgespec.bench.delay_proxy import DelayProxy  # noqa: E402

from edgespec.models import resolve_model  # noqa: E402
from edgespec.paths import cache_dir  # noqa: E402


def run_delay(rtt_ms: float, servers: list[RpcServer], a: argparse.Namespace, target: Path, draft: Path) -> dict[str, Any]:
    proxies = [DelayProxy(("127.0.0.1", s.port), rtt_ms) for s in servers]
    try:
        with tempfile.TemporaryDirectory(prefix="rpc-bench-") as tmp:
            (Path(tmp) / "models").symlink_to(cache_dir() / "models")
            cmd = [sys.executable, "-m", "edgespec", "bench", "--target", str(target), "--draft", str(draft),
                   "--rpc", ",".join(p.endpoint for p in proxies), "--temperature", "0", "--max-tokens", str(a.max_tokens),
                   "--json", "-q", "--prompts", a.prompts_file]
            env = {**os.environ, "PYTHONPATH": str(ROOT), "EDGESPEC_CACHE_DIR": tmp}
            t0 = time.monotonic()
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.timeout)
            if out.returncode != 0:
                raise SystemExit(f"bench at {rtt_ms} ms failed: {out.stderr.strip()[-2000:]}")
            report = json.loads(out.stdout)
            report["wall_seconds"] = round(time.monotonic() - t0, 1)
            return report
    finally:
        for p in proxies:
            p.close()


def _prompts_file(suites: list[str], per_suite: int, path: Path) -> None:
    from edgespec.bench import load_suites

    builtin = load_suites()
    with path.open("w") as f:
        for s in suites:
            for e in builtin[s][:per_suite]:
                f.write(json.dumps({**e, "suite": s}) + "\n")


def table(results: dict[float, dict[str, Any]]) -> str:
    lines = ["| added RTT (ms) | one token (ms) | batch 2 / 4 / 8 / 16 (x one) | draft model used | suite | plain tok/s | spec tok/s "
             "| spec / plain | identical |",
             "|---|---|---|---|---|---|---|---|---|"]
    for rtt, r in results.items():
        cal = r["costs"]["calibration"]
        v = {int(k): x for k, x in cal["verify"].items()}
        one = v.get(1)
        curve = " / ".join(f"{v[n] / one:.2f}" if n in v and one else "-" for n in (2, 4, 8, 16))
        rows = [(name, s) for name, s in r["suites"].items()] + [("all", r["overall"])]
        for i, (name, s) in enumerate(rows):
            head = (f"| {rtt:g} | {one * 1e3:.1f} | {curve} | {cal.get('draft_model_used')} " if i == 0 else "| | | | ")
            lines.append(head + f"| {name} | {s['plain']['tokens_per_second']:.2f} | {s['spec']['tokens_per_second']:.2f} | "
                         f"{s['speedup']:.2f} | {s['identical']}/{s['n_prompts']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--delays", default="0,2,5,10", help="added round-trip delays in ms, comma-separated")
    ap.add_argument("--suites", default="code-completion,input-grounded,coding-chat")
    ap.add_argument("--prompts-per-suite", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--server-threads", type=int, default=2, help="threads per rpc-server (they compute in turn)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per delay's bench")
    ap.add_argument("--json", dest="json_out", default=None, help="write every report here")
    a = ap.parse_args()
    target, draft = resolve_model(None, "target"), resolve_model(None, "draft")
    delays = [float(x) for x in a.delays.split(",")]
    results: dict[float, dict[str, Any]] = {}
    servers = [RpcServer(threads=a.server_threads) for _ in range(2)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            a.prompts_file = str(Path(tmp) / "prompts.jsonl")
            _prompts_file(a.suites.split(","), a.prompts_per_suite, Path(a.prompts_file))
            for d in delays:
                t0 = time.strftime("%H:%M", time.gmtime())
                results[d] = run_delay(d, servers, a, target, draft)
                print(f"[{t0}-{time.strftime('%H:%M', time.gmtime())} UTC] +{d:g} ms: spec/plain {results[d]['overall']['speedup']:.2f}, "
                      f"draft model used: {results[d]['costs']['calibration'].get('draft_model_used')}", file=sys.stderr, flush=True)
                if a.json_out:  # after every delay: a later failure keeps what was measured
                    Path(a.json_out).write_text(json.dumps({str(k): v for k, v in results.items()}, indent=1))
    finally:
        for s in servers:
            s.stop()
    print(table(results))


if __name__ == "__main__":
    main()
