"""The models the speedup replay runs instead of llama.cpp: a target and a draft that answer from a recording
(traces.py) and charge a virtual clock what a verify-cost curve says each call costs (curves.py).

Greedy recordings: `TraceTarget` answers every row with the recorded trace's next token (and verifies token trees as
llama.cpp's tree decode would); `RecordedDraft` drafts the recorded greedy continuation of its position, with rows
whose top probability is the recorded confidence (`logits_row`; with a format-2 recording, the draft's recorded
alternatives rank next). Only these two are fakes: the loop, the speculators and the acceptance rules are the
engine's own (replay.py).

Sampled recordings (format 3, T > 0): `SampledVocab` maps a recording's ids onto a compact vocabulary and rebuilds a
position's recorded distribution as a row of logits; `SampledTarget` and `SampledDraft` answer with the recorded
distribution at their depth in the generation (the recorded trajectory's context stands in for whatever the replay
sampled before it: the approximation of a sampled replay). `row_alpha` and `sampled_acceptance` read acceptance
rates off those rows (the sampled oracle's inputs, oracle.py).

Importing this module loads nothing of llama.cpp.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from edgespec.prompts.infill import InfillVocab

from .curves import Clock, Curve, draft_call_seconds
from .traces import CONF_SCALE, LOGP_SCALE, continuation_with_alternatives


class TraceTarget:
    """The target as the loop sees it (speculate.LanguageModel): it answers every row with the recorded greedy
    trace's next token and charges verify(n) per decode of n tokens, overhead per cycle (at truncate)."""

    def __init__(self, full: list[int], n_vocab: int, eog: frozenset[int], verify: Any, overhead: float, clock: Clock,
                 factor: Any = None) -> None:
        self.full = full
        self.factor = factor or (lambda n, depth: 1.0)
        self.n_vocab = n_vocab
        self.n_ctx = len(full) + 64
        self.n_decoded = 0
        self.eog = eog
        self.verify = verify
        self.overhead = overhead
        self.clock = clock
        self.cached: list[int] = []
        self.prefill_rows = False  # did the loop's prefill ask for the last prompt token's logits?
        self.charge = True  # False while replay_streams runs its decode inside a batch it charges once

    @property
    def n_past(self) -> int:
        return len(self.cached)

    def sync(self, tokens: Sequence[int], rows: Sequence[int] = (-1,), *, should_stop: Any = None, progress: Any = None) -> np.ndarray:
        """The prompt's prefill: not part of decode time (bench rates exclude it)."""
        self.prefill_rows = bool(rows)
        self.cached = list(tokens)
        self.n_decoded += len(tokens)
        return self._rows(0, [r % len(tokens) for r in rows]) if rows else np.empty((0, self.n_vocab), np.float32)

    def _rows(self, start_pos: int, rows: Sequence[int]) -> np.ndarray:
        out = np.zeros((len(rows), self.n_vocab), np.float32)
        last = len(self.full) - 1
        for i, r in enumerate(rows):
            out[i, self.full[min(start_pos + r + 1, last)]] = 1.0  # row r predicts the token after position start + r
        return out

    def decode(self, tokens: Sequence[int], start_pos: int, rows: Sequence[int] = (-1,)) -> np.ndarray:
        assert start_pos == len(self.cached), (start_pos, len(self.cached))
        n = len(tokens)
        if self.charge:
            self.clock.now += self.verify(n) * self.factor(n, start_pos + n)
        self.cached += list(tokens)
        self.n_decoded += n
        return self._rows(start_pos, [r % n for r in rows])

    def decode_tree(self, tokens: Sequence[int], depths: Sequence[int], seq_ids: Sequence[Sequence[int]]) -> np.ndarray:
        """A token tree's verify (backend.Model.decode_tree's layout: row 0 the root, the context's last token; row i at
        depth depths[i] on the tree paths seq_ids[i]), charged verify(rows) like a chain of as many tokens. A row whose
        path follows the trace predicts the trace's next token; any other row is never read (greedy acceptance walks
        only along the trace), so it is left all zeros."""
        start = len(self.cached)
        n = len(tokens)
        if self.charge:
            self.clock.now += self.verify(n) * self.factor(n, start + max(depths) + 1)
        out = self._tree_rows(start, tokens, depths, seq_ids)
        self.cached.append(int(tokens[0]))
        self.n_decoded += n
        return out

    def _tree_rows(self, start: int, tokens: Sequence[int], depths: Sequence[int], seq_ids: Sequence[Sequence[int]]) -> np.ndarray:
        """decode_tree's rows for a tree rooted at context position `start` (see decode_tree)."""
        on_path: dict[int, dict[int, int]] = {}  # path id -> depth -> token
        for tok, d, ids in zip(tokens, depths, seq_ids):
            for s in ids:
                on_path.setdefault(s, {})[d] = tok
        out = np.zeros((len(tokens), self.n_vocab), np.float32)
        last = len(self.full) - 1
        for i, (d, ids) in enumerate(zip(depths, seq_ids)):
            path = on_path[ids[0]] if ids else {}
            if all(start + j <= last and path.get(j) == self.full[start + j] for j in range(1, d + 1)):
                out[i, self.full[min(start + d + 1, last)]] = 1.0
        return out

    def keep_tree_path(self, path: int, tokens: Sequence[int]) -> None:
        self.cached += [int(t) for t in tokens]
        self.clock.now += self.overhead  # a tree cycle ends here, a chain cycle at truncate (a first cycle that is a tree
        # truncates the prefill's last token first: it is charged twice, once per prompt)

    def truncate(self, n_past: int) -> None:
        del self.cached[n_past:]
        self.clock.now += self.overhead  # once per cycle, outside the timed draft and verify

    def is_eog(self, token: int) -> bool:
        return token in self.eog

    def infill_vocab(self) -> InfillVocab:
        """Never asked: the replay does not sample fill-in-the-middle (SamplingParams.infill)."""
        raise NotImplementedError("the replay's target has no vocabulary for infill sampling")


