"""The recordings the speedup replay (replay.py, speedup.py) replays: their file format, how they are recorded, and how a
position's recorded continuation is read back. research/record_traces.py is the command line that records them.

Greedy traces (format 1, 2). At temperature 0 the accepted context is always the target's greedy trace (speculation is
exact), so a cycle at position t proposes tokens that depend only on prompt + trace[:t]. For the draft model that is
its greedy continuation from that context (recorded, up to draft_len tokens, with the top probability of each drafted
token: the confidence the Controller's keep_drafting sees); for n-gram lookups it is NgramIndex on the same context
(replayed, not recorded). Acceptance and hardware cost are then separate: acceptance is in the recording, cost comes
from a verify-curve file (curves.py).

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

Sampled traces (format 3, for replaying temperature > 0). At temperature > 0 no single trace is "the" output, so the
file records one trajectory per prompt, sampled plainly from the target with the bench's settings (T 1.0, top-k 40,
top-p 0.95, min-p 0.05, a fixed seed), and at every position of it the target's and the draft's next-token
distributions there: the K most likely tokens of each (K = top, default 40 = the bench's top-k, so with its settings
nothing the sampler keeps is missing) as [[ids], [log probabilities x 1000, ints]] (softmax of the raw logits, before
the sampler's filters), and the exact acceptance rate of a sampled draft there, alpha = sum_x min(p(x), q(x)) over
the filtered distributions (x 1e4), to check the replay's rows against:

    {"format": 3, "sampling": {...}, "top": K, ..., "prompts": [{"suite", "index", "name", "prompt", "trace",
     "stop", "target": [[[ids], [logp]], ...], "draft": [...], "alpha": [...]}]}

The distributions are scored in one batch over prompt + trajectory after it is sampled (batched kernels: within
llama.cpp's batch-vs-single differences of what the sampler saw).

Importing this module loads nothing of llama.cpp: the recorders take loaded models (or anything with their methods).
"""

from __future__ import annotations

import datetime
import gzip
import json
import math
import os
import platform
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

FORMAT = 2
FORMAT_SAMPLED = 3
LOGP_SCALE = 1000  # sampled traces: log probabilities are stored as round(logp * LOGP_SCALE)
N_ALTS = 2  # alternatives recorded per drafted position (ranks 2..N_ALTS + 1)
CONF_SCALE = 10_000  # confidences are stored as round(p * CONF_SCALE)


# --------------------------------------------------------------------------------------------- recording one prompt
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


# --------------------------------------------------------------------------------------------- reading
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


def load_traces(path: str | Path) -> dict[str, Any]:
    """A recording (gzip'd JSON) of a known format; ValueError otherwise."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    if data.get("format") not in (1, 2, 3):
        raise ValueError(f"{path}: unknown traces format {data.get('format')}")
    return data


def write_traces(out: Path, data: dict[str, Any]) -> None:
    """A recording as gzip'd JSON, atomically (a temporary file beside it, then renamed)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=9) as f:
        json.dump(data, f, separators=(",", ":"))
    os.replace(tmp, out)


def machine() -> str:
    """This machine's CPU model and count, as a recording names where it was made."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} CPUs"


# --------------------------------------------------------------------------------------------- recording the suites
def resumable(out: Path, fmt: int, draft_len: int, max_tokens: int) -> tuple[dict[tuple[str, int], dict[str, Any]], dict[str, Any]]:
    """What an earlier recording at `out` with the same format, draft length and max tokens holds: its prompts by
    (suite, index), and its own facts to keep (when and where its first part was recorded); nothing otherwise."""
    if not out.exists():
        return {}, {}
    old = json.loads(gzip.decompress(out.read_bytes()))
    if (old.get("format"), old.get("draft_len"), old.get("max_tokens")) != (fmt, draft_len, max_tokens):
        return {}, {}
    kept = {k: v for k, v in old.items() if k not in ("prompts", "recorded", "machine", "seconds")}
    kept["first_part"] = {k: old.get(k) for k in ("recorded", "machine", "seconds")}
    return {(p["suite"], p["index"]): p for p in old["prompts"]}, kept


def record_order(suites: Mapping[str, Sequence[Any]], chosen: Sequence[str], per_suite: int = 0) -> list[tuple[str, int]]:
    """(suite, index) round-robin over the chosen suites (first prompt of each, then the second, ...): an interrupted
    recording still covers every suite. per_suite: only the first N prompts of each (0 = all)."""
    return [(s, i) for i in range(max(len(suites[s]) for s in chosen)) for s in chosen
            if i < len(suites[s]) and (not per_suite or i < per_suite)]


def record_prompt(eng: Any, ctx: list[int], sampling: Any, max_tokens: int, draft_len: int, top: int = 0) -> tuple[dict[str, Any], str]:
    """One prompt recorded with a loaded engine (target and draft): its plain output with `sampling` (the trace) and
    the draft's segments along it (greedy sampling), or both models' top `top` rows along it (sampled). Returns the
    prompt's record (without suite, index and name) and a few words on it."""
    r = eng.generate(tokens=ctx, sampling=sampling, max_tokens=max_tokens, speculative=False)
    trace = [int(x) for x in r.token_ids]
    if not sampling.greedy:
        got = eng.run_on_worker(lambda e: record_sampled(e, ctx, trace, sampling, top)).result()
        what = f"mean alpha {sum(got['alpha']) / max(len(trace), 1) / CONF_SCALE:.3f}"
    else:
        segs = eng.run_on_worker(lambda e: record_segments(e.draft, ctx, trace, draft_len)).result()
        got = {"segments": segs}
        hits = len(trace) - len(segs)  # every miss of the draft's first token starts a new segment
        what = f"{len(segs)} draft segments (~{max(hits, 0) / max(len(trace), 1):.0%} first-token hits)"
    return {"prompt": ctx, "trace": trace, "stop": r.stats.stop_reason, **got}, what


