#!/usr/bin/env python3
"""Decoding speed on a machine that is not idle: edgespec against llama-cpp-python with fixed thread counts.

    .venv/bin/python scripts/busy_bench.py                       # quiet, busy and switching load; prints a table
    .venv/bin/python scripts/busy_bench.py --loads busy --prompts-per-suite 2 --json-out busy.json

Systems, each in its own process (loaded once, then fed prompts one at a time over a pipe):

* ``edgespec``        the defaults: threads chosen by the engine, the default drafter (model + n-gram with a draft);
* ``edgespec-plain``  the same engine decoding plainly (``speculative=False``);
* ``edgespec-plain-Nt`` (not run by default) plain decoding with all cores fixed: what the thread tuner costs;
* ``llama-1t``        llama-cpp-python's ``Llama.create_completion`` with 1 thread (what its user gets);
* ``llama-Nt``        the same with all cores.

Loads: ``quiet`` (nothing else running), ``busy`` (one other process spinning on one core the whole time) and
``switching`` (that process stopped and resumed every ``--switch-period`` seconds). Every prompt goes to every
system in turn (the order rotating from prompt to prompt), greedy, the same token ids on every side (chat prompts
are rendered with the model's template by edgespec and passed as ids to llama-cpp-python too).

Per request: decode tokens/s measured the same way on every side, from outside: the tokens after the first chunk
over the time from the first chunk to the last (prompt processing excluded), and the largest gap between two
chunks (a stall). The table gives per system and load the median and p5 of the per-request rates, the largest stall,
and edgespec's median over the best fixed-thread llama-cpp-python median. edgespec's requests also report the
seconds they spent measuring costs (none: costs are learnt from live decodes) and the thread counts they used.
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
sys.path.insert(0, str(ROOT))


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
    """Serve requests from stdin ({"ids": [...], "max_tokens": n}) as JSON lines on stdout."""
    out = sys.stdout
    sys.stdout = sys.stderr  # nothing but results on the pipe
    n_cores = len(os.sched_getaffinity(0))
    if system.startswith("llama-"):
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

        fixed = n_cores if system == "edgespec-plain-Nt" else None  # threads fixed: what the tuner costs or saves
        eng = Engine.load(ModelSpec(target, n_ctx=n_ctx, n_threads=fixed), ModelSpec(draft, n_ctx=n_ctx) if draft else None)
        speculative = system == "edgespec"

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
            }

    print(json.dumps({"ready": system}), file=out, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        print(json.dumps(run(req["ids"], req["max_tokens"])), file=out, flush=True)


class Worker:
    def __init__(self, system: str, target: str, draft: str | None, n_ctx: int) -> None:
        cmd = [sys.executable, __file__, "--worker", system, "--target", target, "--ctx", str(n_ctx)]
        if draft:
            cmd += ["--draft", draft]
        self.system = system
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        if not ready:
            raise SystemExit(f"busy_bench: the {system} worker did not start")

    def ask(self, ids: list[int], max_tokens: int) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"ids": ids, "max_tokens": max_tokens}) + "\n")
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
    workers = {s: Worker(s, args.target, args.draft if s == "edgespec" else None, args.ctx) for s in systems}
    runs: list[dict[str, Any]] = []
    try:
        for load in loads:
            with Load(load, args.switch_period):
                time.sleep(1.0)
                for i, (suite, ids) in enumerate(todo):
                    order = systems[i % len(systems):] + systems[: i % len(systems)]
                    for s in order:
                        r = workers[s].ask(ids, args.max_tokens)
                        r.update(system=s, load=load, suite=suite, prompt=i, loadavg=os.getloadavg()[0])
                        runs.append(r)
                        log(f"{load:9} {suite:16} {s:15} {r['rate']:6.1f} tok/s  max gap {1000 * r['max_gap']:6.0f} ms")
    finally:
        for w in workers.values():
            w.close()
    table = summarize(runs, systems, loads)
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


if __name__ == "__main__":
    main()