def logits_row(token: int, confidence: float, alternatives: Sequence[tuple[int, float]] = ()) -> np.ndarray:
    """A logits row whose argmax is `token` and whose top softmax probability is `confidence`; with alternatives
    [(token, probability), ...] (the draft's next-best tokens, recorded), those rank next with those probabilities
    (kept strictly below the drafted token: a recorded near-tie rounds to a tie; scaled down where they and the
    confidence add up to more than 1, as a second recording pass can give). The rest of the mass is spread evenly below
    them, over as many entries as that takes, so the top probability stays `confidence`."""
    c = min(max(float(confidence), 1e-4), 1.0)
    alts = [(int(t), max(float(p), 1e-6)) for t, p in alternatives if int(t) != token]
    total = sum(p for _, p in alts)
    if total > (1.0 - c) * 0.999:  # recorded in another pass than the confidence (its numerics differ a little): scaled
        alts = [(t, max(p * (1.0 - c) * 0.999 / total, 1e-9)) for t, p in alts]  # so that the row holds both
    logit = {t: min(math.log(p / c), -1e-4) for t, p in alts}  # relative to the drafted token's 0
    rest = 1.0 / c - 1.0 - sum(math.exp(x) for x in logit.values())  # the others' mass, in units of exp(0)
    n = max([token + 1, int(1.0 / c) + 2] + [t + 1 for t in logit])
    others = n - 1 - len(logit)
    if rest > 1e-9 and logit:  # each of the others below the smallest alternative: enough of them to hold the rest
        others = max(others, math.ceil(rest / math.exp(min(logit.values()) - 1e-3)))
        n = others + 1 + len(logit)
    v = math.log(rest / others) if rest > 1e-9 and others > 0 else -1e4
    row = np.full(n, v, dtype=np.float32)
    for t, x in logit.items():
        row[t] = x
    row[token] = 0.0
    return row


