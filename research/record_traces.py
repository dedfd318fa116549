#!/usr/bin/env python3
"""Record what the speedup predictor replays: greedy traces of the real pair on the bench suites, and the draft
model's greedy continuation (with its confidences) at every position of each trace.

    nice .venv/bin/python research/record_traces.py                       # all 5 suites, 128 tokens, 16 draft tokens
    .venv/bin/python research/record_traces.py --suite code-completion --max-tokens 32 --out /tmp/t.json.gz

Why this is enough: at temperature 0 the accepted context is always the target's greedy trace (speculation is
exact), so a cycle at position t proposes tokens that depend only on prompt + trace[:t]. For the draft model that
is its greedy continuation from that context (recorded here, up to --draft-len tokens, with the top probability of
each drafted token: the confidence the Controller's keep_drafting sees); for n-gram lookups it is NgramIndex on the
same context (replayed, not recorded). Acceptance and hardware cost are then separate: acceptance is in this file,
cost comes from a verify-curve file (research/predict_speedup.py).

Recording is cheap because a greedy continuation from t + 1 is the one from t shifted by one token whenever the
draft's first token equals trace[t] (same context, deterministic): the draft then decodes one more token. Only a
divergence starts a new continuation ("segment"). The file stores segments, not one continuation per position:

    {"format": 2, "draft_len": L, "max_tokens": N, "target": ..., "draft": ..., "n_vocab": V, "eog_ids": [...],
     "recorded": ..., "machine": ...,
     "prompts": [{"suite", "index", "name", "prompt": [ids], "trace": [ids], "stop": "eos"|"length",
                  "segments": [[t0, [tokens...], [confidences x 1e4, ints], [alternatives...]], ...]}]}

Format 2 adds each drafted position's alternatives: the draft's next-best tokens there (ranks 2 and 3) and their
probabilities x 1e4, as [token2, p2, token3, p3] (what a draft-model tree would put beside the drafted token).
Format 1 files (no alternatives) are still read.

Position t's continuation is segment[t - t0 : t - t0 + L] of the segment with the largest t0 <= t, cut after an
end-of-generation token (the draft stops there). Written as gzip'd JSON (the 5 suites: well under 1 MB).

Sampled traces (--sampled, format 3, for replaying temperature > 0):

    nice .venv/bin/python research/record_traces.py --sampled --out research/data/traces_t1.json.gz

At temperature > 0 no single trace is "the" output, so the file records one trajectory per prompt, sampled plainly
from the target with the bench's settings (T 1.0, top-k 40, top-p 0.95, min-p 0.05, a fixed seed), and at every
position of it the target's and the draft's next-token distributions there: the K most likely tokens of each (K =
--top, default 40 = the bench's top-k, so with its settings nothing the sampler keeps is missing) as [[ids], [log
probabilities x 1000, ints]] (softmax of the raw logits, before the sampler's filters), and the exact acceptance
rate of a sampled draft there, alpha = sum_x min(p(x), q(x)) over the filtered distributions (x 1e4), to check the
replay's rows against:

    {"format": 3, "sampling": {...}, "top": K, ..., "prompts": [{"suite", "index", "name", "prompt", "trace",
     "stop", "target": [[[ids], [logp]], ...], "draft": [...], "alpha": [...]}]}

The distributions are scored in one batch over prompt + trajectory after it is sampled (batched kernels: within
llama.cpp's batch-vs-single differences of what the sampler saw).
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any


HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "data" / "traces.json.gz"
FORMAT = 2
FORMAT_SAMPLED = 3
LOGP_SCALE = 1000  # sampled traces: log probabilities are stored as round(logp * LOGP_SCALE)
N_ALTS = 2  # alternatives recorded per drafted position (ranks 2..N_ALTS + 1)
CONF_SCALE = 10_000  # confidences are stored as round(p * CONF_SCALE)


def record_segments(draft: Any, context: list[int], trace: list[int], draft_len: int) -> list[list[Any]]:
    """The draft's greedy continuations at every position of `trace` after `context`, as segments (see the module
    docstring). `draft` is a backend.Model (or anything with reset/sync/decode/truncate/is_eog/n_past)."""
    from edgespec.decoding.sampling import greedy as greedy_token
    from edgespec.config import SamplingParams
    from edgespec.drafting.model import top_probability

    params = SamplingParams(temperature=0)
    segments: list[list[Any]] = []
    full = list(context) + list(trace)
    P = len(context)
    draft.reset()
    seg_tokens: list[int] = []
    seg_conf: list[int] = []
    seg_alts: list[list[int]] = []
    t0 = -1
    logits = None  # the draft's logits after its cache (the next token's), None = must resync
    for t in range(len(trace)):
        need_new = t0 < 0 or t - t0 >= len(seg_tokens) or seg_tokens[t - t0 - 1] != trace[t - 1]
        if need_new:
            # a new segment from context full[:P + t]
            if t0 >= 0:
                segments.append([t0, seg_tokens, seg_conf, seg_alts])
            t0, seg_tokens, seg_conf, seg_alts = t, [], [], []
            logits = draft.sync(full[: P + t])[0]
        # extend the segment until it covers positions t .. t + draft_len - 1 (or ends at an end token)
        while len(seg_tokens) < (t - t0) + draft_len and not (seg_tokens and draft.is_eog(seg_tokens[-1])):
            if logits is None:
                logits = draft.decode([seg_tokens[-1]], draft.n_past, (0,))[0]
            d = greedy_token(logits, params, full[: P + t0] + seg_tokens)
            seg_tokens.append(int(d))
            seg_conf.append(int(round(top_probability(logits) * CONF_SCALE)))
            seg_alts.append(alternatives(logits, int(d)))
            logits = None
    if t0 >= 0:
        segments.append([t0, seg_tokens, seg_conf, seg_alts])
    return segments


def add_alternatives(draft: Any, context: list[int], trace: list[int], segments: list[list[Any]]) -> list[list[Any]]:
    """The segments of a format-1 recording with each drafted position's alternatives added: the draft decodes each
    recorded segment again (context + trace[:t0], then the recorded tokens one by one) and ranks its other tokens at
    every position. The recorded tokens and confidences are kept as they are (the replay's traces do not change)."""
    full = list(context) + list(trace)
    P = len(context)
    draft.reset()
    out: list[list[Any]] = []
    for t0, toks, conf, *_ in segments:
        logits = draft.sync(full[: P + t0])[0]
        alts: list[list[int]] = []
        for j, d in enumerate(toks):
            if j:
                logits = draft.decode([toks[j - 1]], draft.n_past, (0,))[0]
            alts.append(alternatives(logits, int(d)))
        out.append([t0, toks, conf, alts])
    return out


def alternatives(logits: Any, d: int, n: int = N_ALTS) -> list[int]:
    """The draft's next-best tokens after d and their probabilities (softmax of the raw logits) x CONF_SCALE, as
    [token2, p2, token3, p3, ...]."""
    import numpy as np

    row = np.asarray(logits, dtype=np.float64)
    top = np.argpartition(row, -(n + 1))[-(n + 1) :]
    top = top[np.argsort(-row[top], kind="stable")]
    z = float(np.exp(row - row.max()).sum())
    out: list[int] = []
    for t in [int(x) for x in top if int(x) != d][:n]:
        out += [t, int(round(math.exp(float(row[t] - row.max())) / z * CONF_SCALE))]
    return out


def top_rows(model: Any, context: list[int], trace: list[int], k: int) -> tuple[list[list[list[int]]], Any]:
    """The model's next-token distribution at every position of `trace` after `context` (scored in one batch from an
    empty cache), each as [[the k most likely ids], [their log probabilities x LOGP_SCALE]]; and the raw float32
    logits rows (what record_sampled computes the exact acceptance rates from)."""
    import numpy as np

    from edgespec.decoding.sampling import top_k_indices

    full = list(context) + list(trace)
    P = len(context)
    model.reset()
    logits = model.sync(full, list(range(P - 1, P + len(trace) - 1)))
    model.reset()
    out = []
    for row in logits:
        x = row.astype(np.float64)
        lse = float(x.max() + np.log(np.exp(x - x.max()).sum()))
        top = top_k_indices(x, min(k, x.size))  # the sampler's top-k, ties to the lowest ids as it breaks them
        top = top[np.argsort(-x[top], kind="stable")]
        out.append([[int(t) for t in top], [int(round((x[t] - lse) * LOGP_SCALE)) for t in top]])
    return out, logits


def record_sampled(eng: Any, context: list[int], trace: list[int], params: Any, k: int) -> dict[str, Any]:
    """A sampled trajectory's per-position target and draft distributions (top_rows) and the exact acceptance rate
    of a sampled draft at each position (sum of min(p, q) over the filtered distributions, x CONF_SCALE)."""
    from edgespec.decoding.acceptance import expected_acceptance
    from edgespec.decoding.sampling import warp

    target, p_logits = top_rows(eng.target, context, trace, k)
    draft, q_logits = top_rows(eng.draft, context, trace, k)
    full = list(context) + list(trace)
    alpha = []
    for t in range(len(trace)):
        hist = full[: len(context) + t]
        p, q = warp(p_logits[t], params, hist), warp(q_logits[t], params, hist)
        alpha.append(int(round(expected_acceptance(p, q) * CONF_SCALE)))
    return {"target": target, "draft": draft, "alpha": alpha}


def sampled_rows(entry: list[list[int]]) -> tuple[list[int], list[float]]:
    """One position of a sampled trace's distribution: (ids, probabilities), most likely first."""
    ids, lps = entry
    return [int(t) for t in ids], [math.exp(lp / LOGP_SCALE) for lp in lps]


def continuation(segments: list[list[Any]], t: int, draft_len: int) -> tuple[list[int], list[float]]:
    """Position t's recorded continuation (tokens, confidences) from a prompt's segments (a segment ends at the
    draft's end-of-generation token, so the continuation does too)."""
    toks, conf, _ = continuation_with_alternatives(segments, t, draft_len)
    return toks, conf


def continuation_with_alternatives(
    segments: list[list[Any]], t: int, draft_len: int
) -> tuple[list[int], list[float], list[list[tuple[int, float]]] | None]:
    """continuation() and, per drafted position, the draft's alternatives [(token, probability), ...] best first
    (None for a format-1 file, which did not record them)."""
    lo, hi = 0, len(segments)
    while hi - lo > 1:  # the last segment with t0 <= t
        mid = (lo + hi) // 2
        if segments[mid][0] <= t:
            lo = mid
        else:
            hi = mid
    t0, toks, conf = segments[lo][:3]
    alts = segments[lo][3] if len(segments[lo]) > 3 else None
    if t0 > t:
        return [], [], None if alts is None else []
    toks = toks[t - t0 : t - t0 + draft_len]
    conf = [c / CONF_SCALE for c in conf[t - t0 : t - t0 + draft_len]]
    if alts is None:
        return list(toks), conf, None
    pairs = [[(int(a[j]), a[j + 1] / CONF_SCALE) for j in range(0, len(a), 2)] for a in alts[t - t0 : t - t0 + draft_len]]
    return list(toks), conf, pairs


def _machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} CPUs"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", action="append", default=[], help="bench suite(s) to record (default: all)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--draft-len", type=int, default=16, help="draft tokens recorded per position")
    ap.add_argument("--target", default=None, help="target GGUF (default: the default pair's)")
    ap.add_argument("--draft", default=None, help="draft GGUF (default: the default pair's)")
    ap.add_argument("--prompts-per-suite", type=int, default=0, help="only the first N prompts of each suite (0 = all)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--resume", action="store_true", help="keep the prompts already in --out (same settings), record the rest")
    ap.add_argument("--add-alternatives", type=Path, default=None, metavar="IN",
                    help="read a format-1 recording, add the draft's alternatives at every drafted position (the draft "
                         "model only; traces and continuations kept), write format 2 to --out")
    ap.add_argument("--sampled", action="store_true",
                    help="record sampled trajectories and both models' top distributions along them (format 3, for "
                         "replaying temperature > 0); with --temperature/--top-k/--top-p/--min-p/--seed")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=40)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--min-p", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--top", type=int, default=40, help="--sampled: most likely tokens recorded per position and model")
    a = ap.parse_args(argv)
    if a.add_alternatives is not None:
        return upgrade(a.add_alternatives, a.out, a.draft, a.threads)

    from dataclasses import replace

    from edgespec.bench import load_suites
    from edgespec.config import ModelSpec, SamplingParams
    from edgespec.runtime.engine import Engine
    from edgespec.models import resolve_model

    tpath, dpath = resolve_model(a.target, "target"), resolve_model(a.draft, "draft")
    suites = load_suites()
    chosen = [s for s in suites if not a.suite or s in a.suite]
    unknown = [s for s in a.suite if s not in suites]
    if unknown:
        ap.error(f"unknown suite(s) {unknown}; known: {list(suites)}")
    eng = Engine.load(
        ModelSpec(str(tpath), n_threads=a.threads), ModelSpec(str(dpath), n_threads=a.threads),
        drafter="model", calibrate_costs=False, prompt_cache_mb=0,
    )
    prompts: list[dict[str, Any]] = []
    n_vocab, eog_ids = eng.target.n_vocab, sorted(eng.target.eog_ids)
    t_start = time.perf_counter()
    done: dict[tuple[str, int], dict[str, Any]] = {}
    kept: dict[str, Any] = {}  # a resumed recording's own facts (when and where its first part was recorded)
    if a.resume and a.out.exists():
        old = json.loads(gzip.decompress(a.out.read_bytes()))
        if (old.get("format"), old.get("draft_len"), old.get("max_tokens")) == (
            FORMAT_SAMPLED if a.sampled else FORMAT, a.draft_len, a.max_tokens
        ):
            done = {(p["suite"], p["index"]): p for p in old["prompts"]}
            kept = {k: v for k, v in old.items() if k not in ("prompts", "recorded", "machine", "seconds")}
            kept["first_part"] = {k: old.get(k) for k in ("recorded", "machine", "seconds")}

    sampling = SamplingParams(temperature=0)
    if a.sampled:
        sampling = SamplingParams(temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p, seed=a.seed)
        if sampling.greedy:
            ap.error("--sampled needs --temperature > 0")

    def save() -> dict[str, Any]:
        data = {
            "format": FORMAT_SAMPLED if a.sampled else FORMAT,
            "draft_len": a.draft_len,
            "max_tokens": a.max_tokens,
            "target": os.path.basename(str(tpath)),
            "draft": os.path.basename(str(dpath)),
            "n_vocab": n_vocab,
            "eog_ids": eog_ids,
            "recorded": datetime.date.today().isoformat(),
            "machine": _machine(),
            "seconds": round(time.perf_counter() - t_start, 1),
            "prompts": prompts,
        }
        if kept:  # resumed: keep what the file said of its first part
            data = {**kept, **data}
        if a.sampled:
            data["sampling"] = {"temperature": a.temperature, "top_k": a.top_k, "top_p": a.top_p, "min_p": a.min_p, "seed": a.seed}
            data["top"] = a.top
        write_traces(a.out, data)
        return data

    try:
        # round-robin over the suites (first prompt of each, then the second, ...): an interrupted recording
        # still covers every suite
        order = [(s, i) for i in range(max(len(suites[s]) for s in chosen)) for s in chosen
                 if i < len(suites[s]) and (not a.prompts_per_suite or i < a.prompts_per_suite)]
        for suite, i in order:
            entry = suites[suite][i]
            if (suite, i) in done:
                prompts.append(done[(suite, i)])
                continue
            t0 = time.perf_counter()
            ctx = eng.prompt_tokens(entry.get("prompt"), messages=entry.get("messages"))
            s = sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + len(prompts))
            r = eng.generate(tokens=ctx, sampling=s, max_tokens=a.max_tokens, speculative=False)
            trace = [int(x) for x in r.token_ids]
            if a.sampled:
                got = eng.run_on_worker(lambda e, c=ctx, tr=trace: record_sampled(e, c, tr, sampling, a.top)).result()
                what = f"mean alpha {sum(got['alpha']) / max(len(trace), 1) / CONF_SCALE:.3f}"
            else:
                segs = eng.run_on_worker(lambda e, c=ctx, tr=trace: record_segments(e.draft, c, tr, a.draft_len)).result()
                got = {"segments": segs}
                hits = len(trace) - len(segs)  # every miss of the draft's first token starts a new segment
                what = f"{len(segs)} draft segments (~{max(hits, 0) / max(len(trace), 1):.0%} first-token hits)"
            prompts.append({
                "suite": suite, "index": i, "name": entry.get("name") or f"{suite}-{i + 1}",
                "prompt": ctx, "trace": trace, "stop": r.stats.stop_reason, **got,
            })
            print(f"  {suite}-{i + 1}: {len(ctx)} prompt + {len(trace)} tokens, {what}, {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)
            save()  # after every prompt: an interrupted recording goes on with --resume
    finally:
        eng.close()
    data = save()
    print(f"wrote {a.out} ({a.out.stat().st_size / 1024:.0f} KiB, {len(prompts)} prompts, {data['seconds']:.0f} s)", file=sys.stderr)
    return 0


def write_traces(out: Path, data: dict[str, Any]) -> None:
    """A recording as gzip'd JSON, atomically (a temporary file beside it, then renamed)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=9) as f:
        json.dump(data, f, separators=(",", ":"))
    os.replace(tmp, out)


def upgrade(src: Path, out: Path, draft_path: str | None, threads: int | None) -> int:
    """--add-alternatives: src (format 1) -> out (format 2), the draft model only."""
    from edgespec.llama.backend import Model
    from edgespec.config import ModelSpec
    from edgespec.models import resolve_model

    data = json.loads(gzip.decompress(src.read_bytes()))
    if data.get("format") != 1:
        print(f"{src}: not a format-1 recording (format {data.get('format')})", file=sys.stderr)
        return 2
    dpath = resolve_model(draft_path, "draft")
    if os.path.basename(str(dpath)) != data.get("draft"):
        print(f"{src} was recorded with the draft {data.get('draft')}, not {os.path.basename(str(dpath))}", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    draft = Model(ModelSpec(str(dpath), n_ctx=8192, n_threads=threads))
    try:
        for rec in data["prompts"]:
            t0 = time.perf_counter()
            rec["segments"] = add_alternatives(draft, rec["prompt"], rec["trace"], rec["segments"])
            print(f"  {rec['name']}: {len(rec['segments'])} segments, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    finally:
        draft.close()
    data["format"] = FORMAT
    data["alternatives_added"] = {"date": datetime.date.today().isoformat(), "machine": _machine(),
                                  "seconds": round(time.perf_counter() - t_start, 1)}
    write_traces(out, data)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
