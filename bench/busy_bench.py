#!/usr/bin/env python3
"""Decoding speed on a machine that is not idle: edgespec against llama-cpp-python with fixed thread counts.

    .venv/bin/python bench/busy_bench.py                       # quiet, busy and switching load; prints a table
    .venv/bin/python bench/busy_bench.py --loads busy --prompts-per-suite 2 --json-out busy.json

Systems, each in its own process (loaded once, then fed prompts one at a time over a pipe):

* ``edgespec``        the defaults: threads chosen by the engine, the default drafter (model + n-gram with a draft);
* ``edgespec-plain``  the same engine decoding plainly (``speculative=False``);
* ``edgespec-plain-Nt`` (not run by default) plain decoding with all cores fixed: what the thread tuner costs;
* ``llama-1t``        llama-cpp-python's ``Llama.create_completion`` with 1 thread (what its user gets);
* ``llama-Nt``        the same with all cores;
* ``edgespec-base``   (with ``--baseline-root DIR``) the defaults of the edgespec checkout in DIR: a before/after pair in
  one window;
* ``server-spec`` / ``server-plain``  one ``edgespec serve`` app (in its own process, over 127.0.0.1) answering
  llama.cpp ``/completion`` streams with ``speculative: true`` / ``false``: the server path, paired on one engine.

Loads: ``quiet`` (nothing else running), ``busy`` (one other process spinning on one core the whole time) and
``switching`` (that process stopped and resumed every ``--switch-period`` seconds). Every prompt goes to every
system in turn (the order rotating from prompt to prompt), greedy, the same token ids on every side (chat prompts
are rendered with the model's template by edgespec and passed as ids to llama-cpp-python too).

Per request: decode tokens/s measured the same way on every side, from outside: the tokens after the first chunk
over the time from the first chunk to the last (prompt processing excluded), and the largest gap between two
chunks (a stall). The table gives per system and load the median and p5 of the per-request rates, the largest stall,
and edgespec's median over the best fixed-thread llama-cpp-python median. edgespec's requests also report the
seconds they spent measuring costs (none: costs are learnt from live decodes) and the thread counts they used.

``--pairs A/B,...`` adds a paired table: per load and suite, the ratio of A's rate to B's on the same prompt (run
seconds apart), median and lowest over the prompts, and the load average seen. Speculation is "never slower" where
edgespec/edgespec-plain and server-spec/server-plain stay >= 0.97 in every row.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# an edgespec-base worker imports the checkout given by --baseline-root (this script drives it)
sys.path.insert(0, os.environ.get("BUSY_BENCH_CODE", str(ROOT)))


def log(msg: str) -> None:
    print(f"[busy] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------- workers
def _external_rate(times: list[float], counts: list[int]) -> tuple[float, float]:
    """(tokens/s after the first chunk, largest gap between chunks) from chunk arrival times and token counts."""
    if len(times) < 2:
        return 0.0, 0.0
    span = times[-1] - times[0]
    rate = sum(counts[1:]) / span if span > 0 else 0.0
    return rate, max(b - a for a, b in zip(times, times[1:]))


def worker(system: str, target: str, draft: str | None, n_ctx: int) -> None:
    """Serve requests from stdin ({"ids": [...], "max_tokens": n, "system": name}) as JSON lines on stdout."""
    out = sys.stdout
    sys.stdout = sys.stderr  # nothing but results on the pipe
    n_cores = len(os.sched_getaffinity(0))
    if system == "server":
        run = _server_worker(target, draft, n_ctx)
    elif system.startswith("llama-"):
        from llama_cpp import Llama

        threads = 1 if system == "llama-1t" else n_cores
        llm = Llama(model_path=target, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)

        def run(ids: list[int], max_tokens: int) -> dict[str, Any]:
            llm.reset()
            times, counts = [], []
            for _ in llm.create_completion(ids, max_tokens=max_tokens, temperature=0.0, stream=True):
                times.append(time.perf_counter())
                counts.append(1)
            rate, gap = _external_rate(times, counts)
            return {"tokens": sum(counts), "rate": rate, "max_gap": gap, "threads": threads}
    else:
        from edgespec import Engine, ModelSpec, SamplingParams

        import edgespec

        log(f"{system}: edgespec from {edgespec.__file__}")
        fixed = n_cores if system == "edgespec-plain-Nt" else None  # threads fixed: what the tuner costs or saves
        eng = Engine.load(ModelSpec(target, n_ctx=n_ctx, n_threads=fixed), ModelSpec(draft, n_ctx=n_ctx) if draft else None)
        speculative = system in ("edgespec", "edgespec-base")

        def run(ids: list[int], max_tokens: int) -> dict[str, Any]:
            eng.reset_caches()
            times, counts = [], []
            gen = eng.stream(tokens=ids, sampling=SamplingParams(temperature=0), max_tokens=max_tokens, speculative=speculative)
            for chunk in gen:
                times.append(time.perf_counter())
                counts.append(len(chunk.tokens))
            st = gen.result().stats
            rate, gap = _external_rate(times, counts)
            return {
                "tokens": st.n_generated,
                "rate": rate,
                "max_gap": gap,
                "engine_rate": st.tokens_per_second,
                "threads": st.threads,
                "acceptance": st.acceptance if st.n_drafted else None,
                "measure_seconds": 0.0,  # nothing is measured inside a request (engine.py); kept explicit for the table
                "cycles": {"sources": dict(st.source_counts), "drafted": st.n_drafted, "accepted": st.n_accepted,
                           "draft_s": round(st.timings.draft, 3), "target_s": round(st.timings.target, 3),
                           "overhead_s": round(st.timings.overhead, 3)},
                "guard": (st.controller or {}).get("guard"),
            }

    print(json.dumps({"ready": system}), file=out, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if system == "server":
            print(json.dumps(run(req["ids"], req["max_tokens"], req["system"] == "server-spec")), file=out, flush=True)
        else:
            print(json.dumps(run(req["ids"], req["max_tokens"])), file=out, flush=True)


def _server_worker(target: str, draft: str | None, n_ctx: int) -> Any:
    """An `edgespec serve` app over one engine in a uvicorn thread; run(ids, max_tokens, speculative) streams one
    llama.cpp /completion request to it and measures it from the client's side."""
    import socket

    import httpx
    import uvicorn

    from edgespec import Engine, ModelSpec
    from edgespec.server.app import create_app

    eng = Engine.load(ModelSpec(target, n_ctx=n_ctx), ModelSpec(draft, n_ctx=n_ctx) if draft else None)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(create_app(eng), log_level="warning", lifespan="on"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    for _ in range(600):
        if server.started:
            break
        time.sleep(0.1)
    client = httpx.Client(timeout=600)

    def run(ids: list[int], max_tokens: int, speculative: bool) -> dict[str, Any]:
        eng.reset_caches()
        body = {"prompt": ids, "n_predict": max_tokens, "stream": True, "temperature": 0, "speculative": speculative}
        times: list[float] = []
        counts: list[int] = []
        last: dict[str, Any] = {}
        with client.stream("POST", url + "/completion", json=body) as r:
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                ev = json.loads(line[5:])
                if ev.get("stop"):
                    last = ev
                    continue
                times.append(time.perf_counter())
                counts.append(max(1, len(ev.get("tokens") or [])))
        rate, gap = _external_rate(times, counts)
        es = last.get("edgespec", {}) if isinstance(last, dict) else {}
        return {"tokens": last.get("tokens_predicted", sum(counts)), "rate": rate, "max_gap": gap, "mu": es.get("mu"),
                "drafter": es.get("drafter")}

    return run


class Worker:
    def __init__(self, system: str, target: str, draft: str | None, n_ctx: int, root: str | None = None) -> None:
        cmd = [sys.executable, __file__, "--worker", system, "--target", target, "--ctx", str(n_ctx)]
        if draft:
            cmd += ["--draft", draft]
        self.system = system
        env = {**os.environ, "BUSY_BENCH_CODE": str(Path(root).resolve()), "PYTHONPATH": str(Path(root).resolve())} if root else None
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        if not ready:
            raise SystemExit(f"busy_bench: the {system} worker did not start")

    def ask(self, ids: list[int], max_tokens: int, system: str = "") -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"ids": ids, "max_tokens": max_tokens, "system": system}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"busy_bench: the {self.system} worker died")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# --------------------------------------------------------------------------------------------- load