class RecordedDraft:
    """The draft model as ModelSpeculator sees it (drafting.model.DraftModel): after a context of prompt +
    trace[:t] it drafts the recorded greedy continuation of position t, one token per decode, with rows whose top
    probability is the recorded confidence (and, from format-2 traces, whose next-best tokens are the recorded
    alternatives: what a draft-model tree puts beside the drafted token). Charges draft per decoded token and a
    batch cost for catch-ups."""

    n_ctx = 1 << 30
    n_vocab = 1 << 30  # never "foreign": the recording only holds ids of the real vocabulary

    def __init__(self, n_prompt: int, segments: list, draft_len: int, eog: frozenset[int], cost: Curve, clock: Clock) -> None:
        self.P = n_prompt
        self.segments = segments
        self.draft_len = draft_len
        self.eog = eog
        self.cost = cost
        self.clock = clock
        self.cached: list[int] = []
        self._cont: tuple[list[int], list[float]] = ([], [])
        self._alts: list[list[tuple[int, float]]] | None = None  # per drafted position (format-2 traces), else None
        self._i = 0
        from edgespec.drafting.costs import VerifyCurve

        self.curve = VerifyCurve(cost.draft_verify or cost.verify)

    @property
    def n_past(self) -> int:
        return len(self.cached)

    def common_prefix(self, tokens: Sequence[int]) -> int:
        from edgespec.llama.prompt_cache import common_prefix

        return common_prefix(self.cached, tokens)

    def batch_cost(self, n: int) -> float:
        return draft_call_seconds(self.cost, self.curve, n, len(self.cached) + n)

    def _row(self) -> np.ndarray:
        toks, conf = self._cont
        if self._i >= len(toks):
            raise RuntimeError(
                f"the draft was asked for token {self._i + 1} of a recorded continuation of {len(toks)} "
                f"(recorded draft_len {self.draft_len}: use --draft-max <= {self.draft_len})"
            )
        alts = self._alts[self._i] if self._alts is not None else ()
        return logits_row(toks[self._i], conf[self._i], alts)[None]

    def _catch_up(self, tokens: Sequence[int], rows: Sequence[int]) -> None:
        """sync's cache and cost: the tokens the cache lacks (at least the last one when a row is wanted), as one batch."""
        from edgespec.llama.prompt_cache import common_prefix

        tokens = list(tokens)
        keep = common_prefix(self.cached, tokens)
        if rows and keep == len(tokens):
            keep -= 1
        self.cached = tokens[:keep]
        self.clock.now += self.batch_cost(len(tokens) - keep)
        self.cached = tokens

    def sync(self, tokens: Sequence[int], rows: Sequence[int] = (-1,)) -> np.ndarray:
        self._catch_up(tokens, rows)
        if not rows:
            return np.empty((0, 1), np.float32)
        toks, conf, self._alts = continuation_with_alternatives(self.segments, len(tokens) - self.P, self.draft_len)
        self._cont = (toks, conf)
        self._i = 0
        return self._row()

    def decode(self, tokens: Sequence[int], start_pos: int, rows: Sequence[int] = (-1,)) -> np.ndarray:
        assert start_pos == len(self.cached)
        assert len(tokens) == 1 and tokens[0] == self._cont[0][self._i], "the speculator drafted an unrecorded token"
        self.clock.now += self.batch_cost(1)
        self.cached += list(tokens)
        self._i += 1
        return self._row()

    def is_eog(self, token: int) -> bool:
        return token in self.eog


N_TAIL = 64  # ids past the recorded tokens that hold each row's unrecorded mass (never a real token)


class SampledVocab:
    """A format-3 recording's rows on a compact vocabulary: every id its prompts, trajectories, end tokens and
    recorded distributions use, then N_TAIL ids for the rest. A row holds a position's K recorded log probabilities
    (traces.top_rows), strictly in the recorded order, and spreads the mass K leaves over the other ids, each
    below the least recorded one (so a top-k of at most K, the bench's, keeps exactly the recorded tokens; without
    one the tail is approximated)."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        ids: set[int] = set(int(t) for t in data["eog_ids"])
        for rec in data["prompts"]:
            ids.update(rec["prompt"])
            ids.update(rec["trace"])
            for key in ("target", "draft"):
                for entry in rec[key]:
                    ids.update(entry[0])
        self.ids = sorted(ids)
        self.index = {t: i for i, t in enumerate(self.ids)}
        self.width = len(self.ids) + N_TAIL

    def map(self, tokens: Sequence[int]) -> list[int]:
        return [self.index[int(t)] for t in tokens]

    def row(self, entry: Sequence[Sequence[int]]) -> np.ndarray:
        """One recorded position as logits over the compact vocabulary (log probabilities: softmax = the recording)."""
        ids, lps = entry
        x = np.asarray(lps, dtype=np.float64) / LOGP_SCALE
        # strictly in the recorded order (rounding to LOGP_SCALE makes near-ties ties, which the sampler's filters would
        # break by id, not as the recording's rows did)
        x = np.minimum.accumulate(x - 1e-5 * np.arange(x.size))
        rest = max(1.0 - float(np.exp(x).sum()), 0.0)
        others = self.width - len(ids)
        floor = float(x.min()) - 1e-3  # every other id stays below the least recorded one
        v = min(math.log(rest / others), floor) if rest > 1e-12 else floor - 30.0
        row = np.full(self.width, v, dtype=np.float32)
        row[[self.index[int(t)] for t in ids]] = x
        return row


class SampledPrompt:
    """One format-3 prompt on the compact vocabulary: its prompt and trajectory, and the target's (p) and the draft's
    (q) rows at trajectory index i (the next token after prompt + trajectory[:i]), clamped to the recording's ends."""

    def __init__(self, rec: Mapping[str, Any], vocab: SampledVocab) -> None:
        self.vocab = vocab
        self.rec = rec
        self.prompt = vocab.map(rec["prompt"])
        self.trace = vocab.map(rec["trace"])

    def _at(self, key: str, i: int) -> np.ndarray:
        entries = self.rec[key]
        return self.vocab.row(entries[min(max(i, 0), len(entries) - 1)])

    def p(self, i: int) -> np.ndarray:
        return self._at("target", i)

    def q(self, i: int) -> np.ndarray:
        return self._at("draft", i)


