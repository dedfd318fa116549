"""Recordings for the speedup replay without a real pair (test_gpu_tools, test_learning): a deterministic rule-based
draft (`RuleDraft`) and target traces that agree with it at a chosen rate (`make_trace`, `synthetic_data`), a tiny
model pair's greedy trace and traces file (`record_tiny`), and verify-cost curves in seconds."""

from __future__ import annotations

import numpy as np

from edgespec.bench import traces as rt
from edgespec.config import SamplingParams
from edgespec.drafting.model import top_probability
from edgespec.llama.prompt_cache import common_prefix

# verify-cost curves in seconds per verify of n tokens: a GPU-like flat one and a CPU-like linear one
FLAT = {1: 0.010, 2: 0.0102, 4: 0.0105, 8: 0.011, 16: 0.012}
CPU = {1: 0.060, 2: 0.096, 4: 0.15, 8: 0.30, 16: 0.60}


class RuleDraft:
    """A deterministic 'draft model' over a small vocabulary: its greedy token after a context is a fixed function
    of the last two tokens. Implements what record_segments needs (reset/sync/decode/is_eog/n_past)."""

    V = 50

    def __init__(self, eog: int | None = None) -> None:
        self.cached: list[int] = []
        self.eog = eog

    @property
    def n_past(self) -> int:
        return len(self.cached)

    def common_prefix(self, tokens) -> int:
        return common_prefix(self.cached, tokens)

    def reset(self) -> None:
        self.cached = []

    def next_token(self, ctx: list[int]) -> int:
        return (ctx[-1] * 7 + ctx[-2] * 3 + 1) % self.V

    def _row(self) -> np.ndarray:
        row = np.full(self.V, -3.0, dtype=np.float32)
        row[self.next_token(self.cached)] = 1.0 + (len(self.cached) % 5)
        return row[None]

    def sync(self, tokens, rows=(-1,)):
        self.cached = list(tokens)
        return self._row()

    def decode(self, tokens, start_pos, rows=(-1,)):
        assert start_pos == len(self.cached)
        self.cached += list(tokens)
        return self._row()

    def is_eog(self, token: int) -> bool:
        return token == self.eog


def brute_continuation(draft: RuleDraft, ctx: list[int], n: int) -> tuple[list[int], list[float]]:
    toks, conf, c = [], [], list(ctx)
    for _ in range(n):
        draft.sync(c)
        row = draft._row()[0]
        d = int(np.argmax(row))
        toks.append(d)
        conf.append(round(top_probability(row) * rt.CONF_SCALE) / rt.CONF_SCALE)
        c.append(d)
        if draft.is_eog(d):
            break
    return toks, conf


def make_trace(draft: RuleDraft, prompt: list[int], n: int, agree_every: int = 3) -> list[int]:
    """A 'target' trace that agrees with the draft except at every agree_every-th position."""
    out, c = [], list(prompt)
    for i in range(n):
        d = draft.next_token(c)
        t = d if (i + 1) % agree_every else (d + 1) % draft.V
        out.append(t)
        c.append(t)
    return out


def synthetic_data(agree_every: int, n: int = 60, prompts: int = 2) -> dict:
    """A traces file (format 1, two suites) of `prompts` prompts, each target trace n tokens that RuleDraft's greedy
    continuation misses at every agree_every-th position."""
    draft = RuleDraft()
    recs = []
    for i in range(prompts):
        prompt = [3 + i, 4, 5, 6, 9, 3 + i, 4, 5]
        trace = make_trace(draft, prompt, n, agree_every)
        recs.append({"suite": "s1" if i % 2 == 0 else "s2", "index": i, "name": f"p{i}", "prompt": prompt,
                     "trace": trace, "stop": "length", "segments": rt.record_segments(RuleDraft(), prompt, trace, 16)})
    return {"format": 1, "draft_len": 16, "max_tokens": n, "n_vocab": RuleDraft.V, "eog_ids": [], "prompts": recs}


def record_tiny(target, draft, prompt: list[int], n: int) -> tuple[list[int], dict]:
    """The plain greedy trace of `target` after `prompt` (n tokens) and a one-prompt traces file for it (draft_len 8)."""
    from edgespec.runtime.speculate import speculate

    sampling = SamplingParams(temperature=0)
    plain = [t for st in speculate(target, prompt, sampling, np.random.default_rng(0), max_tokens=n) for t in st.tokens]
    segs = rt.record_segments(draft, prompt, plain, 8)
    data = {"format": 1, "draft_len": 8, "max_tokens": n, "n_vocab": target.n_vocab, "eog_ids": sorted(target.eog_ids),
            "prompts": [{"suite": "tiny", "index": 0, "name": "tiny-1", "prompt": prompt, "trace": plain,
                         "stop": "length" if len(plain) == n else "eos", "segments": segs}]}
    return plain, data
