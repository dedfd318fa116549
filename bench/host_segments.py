#!/usr/bin/env python3
"""Where the loop's own work per token goes, segment by segment, on the real pair: between one llama_decode's return
and the next one's call, the time from each marked point of the engine to the next (median per cycle, and the total).

    .venv/bin/python bench/host_segments.py                   # plain greedy, 4 generations x 96 tokens
    .venv/bin/python bench/host_segments.py --drafter model   # the draft model at fixed k = 8
    .venv/bin/python bench/host_segments.py --bare            # the floor: a bare llama.cpp loop, nothing of edgespec's

How: the package is copied to a temporary folder and a `perf_counter` mark is written into the copy before each
anchor line below (MARKS; a missing anchor stops the script naming it), so the checkout itself is never changed and
each mark costs one list append. --bare: llama_decode through the binding and np.argmax of the row, one token at a
time, with the same 2 threads: the host time any Python loop over this binding pays on this machine (its gap between
decodes), with and without reading the row.
"""

from __future__ import annotations

import argparse
import builtins
import ctypes
import collections
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

# (file, anchor text, mark name, before the anchor's line (True) or after it)
MARKS = [
    ("llama/context.py", "rc = int(C.llama_decode(self.ctx, self.batch))", "decode call", True),
    ("llama/context.py", "rc = int(C.llama_decode(self.ctx, self.batch))", "decode returned", False),
    ("runtime/slots.py", "        return out\n\n\n__all__", "rows to the worker", True),
    ("runtime/speculate.py", "verdict = verify(draft, q, logits, ctx", "rows to the loop", True),
    ("runtime/speculate.py", "n = verdict.n_accepted\n    target.truncate(L + n)", "verdict", True),
    ("runtime/speculate.py", "        self.accept(c)\n        self.observe(c)", "accept", True),
    ("runtime/speculate.py", "        self.observe(c)\n        return c", "observe", True),
    ("runtime/speculate.py", "yield cycle.step()", "step out", True),
    ("runtime/runner.py", "yield None  # a cycle boundary", "text handed over", True),
    ("runtime/generation.py", "if self._quiet():", "worker loop", True),
    ("runtime/speculate.py", "proposal = self.speculator.propose(self.ctx + forced", "propose", True),
    ("runtime/speculate.py", "got = yield v", "decode asked", True),
    ("llama/slot.py", "self.context.live()\n        if start_pos != self.n_past:", "slot decode", True),
]


def instrumented_copy(dest: Path) -> None:
    shutil.copytree(ROOT / "edgespec", dest / "edgespec")
    for rel, anchor, name, before in MARKS:
        path = dest / "edgespec" / rel
        s = path.read_text()
        idx = s.find(anchor)
        if idx < 0:
            raise SystemExit(f"host_segments: anchor for {name!r} not found in edgespec/{rel}: update MARKS")
        start = s.rfind("\n", 0, idx) + 1
        indent = re.match(r"\s*", s[start:]).group(0)  # type: ignore[union-attr]
        stmt = f"{indent}__import__('builtins').HOST_MARKS.append(({name!r}, __import__('time').perf_counter()))\n"
        at = start if before else s.index("\n", idx) + 1
        path.write_text(s[:at] + stmt + s[at:])


PROMPTS = ["Write a Python function that parses an ISO 8601 date string.", "Explain how a hash map handles collisions."]


def segments(args: argparse.Namespace) -> None:
    builtins.HOST_MARKS = []  # type: ignore[attr-defined]
    tmp = Path(tempfile.mkdtemp(prefix="host_segments_"))
    try:
        instrumented_copy(tmp)
        sys.path.insert(0, str(tmp))
        from edgespec import Engine
        from edgespec.config import ModelSpec, SamplingParams, SpecConfig
        from edgespec.models import resolve_model

        target, draft = str(resolve_model(None, "target")), str(resolve_model(None, "draft"))
        spec = SpecConfig(draft_max=8, adaptive=False, draft_siblings=0) if args.drafter == "model" else None
        eng = Engine.load(ModelSpec(target, n_threads=args.threads),
                          ModelSpec(draft, n_threads=args.threads) if args.drafter == "model" else None,
                          drafter=args.drafter, spec=spec, memory=False, parallel=1)
        sp = SamplingParams(temperature=args.temperature, top_k=40, top_p=0.95, min_p=0.05) if args.temperature else SamplingParams(temperature=0.0)
        seg: dict[str, list[float]] = collections.defaultdict(list)
        n_tokens = 0
        try:
            eng.generate(PROMPTS[0], max_tokens=4, sampling=sp)
            for i in range(args.generations):
                eng.reset_caches()
                marks = builtins.HOST_MARKS  # type: ignore[attr-defined]
                marks.clear()
                r = eng.generate(PROMPTS[i % 2], max_tokens=args.tokens, sampling=sp, speculative=args.drafter != "none")
                n_tokens += r.stats.n_generated
                first = next(j for j, (m, _) in enumerate(marks) if m == "step out")  # after the prefill and first cycle
                for j in range(first, len(marks) - 1):
                    if marks[j][0] != "decode call":  # the decode itself is not host work
                        seg[f"{marks[j][0]} -> {marks[j + 1][0]}"].append(marks[j + 1][1] - marks[j][1])
        finally:
            eng.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total = sum(sum(v) for v in seg.values())
    print(f"drafter {args.drafter}, T {args.temperature}: {n_tokens} tokens, host between decodes {1000 * total / n_tokens:.3f} ms/token")
    for k, v in sorted(seg.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {k:<42} {len(v):5d} x  median {1e6 * float(np.median(v)):7.1f} us   total {1000 * sum(v):7.1f} ms")


def bare(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from edgespec.bench.bare_loop import BareStepper
    from edgespec.llama.binding import logits_address
    from edgespec.models import resolve_model

    s = BareStepper(str(resolve_model(None, "target")), 2048, args.threads)
    decode = s.C.llama_decode
    try:
        for read in (True, False):
            s.reset()
            row = s.decode(list(range(100, 130)), 0)[0]
            t, gaps, last, views = int(np.argmax(row)), [], None, {}
            b = s.batch
            b.n_tokens, b.logits[0], b.n_seq_id[0], b.seq_id[0][0] = 1, 1, 1, 0
            for _ in range(args.tokens):
                b.token[0], b.pos[0] = t, s.n_past
                t0 = time.perf_counter()
                if last is not None:
                    gaps.append(t0 - last)
                if decode(s.ctx, b) != 0:
                    raise SystemExit("llama_decode failed")
                last = time.perf_counter()
                s.n_past += 1
                if read:  # a view of llama.cpp's logits buffer, made once per address (as the engine's logits_view)
                    addr = logits_address(s.ctx)
                    view = views.get(addr)
                    if view is None:
                        views.clear()
                        view = views[addr] = np.frombuffer((ctypes.c_float * s.n_vocab).from_address(addr), dtype=np.float32)
                    t = int(view.argmax())
                else:
                    t = 100
            what = "decode + argmax of the row" if read else "decode alone (no row read)"
            print(f"bare loop, {what}: gap between decodes median {1e6 * float(np.median(gaps)):.0f} us")
    finally:
        s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafter", choices=("none", "model", "ngram"), default="none")
    ap.add_argument("--temperature", type=float, default=0.0, help="> 0: with top-k 40, top-p 0.95, min-p 0.05")
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bare", action="store_true")
    args = ap.parse_args()
    print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    bare(args) if args.bare else segments(args)


if __name__ == "__main__":
    main()