class SampledTarget(TraceTarget):
    """The target for a sampled replay: every row is the recorded target distribution at its depth in the generation
    (the recorded trajectory's context stands in for whatever was sampled before it: the approximation of a sampled
    replay), charged as TraceTarget charges."""

    def __init__(self, sp: SampledPrompt, eog: frozenset[int], verify: Any, overhead: float, clock: Clock, factor: Any = None) -> None:
        super().__init__(sp.prompt + sp.trace, sp.vocab.width, eog, verify, overhead, clock, factor)
        self.sp = sp
        self.P = len(sp.prompt)

    def _rows(self, start_pos: int, rows: Sequence[int]) -> np.ndarray:
        return np.stack([self.sp.p(start_pos + r + 1 - self.P) for r in rows]) if rows else np.empty((0, self.n_vocab), np.float32)

    def _tree_rows(self, start: int, tokens: Sequence[int], depths: Sequence[int], seq_ids: Sequence[Sequence[int]]) -> np.ndarray:
        return np.stack([self.sp.p(start + d + 1 - self.P) for d in depths])


class SampledDraft(RecordedDraft):
    """The draft for a sampled replay: the recorded draft distribution at its depth in the generation, whatever token
    it was given (it samples from these rows through the speculator, as the engine's draft does); costs as
    RecordedDraft's."""

    def __init__(self, sp: SampledPrompt, eog: frozenset[int], cost: Curve, clock: Clock) -> None:
        super().__init__(len(sp.prompt), [], 0, eog, cost, clock)
        self.sp = sp
        self.n_vocab = sp.vocab.width

    def sync(self, tokens: Sequence[int], rows: Sequence[int] = (-1,)) -> np.ndarray:
        self._catch_up(tokens, rows)
        return self.sp.q(len(self.cached) - self.P)[None] if rows else np.empty((0, self.n_vocab), np.float32)

    def decode(self, tokens: Sequence[int], start_pos: int, rows: Sequence[int] = (-1,)) -> np.ndarray:
        assert start_pos == len(self.cached)
        self.clock.now += self.batch_cost(len(tokens))
        self.cached += list(tokens)
        return self.sp.q(len(self.cached) - self.P)[None] if rows else np.empty((0, self.n_vocab), np.float32)


def sampled_params(meta: Mapping[str, Any]) -> Any:
    """The sampling settings a format-3 recording was sampled with (no seed: the replay draws from its own source,
    and an engine drafts trees only for unseeded generations)."""
    from edgespec.config import SamplingParams

    s = meta["sampling"]
    return SamplingParams(temperature=float(s["temperature"]), top_k=int(s["top_k"]), top_p=float(s["top_p"]), min_p=float(s["min_p"]))


def row_alpha(sp: SampledPrompt, i: int, params: Any) -> float:
    """sum_x min(p(x), q(x)) of the replay's rows at trajectory index i after the sampler's filters: what a sampled
    draft token is accepted with there (the recording's exact value is rec["alpha"][i])."""
    from edgespec.decoding.acceptance import expected_acceptance
    from edgespec.decoding.sampling import warp

    hist = sp.prompt + sp.trace[:i]
    return expected_acceptance(warp(sp.p(i), params, hist), warp(sp.q(i), params, hist))


def sampled_acceptance(sp: SampledPrompt, params: Any, k_max: int, spec: Any) -> tuple[list[float], list[list[float]]]:
    """Per trajectory index t: the draft model's acceptance rate there (the recorded alpha) and the n-gram lookup's
    per-token acceptance of its proposal (up to k_max tokens, from prompt + trajectory[:t]): p(d_i) at index t + i
    after the sampler's filters (a deterministic draft token is accepted with the target's probability of it)."""
    from edgespec.decoding.acceptance import expected_acceptance
    from edgespec.drafting.ngram import NgramIndex
    from edgespec.decoding.sampling import warp

    n = len(sp.trace)
    alpha = [a / CONF_SCALE for a in sp.rec["alpha"]]
    probs = [warp(sp.p(i), params, sp.prompt + sp.trace[:i]) for i in range(n)]
    idx = NgramIndex(spec.ngram_n_max, spec.ngram_n_min)
    lookup = []
    for t in range(n):
        m = idx.lookup(sp.prompt + sp.trace[:t], k_max)
        lookup.append([expected_acceptance(probs[t + i], None, d) for i, d in enumerate(m.tokens[: n - t])])
    return alpha, lookup