class Load:
    """One process spinning on a core: always on (busy), toggled every period (switching), or none (quiet)."""

    def __init__(self, kind: str, period: float) -> None:
        self.kind, self.period = kind, period
        self.proc: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "Load":
        if self.kind != "quiet":
            self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            if self.kind == "switching":
                self._thread = threading.Thread(target=self._toggle, daemon=True)
                self._thread.start()
        return self

    def _toggle(self) -> None:
        on = True
        while not self._stop.wait(self.period):
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGSTOP if on else signal.SIGCONT)
            on = not on

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()


# --------------------------------------------------------------------------------------------- driver
def prompts(per_suite: int, target: str, suites: list[str] | None = None) -> list[tuple[str, list[int]]]:
    """(suite, token ids) for the first prompts of every built-in suite, rendered by edgespec's template."""
    from edgespec import Engine, ModelSpec
    from edgespec.bench import load_suites

    out = []
    with Engine.load(ModelSpec(target, n_ctx=4096), calibrate_costs=False) as eng:
        for suite, entries in load_suites().items():
            if suites and suite not in suites:
                continue
            for e in entries[:per_suite]:
                ids = eng.prompt_tokens(e["prompt"]) if "prompt" in e else eng.prompt_tokens(messages=e["messages"])
                out.append((suite, ids))
    return out


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q * (len(v) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--loads", default="quiet,busy,switching")
    ap.add_argument("--systems", default="edgespec,edgespec-plain,llama-1t,llama-Nt")
    ap.add_argument("--prompts-per-suite", type=int, default=1)
    ap.add_argument("--suites", help="comma-separated suite names (default: every built-in suite)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--switch-period", type=float, default=3.0)
    ap.add_argument("--json-out")
    ap.add_argument("--baseline-root", help="an edgespec checkout whose defaults run as system edgespec-base")
    ap.add_argument("--pairs", default="", help="comma-separated A/B system pairs for the paired table, e.g. "
                    "edgespec/edgespec-plain,server-spec/server-plain")
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.target, args.draft, args.ctx)
        return
    if not args.target:
        from edgespec.models import resolve_model

        args.target = str(resolve_model(None, "target"))
        args.draft = args.draft or str(resolve_model(None, "draft"))
    systems = args.systems.split(",")
    loads = args.loads.split(",")
    todo = prompts(args.prompts_per_suite, args.target, args.suites.split(",") if args.suites else None)
    log(f"{len(todo)} prompts, systems {systems}, loads {loads}, {os.cpu_count()} cores")
    # the server's two systems share one worker (one engine, as one server answers both kinds of request)
    names = {s: ("server" if s.startswith("server-") else s) for s in systems}
    with_draft = ("edgespec", "edgespec-base", "server")
    workers: dict[str, Worker] = {}
    for name in dict.fromkeys(names.values()):
        root = args.baseline_root if name == "edgespec-base" else None
        workers[name] = Worker(name, args.target, args.draft if name in with_draft else None, args.ctx, root)
    runs: list[dict[str, Any]] = []
    try:
        for load in loads:
            with Load(load, args.switch_period):
                time.sleep(1.0)
                for i, (suite, ids) in enumerate(todo):
                    order = systems[i % len(systems):] + systems[: i % len(systems)]
                    for s in order:
                        r = workers[names[s]].ask(ids, args.max_tokens, s)
                        r.update(system=s, load=load, suite=suite, prompt=i, loadavg=os.getloadavg()[0])
                        runs.append(r)
                        log(f"{load:9} {suite:16} {s:15} {r['rate']:6.1f} tok/s  max gap {1000 * r['max_gap']:6.0f} ms")
    finally:
        for w in workers.values():
            w.close()
    table = summarize(runs, systems, loads)
    pairs = [tuple(p.split("/")) for p in args.pairs.split(",") if p]
    if pairs:
        table += [""] + paired(runs, pairs, loads)  # type: ignore[arg-type]
    print("\n".join(table))
    if args.json_out:
        from edgespec.fsutil import atomic_write_text

        atomic_write_text(Path(args.json_out), json.dumps({"args": vars(args), "runs": runs, "table": table}, indent=1))


