#!/usr/bin/env python3
"""Where the loop's own work per token goes, segment by segment, on the real pair: between one llama_decode's return
and the next one's call, the time from each marked point of the engine to the next (median per cycle, and the total).

    .venv/bin/python bench/host_segments.py                   # plain greedy, 4 generations x 96 tokens
    .venv/bin/python bench/host_segments.py --drafter model   # the draft model at fixed k = 8
    .venv/bin/python bench/host_segments.py --bare            # the floors: a bare llama.cpp loop, nothing of edgespec's
    .venv/bin/python bench/host_segments.py --bare-chain      # the floor of a k = 8 cycle with the draft model

How: the package is copied to a temporary folder and a `perf_counter` mark is written into the copy before each
anchor line below (MARKS; a missing anchor stops the script naming it), so the checkout itself is never changed and
each mark costs one list append. --bare: llama_decode through the binding, one token at a time, with the same 2
threads, and between decodes only what a floor needs (floor_steps): nothing, the row's argmax, the argmax and the
token's text handed to a reader thread, a sampled token by edgespec's warp or by llama.cpp's C sampler chain. The gap
between decodes is the host time any Python loop over this binding pays on this machine for that much. --bare-chain:
the same for a k = 8 cycle of the draft model and the target's 9-row verify (bare_chain).
"""

from __future__ import annotations

import argparse
import builtins
import ctypes
import collections
import queue
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

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
    ("runtime/runner.py", "                if not alone():\n", "text handed over", True),
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


def sampled_settings() -> dict[str, dict[str, Any]]:
    """The two sampled settings the floors use, as host_bench.py's SETTINGS has them (SamplingParams kwargs)."""
    from host_bench import SETTINGS

    return {name: kw for name, kw, _ in SETTINGS if name in ("llama.cpp defaults", "OpenAI defaults")}


def floor_steps(s: Any, rng: np.random.Generator) -> dict[str, Callable[[np.ndarray | None], int]]:
    """What each floor does with a decode's row (None: the row is not read) before the next decode: the next token.
    The row is a view of llama.cpp's logits buffer. Text: the token's bytes (llama_token_to_piece, cached per token
    as the engine's vocabulary does) through edgespec's StreamingDetokenizer, handed to a reader thread that waits
    on a queue (what any streaming engine must do per token). Sampled: edgespec's own warp (warp_probs) and one
    draw, or llama.cpp's C sampler chain on the row (host_bench.CSampler: its llama_token_data array filled from the
    row first, as common_sampler_sample does)."""
    import llama_cpp as C
    from host_bench import CSampler
    from edgespec.config import SamplingParams
    from edgespec.decoding.detok import StreamingDetokenizer
    from edgespec.decoding.sampling import sample
    from edgespec.decoding.warp_fast import warp_probs

    vocab = C.llama_model_get_vocab(s.model)
    pieces: dict[int, bytes] = {}

    def token_bytes(t: int) -> bytes:
        hit = pieces.get(t)
        if hit is None:
            buf = ctypes.create_string_buffer(64)
            n = C.llama_token_to_piece(vocab, t, buf, len(buf), 0, False)
            hit = pieces[t] = buf.raw[: max(n, 0)]
        return hit

    detok = StreamingDetokenizer(token_bytes)
    handed: queue.SimpleQueue[str | None] = queue.SimpleQueue()
    got: list[str] = []

    def reader() -> None:
        while (text := handed.get()) is not None:
            got.append(text)

    threading.Thread(target=reader, daemon=True).start()  # ends at the process's end (a None is never needed)

    def text(row: np.ndarray | None) -> int:
        t = int(row.argmax())  # type: ignore[union-attr]
        piece = detok.push((t,))
        if piece:
            handed.put(piece)
        return t

    def warped(sp: SamplingParams) -> Callable[[np.ndarray | None], int]:
        return lambda row: sample(warp_probs(row, sp), rng)  # type: ignore[arg-type]

    steps: dict[str, Callable[[np.ndarray | None], int]] = {
        "decode alone (no row read)": lambda row: 100,
        "argmax of the row": lambda row: int(row.argmax()),  # type: ignore[union-attr]
        "argmax + the text to a reader thread": text,
    }
    for name, kw in sampled_settings().items():
        steps[f"{name}, edgespec's warp + a draw"] = warped(SamplingParams(**kw))
        steps[f"{name}, llama.cpp's C chain"] = CSampler(s.n_vocab, kw)  # type: ignore[assignment]
    return steps