def record(
    eng: Any, suites: Mapping[str, Sequence[Mapping[str, Any]]], order: Sequence[tuple[str, int]], out: Path, models: Mapping[str, str], *,
    sampling: Any, max_tokens: int, draft_len: int, top: int = 0, resume: bool = False, progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Record the entries `order` names (record_order) with a loaded engine and write the recording to `out` after
    every prompt (an interrupted recording goes on with resume=True, which keeps the prompts an earlier recording
    at `out` with the same settings holds). sampling: greedy (format 2) or T > 0 with a seed, which prompt i is
    sampled with plus i (format 3, top = the tokens recorded per position and model). models: {"target": file name,
    "draft": file name}. progress: one line per prompt. Returns the recording."""
    sampled = not sampling.greedy
    fmt = FORMAT_SAMPLED if sampled else FORMAT
    done, kept = resumable(out, fmt, draft_len, max_tokens) if resume else ({}, {})
    n_vocab, eog_ids = eng.target.n_vocab, sorted(eng.target.eog_ids)
    prompts: list[dict[str, Any]] = []
    t_start = time.perf_counter()

    def save() -> dict[str, Any]:
        data = {"format": fmt, "draft_len": draft_len, "max_tokens": max_tokens, "target": models["target"], "draft": models["draft"],
                "n_vocab": n_vocab, "eog_ids": eog_ids, "recorded": datetime.date.today().isoformat(), "machine": machine(),
                "seconds": round(time.perf_counter() - t_start, 1), "prompts": prompts}
        if kept:  # resumed: keep what the file said of its first part
            data = {**kept, **data}
        if sampled:
            data["sampling"] = {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
                                "min_p": sampling.min_p, "seed": sampling.seed}
            data["top"] = top
        write_traces(out, data)
        return data

    for suite, i in order:
        entry = suites[suite][i]
        if (suite, i) in done:
            prompts.append(done[(suite, i)])
            continue
        t0 = time.perf_counter()
        ctx = eng.prompt_tokens(entry.get("prompt"), messages=entry.get("messages"))
        s = sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + len(prompts))
        rec, what = record_prompt(eng, ctx, s, max_tokens, draft_len, top)
        prompts.append({"suite": suite, "index": i, "name": entry.get("name") or f"{suite}-{i + 1}", **rec})
        if progress is not None:
            progress(f"  {suite}-{i + 1}: {len(ctx)} prompt + {len(rec['trace'])} tokens, {what}, {time.perf_counter() - t0:.0f} s")
        save()  # after every prompt: an interrupted recording goes on with resume
    return save()


def upgradable(src: Path, draft_name: str) -> dict[str, Any]:
    """The format-1 recording at `src`, to be upgraded (upgrade) with the draft `draft_name` (a file name); ValueError
    when it is not format 1 or was recorded with another draft."""
    data = json.loads(gzip.decompress(src.read_bytes()))
    if data.get("format") != 1:
        raise ValueError(f"{src}: not a format-1 recording (format {data.get('format')})")
    if draft_name != data.get("draft"):
        raise ValueError(f"{src} was recorded with the draft {data.get('draft')}, not {draft_name}")
    return data


def upgrade(data: dict[str, Any], draft: Any, out: Path, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """A format-1 recording (upgradable) with the draft's alternatives added at every drafted position
    (add_alternatives; traces and continuations kept), written to `out` as format 2. `draft`: the loaded draft model
    the recording was made with. progress: one line per prompt."""
    t_start = time.perf_counter()
    for rec in data["prompts"]:
        t0 = time.perf_counter()
        rec["segments"] = add_alternatives(draft, rec["prompt"], rec["trace"], rec["segments"])
        if progress is not None:
            progress(f"  {rec['name']}: {len(rec['segments'])} segments, {time.perf_counter() - t0:.0f} s")
    data["format"] = FORMAT
    data["alternatives_added"] = {"date": datetime.date.today().isoformat(), "machine": machine(),
                                  "seconds": round(time.perf_counter() - t_start, 1)}
    write_traces(out, data)
    return data