def summarize(runs: list[dict[str, Any]], systems: list[str], loads: list[str]) -> list[str]:
    lines = [
        "| load | system | median tok/s | p5 tok/s | largest stall (ms) | x best fixed llama-cpp-python (median) | threads used |",
        "|---|---|---|---|---|---|---|",
    ]
    for load in loads:
        meds = {}
        for s in systems:
            rates = [r["rate"] for r in runs if r["load"] == load and r["system"] == s]
            if rates:
                meds[s] = statistics.median(rates)
        fixed = [meds[s] for s in ("llama-1t", "llama-Nt") if s in meds]
        best = max(fixed) if fixed else None
        for s in systems:
            rs = [r for r in runs if r["load"] == load and r["system"] == s]
            if not rs:
                continue
            rates = [r["rate"] for r in rs]
            used: dict[str, int] = {}
            for r in rs:
                th = r.get("threads")
                if isinstance(th, dict):
                    for c, n in th.get("target", {}).get("decodes", {}).items():
                        used[c] = used.get(c, 0) + n
            threads = ", ".join(f"{c}t: {n}" for c, n in sorted(used.items())) if used else str(rs[0].get("threads", ""))
            ratio = f"{meds[s] / best:.2f}" if best else "-"
            lines.append(
                f"| {load} | {s} | {meds[s]:.1f} | {pct(rates, 0.05):.1f} | {1000 * max(r['max_gap'] for r in rs):.0f} | {ratio} | {threads} |"
            )
    return lines


def paired(runs: list[dict[str, Any]], pairs: list[tuple[str, str]], loads: list[str]) -> list[str]:
    """Per load, pair and suite: A's rate over B's on the same prompt (median, lowest, how many pairs), and the load
    average seen during those requests."""
    lines = ["| load | pair | suite | pairs | median ratio | lowest ratio | load average |", "|---|---|---|---|---|---|---|"]
    for load in loads:
        for a, b in pairs:
            rows: dict[str, list[float]] = {}
            seen: list[float] = []
            for r in runs:
                if r["load"] != load or r["system"] != a:
                    continue
                other = [x for x in runs if x["load"] == load and x["system"] == b and x["prompt"] == r["prompt"]]
                if other and other[0]["rate"] > 0:
                    rows.setdefault(r["suite"], []).append(r["rate"] / other[0]["rate"])
                    seen += [r["loadavg"], other[0]["loadavg"]]
            every = [v for vs in rows.values() for v in vs]
            for suite, vs in list(rows.items()) + ([("all", every)] if every else []):
                lines.append(
                    f"| {load} | {a} / {b} | {suite} | {len(vs)} | {statistics.median(vs):.2f} | {min(vs):.2f} | "
                    f"{min(seen):.1f}-{max(seen):.1f} |"
                )
    return lines


if __name__ == "__main__":
    main()