def bare(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from edgespec.bench.bare_loop import BareStepper
    from edgespec.llama.binding import logits_address
    from edgespec.models import resolve_model

    s = BareStepper(str(resolve_model(None, "target")), 2048, args.threads)
    decode = s.C.llama_decode
    try:
        steps = floor_steps(s, np.random.default_rng(1234))
        for what, step in steps.items():
            s.reset()
            row = s.decode(list(range(100, 130)), 0)[0]
            t, gaps, last, views = int(np.argmax(row)), [], None, {}
            b = s.batch
            b.n_tokens, b.logits[0], b.n_seq_id[0], b.seq_id[0][0] = 1, 1, 1, 0
            read = what != "decode alone (no row read)"
            for _ in range(args.tokens):
                b.token[0], b.pos[0] = t, s.n_past
                t0 = time.perf_counter()
                if last is not None:
                    gaps.append(t0 - last)
                if decode(s.ctx, b) != 0:
                    raise SystemExit("llama_decode failed")
                last = time.perf_counter()
                s.n_past += 1
                view = None
                if read:  # a 1-D view of llama.cpp's buffer, made once per address (inline: the floor's own cost is its point)
                    addr = logits_address(s.ctx)
                    view = views.get(addr)
                    if view is None:
                        views.clear()
                        view = views[addr] = np.frombuffer((ctypes.c_float * s.n_vocab).from_address(addr), dtype=np.float32)
                t = step(view)
            print(f"bare loop, decode + {what}: gap between decodes median {1e6 * float(np.median(gaps)):.0f} us", flush=True)
    finally:
        s.close()


def bare_chain(args: argparse.Namespace) -> None:
    """The floor at k = 8 with the draft model, every draft taken: per cycle the draft decodes 8 tokens one by one (its
    row read after each, as the floor's setting picks a token: argmax, or a warp and a draw), then the target decodes
    the 9-token batch [last, d1..d8] with a row for each and every row is read the same way (a greedy verify: one
    argmax pass over the 9 rows; edgespec's warp: each row warped and the draft's p read); the host time of a cycle
    (the gaps between decodes) over its 9 tokens."""
    sys.path.insert(0, str(ROOT))
    from edgespec.bench.bare_loop import BareStepper
    from edgespec.config import SamplingParams
    from edgespec.decoding.sampling import sample
    from edgespec.decoding.warp_fast import warp_probs
    from edgespec.models import resolve_model

    target = BareStepper(str(resolve_model(None, "target")), 4096, args.threads)
    draft = BareStepper(str(resolve_model(None, "draft")), 4096, args.threads)
    rng = np.random.default_rng(1234)

    def decode(s: Any, tokens: list[int], all_rows: bool) -> float:
        """llama_decode of `tokens` at s.n_past; the seconds inside the call alone."""
        s.fill(tokens, s.n_past, all_rows)
        t0 = time.perf_counter()
        if s.C.llama_decode(s.ctx, s.batch) != 0:
            raise SystemExit("llama_decode failed")
        s.n_past += len(tokens)
        return time.perf_counter() - t0

    settings: dict[str, SamplingParams | None] = {"greedy": None}
    settings.update({name: SamplingParams(**kw) for name, kw in sampled_settings().items()})
    try:
        for name, sp in settings.items():
            for m in (target, draft):
                m.reset()
            prompt = list(range(100, 130))
            decode(target, prompt, False)
            decode(draft, prompt[:-1], False)
            t, d_in = int(target.rows(1)[0].argmax()), [prompt[-1]]
            per_cycle = []
            for _ in range(max(4, args.tokens // 9)):
                t0, spent = time.perf_counter(), 0.0
                drafts = []
                for i in range(8):
                    spent += decode(draft, d_in + [t] if i == 0 else [drafts[-1]], False)
                    d_in = []
                    row = draft.rows(1)[0]
                    drafts.append(int(row.argmax()) if sp is None else sample(warp_probs(row, sp), rng))
                spent += decode(target, [t] + drafts, True)
                r = target.rows(9)
                if sp is None:
                    t = int(r.argmax(axis=1)[-1])
                else:
                    taken = 0
                    for i in range(9):
                        probs = warp_probs(r[i], sp)
                        if i < 8:  # the rule's draw (every draft is taken all the same: the floor of a full cycle)
                            taken += probs.prob(drafts[i]) > rng.random()
                        else:
                            t = sample(probs, rng)
                d_in = [drafts[-1]]
                per_cycle.append(time.perf_counter() - t0 - spent)
            print(f"bare chain k = 8, {name}: host {1e6 * float(np.median(per_cycle)):.0f} us per cycle, "
                  f"{1e6 * float(np.median(per_cycle)) / 9:.0f} us per token", flush=True)
    finally:
        target.close()
        draft.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafter", choices=("none", "model", "ngram"), default="none")
    ap.add_argument("--temperature", type=float, default=0.0, help="> 0: with top-k 40, top-p 0.95, min-p 0.05")
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bare", action="store_true")
    ap.add_argument("--bare-chain", action="store_true", help="the floor at k = 8 with the draft model")
    args = ap.parse_args()
    print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    bare_chain(args) if args.bare_chain else bare(args) if args.bare else segments(args)


if __name__ == "__main__":
    main()
