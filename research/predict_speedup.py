#!/usr/bin/env python3
"""Predict edgespec's greedy speedup on any hardware from its measured costs, without the models.

    .venv/bin/python research/predict_speedup.py --curve research/data/curve_gpu_flat.json
    .venv/bin/python research/predict_speedup.py --curve bench.json          # the costs an `edgespec bench --json` used
    .venv/bin/python research/predict_speedup.py --curve ~/.cache/edgespec/calibration.json --json out.json
    .venv/bin/python research/predict_speedup.py measure TARGET.gguf [DRAFT.gguf] --n-gpu-layers -1 --out curve.json

Acceptance does not depend on the hardware; cost does. At temperature 0 every accepted context is the target's
greedy trace, so what a drafter proposes at a position depends only on the trace: research/record_traces.py recorded
the real pair's traces on the 5 bench suites and the draft model's greedy continuation (with its confidences) at
every position (research/data/traces.json.gz). This script replays them through edgespec's own code: the
speculation loop (speculate.speculate), the speculators from speculators.make_speculator (Controller, NgramPolicy,
the real NgramIndex, the hardware gate), on a CostModel built from the curve file, as the engine builds it. Only
the two models are fakes: the target answers with the recorded trace, the draft with its recorded continuations,
and each advances a virtual clock by what the curve file says the call costs (no wall clock):

    target decode of n tokens   verify(n)                            (the curve)
    draft: one token            draft                                (seconds per draft token)
    draft: catching up m tokens draft_verify(m), else draft * verify(m) / verify(1)
    every cycle                 overhead                             (Python work outside both models; default 0)

The engine's online learning runs as in a bench, fed with these modelled times: each drafter kind replays through
one edgespec.drafting.learning.LearningState, the engine's own (the curve, the draft's cost and gate, the estimators, the rate
guard and the suffix memory carry over from prompt to prompt), driven through the methods Engine._run calls.
Speedup per suite = plain decode time / speculative decode time over the suite's prompts (summed tokens / summed
seconds on each side, as `edgespec bench` reports it), for each drafter kind the engine has: model, ngram,
model+ngram (the default, "auto" with a draft model), and with --kinds the suffix-index drafters suffix and
model+suffix, whose token trees the fake target verifies as llama.cpp's tree decode would (one decode of the tree's
nodes costs verify(nodes + 1); the memory starts empty and holds every prompt and output replayed before, as one
engine's would in a bench run).

The oracle: knowing how many tokens each proposal would get accepted (the recorded continuation's and the lookup's
match with the trace), the fewest modelled seconds to produce each trace, by dynamic programming over positions
(per cycle: plain, or any k up to the number that will be accepted, from the model or the lookup). No policy that
drafts from the same proposals can beat it (it ignores the draft's catch-up cost, so it is a bound, slightly
optimistic for the model drafter).

Sampling (--sampled, T > 0): a sampled output has no single trace, so research/record_traces.py --sampled recorded one
trajectory per prompt, sampled plainly at T = 1.0 with the bench's settings (top-k 40, top-p 0.95, min-p 0.05), and at
every position both models' 40 most likely tokens with their probabilities (research/data/traces_t1.json.gz). The
replay then samples for real, through the same loop and the engine's exact acceptance rules, from rows rebuilt from
the recording (their sum of min(p, q) after the sampler's filters matches the recorded exact acceptance rate, 5e-5
apart on average, except where a top-p or min-p threshold falls within the rounding of a recorded probability: with
the bench's top-k of 40 nothing the sampler keeps is missing). What is approximated: a row is the
recorded distribution at its depth in the output, i.e. after the recorded trajectory's context, whatever the replay
sampled before it; the lookup drafters see the tokens the replay sampled. Speedups are rates (the two sides may stop
at different lengths); the oracle is the best expected rate of a policy that knows every position's acceptance
probability (the draft's recorded rate; the lookup's p of its proposed token along the recorded trajectory) but not
the draws, by dynamic programming over positions with acceptances independent.

Curve files: {"verify": {"1": s, "2": s, ...}, "draft": s_per_token, optional "overhead": s_per_cycle,
"draft_verify": {"1": s, ...}, "host": {"cycle": s, "row": s}, "name": ...}. "host" (or --host-cost CYCLE_MS,ROW_MS) is
the engine's own work on that machine (bench/host_bench.py --fit): charged per cycle, and per logits row on top of
every verified row and every drafted token (Curve.with_host). Also accepted: an `edgespec bench --json` report (its
costs.calibration) and edgespec's calibration cache (the most recently used entry). `measure` writes one for any
pair of GGUF files on this machine (CPU or GPU offload): verify sizes 1..64 by default, the draft's per-token cost
and its curve up to 17 tokens (for catch-ups).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's edgespec

from edgespec.bench.traces import CONF_SCALE, LOGP_SCALE, continuation, continuation_with_alternatives  # noqa: E402
from edgespec.fsutil import atomic_write_text  # noqa: E402
from edgespec.drafting.learning import LearningState  # noqa: E402
from edgespec.runtime.request import DrafterKind  # noqa: E402

DEFAULT_TRACES = HERE / "data" / "traces.json.gz"
DEFAULT_SAMPLED = HERE / "data" / "traces_t1.json.gz"  # the sampled recording (T = 1.0 with the bench's settings)
# the chain drafters (an oracle each) and the default set; the suffix-index drafters: token trees (no oracle: it is over
# chains). DrafterKind is a str Enum: its members are the report's keys as they are.
KINDS = (DrafterKind.MODEL, DrafterKind.NGRAM, DrafterKind.MODEL_NGRAM)
TREE_KINDS = (DrafterKind.SUFFIX, DrafterKind.MODEL_SUFFIX)


# --------------------------------------------------------------------------------------------- costs
@dataclass
class Curve:
    """Costs from a curve file: verify {n: s}, draft s/token, overhead s/cycle, draft_verify {n: s} (optional)."""

    verify: dict[int, float]
    draft: float
    overhead: float = 0.0
    draft_verify: dict[int, float] | None = None
    name: str = ""
    # how a decode's cost grows with the context it runs at: {"verify": {depth: {n: factor}}, "draft": {depth: factor}},
    # factors relative to the curve above (measured after a short context); None = the same at every depth
    depth_scale: dict[str, Any] | None = None
    # also charge the Python work the replay really does between model calls (this machine's wall clock: the loop,
    # the speculators, the acceptance math; the fakes' row building stands in for llama.cpp's logits copy)
    python_time: bool = False
    # the engine's measured host work folded in (with_host): seconds per logits row it handles (a verify row, a
    # drafted token), already added to verify and draft; the per-cycle part is in overhead
    host_row: float = 0.0
    host_cycle: float = 0.0

    def with_host(self, cycle: float, row: float) -> "Curve":
        """The curve with the engine's host work charged: `row` seconds per logits row (each target row verified and
        each token drafted: warping, sampling, the acceptance math on it) and `cycle` seconds per cycle (the loop, the
        controller, detokenization, the hand-off to the caller), as bench/host_bench.py measures them."""
        from dataclasses import replace

        if not (cycle >= 0 and row >= 0 and math.isfinite(cycle) and math.isfinite(row)):
            raise ValueError(f"host costs must be finite and >= 0, got {cycle}, {row}")
        dv = None if self.draft_verify is None else {n: s + row for n, s in self.draft_verify.items()}
        return replace(
            self, verify={n: s + n * row for n, s in self.verify.items()}, draft=self.draft + row, draft_verify=dv,
            overhead=self.overhead + cycle, host_row=self.host_row + row, host_cycle=self.host_cycle + cycle,
            name=f"{self.name} [host {1000 * cycle:.3f} ms/cycle + {1000 * row:.3f} ms/row]",
        )

    def verify_factor(self, n: int, depth: int) -> float:
        return _depth_factor((self.depth_scale or {}).get("verify"), depth, n)

    def draft_factor(self, depth: int) -> float:
        return _depth_factor((self.depth_scale or {}).get("draft"), depth, None)

    def with_draft_relative(self, rel: float) -> "Curve":
        """The same curve with the draft at `rel` x one target token (its catch-up curve, if any, scaled alike)."""
        from dataclasses import replace

        if not (rel >= 0 and math.isfinite(rel)):
            raise ValueError(f"a draft's relative cost must be >= 0, got {rel}")
        h = self.host_row  # the host's share of a row is not the model's: rel scales the model's time alone
        one = (self.verify.get(1) or min(self.verify.values())) - h
        new = rel * one
        dv = None
        if self.draft_verify is not None and self.draft - h > 0:
            dv = {n: (s - h) * new / (self.draft - h) + h for n, s in self.draft_verify.items()} if new > 0 else None
        return replace(self, draft=new + h, draft_verify=dv, name=f"{self.name} [draft {rel:g}x]")

    def describe(self) -> dict[str, Any]:
        one = self.verify.get(1) or min(self.verify.values())
        return {
            "name": self.name,
            "verify": {str(n): s for n, s in sorted(self.verify.items())},
            "verify_relative": {str(n): round(s / one, 4) for n, s in sorted(self.verify.items())},
            "draft": self.draft,
            "draft_relative": round(self.draft / one, 4),
            "overhead": self.overhead,
            "draft_verify": None if self.draft_verify is None else {str(n): s for n, s in sorted(self.draft_verify.items())},
            "depth_scale": self.depth_scale,
            "python_time": self.python_time,
            "host": {"cycle": self.host_cycle, "row": self.host_row},
        }


def _depth_factor(table: Mapping[str, Any] | None, depth: int, n: int | None) -> float:
    """Linear interpolation over depths (clamped at the ends) of a factor; per batch size n when the table has one
    per size (interpolated over n, clamped)."""
    if not table:
        return 1.0
    depths = sorted(int(d) for d in table)
    vals = []
    for d in depths:
        v = table[str(d)]
        if isinstance(v, Mapping):
            ns = sorted(int(k) for k in v)
            vals.append(float(np.interp(n or 1, ns, [float(v[str(k)]) for k in ns])))
        else:
            vals.append(float(v))
    return float(np.interp(depth, depths, vals))


def _points(raw: Mapping[Any, Any]) -> dict[int, float]:
    pts = {int(n): float(s) for n, s in raw.items()}
    if not pts or any(n < 1 or not (0 < s < math.inf) for n, s in pts.items()):
        raise ValueError(f"a verify curve needs {{n >= 1: seconds > 0}}, got {dict(raw)}")
    return pts


def load_curve(path: str | Path) -> Curve:
    """A curve file, a bench --json report, or edgespec's calibration cache (see the module docstring)."""
    p = Path(path).expanduser()
    data = json.loads(p.read_text(encoding="utf-8"))
    name = p.name
    if isinstance(data, dict) and isinstance(data.get("costs"), dict) and "calibration" in data["costs"]:
        data = data["costs"]["calibration"]  # an edgespec bench --json report
        name += " (bench report costs)"
    elif isinstance(data, dict) and isinstance(data.get("entries"), dict):  # the calibration cache
        entries = [e for e in data["entries"].values() if isinstance(e, dict) and "verify" in e]
        if not entries:
            raise ValueError(f"{p}: no calibration entries")
        data = max(entries, key=lambda e: float(e.get("used") or e.get("when") or 0))
        name += " (latest calibration entry)"
    if not isinstance(data, dict) or "verify" not in data:
        raise ValueError(f"{p}: expected {{\"verify\": {{n: seconds}}, \"draft\": seconds}}")
    dv = data.get("draft_verify")
    curve = Curve(
        verify=_points(data["verify"]),
        draft=float(data.get("draft", 0.0)),
        overhead=float(data.get("overhead", 0.0)),
        draft_verify=_points(dv) if dv else None,
        name=str(data.get("name") or name),
        depth_scale=data.get("depth_scale"),
    )
    host = data.get("host")  # {"cycle": s, "row": s}: the engine's host work measured on that machine
    if isinstance(host, dict):
        curve = curve.with_host(float(host.get("cycle", 0.0)), float(host.get("row", 0.0)))
    return curve


class Clock:
    """The virtual clock the speculation loop reads instead of time.perf_counter: the modelled seconds of the model
    calls, plus (real=True) the wall-clock seconds spent since it was made (the Python work around them)."""

    def __init__(self, real: bool = False) -> None:
        import time

        self.now = 0.0
        self._wall = time.perf_counter if real else None
        self._t0 = time.perf_counter() if real else 0.0

    def perf_counter(self) -> float:
        return self.now + (self._wall() - self._t0 if self._wall is not None else 0.0)


def draft_call_seconds(cost: Curve, curve: Any, n: int, depth: int) -> float:
    """One draft decode of n tokens that ends at context depth `depth`: draft per token for one, a catch-up batch
    shaped like `curve` (the draft's own, else the target's) above, scaled with the depth."""
    base = cost.draft if n <= 1 else curve(n) * cost.draft / curve(1)
    return base * cost.draft_factor(depth)


def cycle_decode_seconds(v: Any, cost: Curve, t: int, k: int, first_from_prefill: bool, n_prompt: int) -> float:
    """The target's decode in a cycle at trace position t that drafts k tokens: k + 1 tokens at their context depth;
    on the first cycle after a prefill that computed the last prompt token's row, only the k drafts (nothing for a
    plain step)."""
    if t == 0 and first_from_prefill:
        return v(k) * cost.verify_factor(k, n_prompt + k) if k else 0.0
    return v(k + 1) * cost.verify_factor(k + 1, n_prompt + t + k)


# --------------------------------------------------------------------------------------------- fake models
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
    """The draft model as ModelSpeculator sees it (speculators.model.DraftModel): after a context of prompt +
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


# --------------------------------------------------------------------------------------------- sampled traces (T > 0)
N_TAIL = 64  # ids past the recorded tokens that hold each row's unrecorded mass (never a real token)


class SampledVocab:
    """A format-3 recording's rows on a compact vocabulary: every id its prompts, trajectories, end tokens and
    recorded distributions use, then N_TAIL ids for the rest. A row holds a position's K recorded log probabilities
    (record_traces.top_rows), strictly in the recorded order, and spreads the mass K leaves over the other ids, each
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


def expected_oracle_seconds(
    n: int, cost: Curve, model_a: Sequence[float] | None, lookup_a: Sequence[Sequence[float]] | None, k_max: int,
    first_from_prefill: bool = False, n_prompt: int = 0,
) -> float:
    """The sampled replay's oracle: the fewest expected modelled seconds to produce n tokens for a policy that knows
    every position's acceptance probability but not the draws (dynamic programming over positions, acceptance at each
    position independent): per cycle plain, the draft model for any k <= k_max (position t + i accepted with
    model_a[t + i]) or the lookup for any k up to its proposal (lookup_a[t][i]); a cycle that drafts k and has j
    accepted emits j + 1 tokens. Costs as oracle_seconds charges them (the draft's catch-up ignored)."""
    from edgespec.drafting.costs import VerifyCurve

    v = VerifyCurve(cost.verify)
    o = cost.overhead
    f = [0.0] * (n + 1)

    def chain(t: int, acc: Sequence[float], per_token: float) -> float:
        """sum over j of P(exactly j of these accepted) * f[t + j + 1], for every prefix length k at once -> best."""
        best = math.inf
        reach, tail = 1.0, 0.0  # P(the first i accepted); the expectation over stops before i
        for k in range(1, len(acc) + 1):
            a = acc[k - 1]
            tail += reach * (1.0 - a) * f[t + k]
            reach *= a
            best = min(best, k * per_token + cycle_decode_seconds(v, cost, t, k, first_from_prefill, n_prompt) + o + tail + reach * f[t + k + 1])
        return best

    for t in range(n - 1, -1, -1):
        room = n - t - 1
        best = cycle_decode_seconds(v, cost, t, 0, first_from_prefill, n_prompt) + o + f[t + 1]
        if model_a is not None:
            best = min(best, chain(t, model_a[t : t + min(k_max, room)], cost.draft * cost.draft_factor(n_prompt + t)))
        if lookup_a is not None:
            best = min(best, chain(t, lookup_a[t][:room], 0.0))
        f[t] = best
    return f[0]


# --------------------------------------------------------------------------------------------- replay
def new_state(cost: Curve) -> LearningState:
    """What an engine starts a bench with on this curve (edgespec.drafting.learning.LearningState, the engine's own class):
    its live verify curve and the draft's cost from the file, a closed gate, fresh estimators and rate guards, and an
    empty suffix memory (it will hold every prompt and output replayed through this state)."""
    from edgespec.drafting.suffix_index import SuffixIndex

    return LearningState.from_costs(cost.verify, cost.draft, memory=SuffixIndex())


def run_one(
    rec: Mapping[str, Any], meta: Mapping[str, Any], kind: str | None, cost: Curve, state: LearningState, spec: Any,
    sampled: SampledPrompt | None = None, seed: int | Sequence[int] = 0,
) -> tuple[Any, bool]:
    """Replay one recorded prompt with drafter `kind` (None = plain decoding): its GenerationStats (decode seconds on
    the virtual clock) and whether the loop's prefill computed the last prompt token's logits. With `sampled` (a
    format-3 recording's prompt), the replay samples with the recording's settings from its rows, drawing from a
    source seeded with `seed`, and up to as many tokens as the recorded trajectory. `state` (a LearningState,
    new_state) carries what the engine learns from one prompt to the next, driven as Engine._run drives its own."""
    from edgespec.config import SamplingParams
    from edgespec.drafting.costs import VerifyCurve
    from edgespec.runtime.speculate import speculate
    from edgespec.stats import GenerationStats

    prompt, trace = list(rec["prompt"]), list(rec["trace"])
    eog = frozenset(meta["eog_ids"])
    truth = VerifyCurve(cost.verify)  # what a decode really costs (the file), apart from what the engine learns
    clock = Clock(real=cost.python_time)
    target: TraceTarget
    draft: RecordedDraft
    if sampled is not None:
        prompt, trace, eog = sampled.prompt, sampled.trace, frozenset(sampled.vocab.map(sorted(eog)))
        target = SampledTarget(sampled, eog, truth, cost.overhead, clock, cost.verify_factor)
        draft = SampledDraft(sampled, eog, cost, clock)
        sampling = sampled_params(meta)
    else:
        target = TraceTarget(prompt + trace, int(meta["n_vocab"]), eog, truth, cost.overhead, clock, cost.verify_factor)
        draft = RecordedDraft(len(prompt), rec["segments"], int(meta["draft_len"]), eog, cost, clock)
        sampling = SamplingParams(temperature=0)
    speculator = None
    cm = state.cost_model()
    if kind is not None:
        speculator = state.speculator(kind, spec, sampling, cm, draft, tree_paths=replay_tree_paths(kind, spec, meta))
        if state.model_draft_used(kind, spec, cm) and len(prompt) > 1:
            draft.cached = prompt[:-1]  # the bench's warm draft: prompt processed apart, not in decode time
    stats = GenerationStats()
    max_tokens = int(meta["max_tokens"]) if rec.get("stop") == "eos" and sampled is None else len(trace)
    out: list[int] = []
    rng = np.random.default_rng(seed)  # greedy: never drawn from, but speculate's signature asks for a source
    for step in speculate(target, prompt, sampling, rng, max_tokens=max_tokens, speculator=speculator, stats=stats, clock=clock.perf_counter):
        out += step.tokens
    if sampled is None and (out != trace[: len(out)] or len(out) != len(trace)):
        raise RuntimeError(f"{rec['name']}: the replay produced {len(out)} tokens that differ from the recorded trace")
    if kind is not None:
        state.end_generation(speculator, kind, spec, cm)
    return stats, target.prefill_rows


def replay_streams(
    recs: Sequence[Mapping[str, Any]], meta: Mapping[str, Any], kind: str | None, cost: Curve, state: LearningState, spec: Any,
) -> dict[str, float]:
    """Replay greedy recorded prompts as streams running together in an engine's slots (issue 34), on one virtual
    clock: each round every stream drafts (its draft's decodes charged one after another, as the engine runs them)
    and the rounds' verify decodes run as the engine's _Slots.execute runs them: in one decode charged verify(all
    rows) where the learnt curve says that costs less than BATCH_GAIN of the separate decodes, else one by one; each
    stream plans its drafts with the others' rows beside it (CostModel.others), as Engine._steps does. One stream is
    the engine alone. Returns the clock's seconds, the tokens, drafted tokens and cycles."""
    from edgespec.config import SamplingParams
    from edgespec.drafting.costs import VerifyCurve
    from edgespec.runtime.engine import BATCH_GAIN
    from edgespec.runtime.speculate import Verify, speculate_steps
    from edgespec.stats import GenerationStats

    clock = Clock()
    truth = VerifyCurve(cost.verify)
    sampling = SamplingParams(temperature=0)
    rng = np.random.default_rng(0)
    streams = []
    for rec in recs:
        prompt, trace = list(rec["prompt"]), list(rec["trace"])
        eog = frozenset(meta["eog_ids"])
        target = TraceTarget(prompt + trace, int(meta["n_vocab"]), eog, truth, cost.overhead, clock, cost.verify_factor)
        draft = RecordedDraft(len(prompt), rec["segments"], int(meta["draft_len"]), eog, cost, clock)
        cm = state.cost_model()
        spc = None
        if kind is not None:
            spc = state.speculator(kind, spec, sampling, cm, draft, tree_paths=replay_tree_paths(kind, spec, meta))
            if state.model_draft_used(kind, spec, cm) and len(prompt) > 1:
                draft.cached = prompt[:-1]
        stats = GenerationStats()
        max_tokens = int(meta["max_tokens"]) if rec.get("stop") == "eos" else len(trace)
        gen = speculate_steps(target, prompt, sampling, rng, max_tokens=max_tokens, speculator=spc, stats=stats, clock=clock.perf_counter)
        streams.append({"gen": gen, "target": target, "cm": cm, "spc": spc, "stats": stats, "out": [], "trace": trace,
                        "rec": rec, "item": None})
    last_rows: dict[int, int] = {}
    active = list(range(len(streams)))

    def advance(i: int, value: Any) -> bool:
        """Stream i on to its next Verify (True) or the end of its cycle (False; finished streams leave `active`)."""
        st = streams[i]
        try:
            item = st["gen"].send(value)
        except StopIteration:
            active.remove(i)
            last_rows.pop(i, None)
            if st["spc"] is not None:
                state.end_generation(st["spc"], kind, spec, st["cm"])  # type: ignore[arg-type]
            if st["out"] != st["trace"][: len(st["out"])]:
                raise RuntimeError(f"{st['rec']['name']}: the replay left the recorded trace") from None
            return False
        if isinstance(item, Verify):
            st["item"] = item
            return True
        st["out"] += item.tokens
        return False

    while active:
        waiting = []
        for i in list(active):
            streams[i]["cm"].others = sum(n for j, n in last_rows.items() if j != i) if i in last_rows else 0
            if advance(i, None):
                waiting.append(i)
        while waiting:
            reqs = [streams[i]["item"] for i in waiting]
            sizes = [r.n_rows for r in reqs]
            curve = state.curve
            results = []
            if len(reqs) > 1 and curve(sum(sizes)) < BATCH_GAIN * sum(curve(n) for n in sizes):
                depth = max(r.model.n_past + r.n_rows for r in reqs)
                for r in reqs:
                    r.model.charge = False
                    results.append(r.run())
                    r.model.charge = True
                    r.shared = True
                seconds = truth(sum(sizes)) * cost.verify_factor(sum(sizes), depth)
                clock.now += seconds
                curve.update(sum(sizes), seconds)
                last_rows.update({i: n for i, n in zip(waiting, sizes)})
            else:
                results = [r.run() for r in reqs]
                for i in waiting:
                    last_rows.pop(i, None)
            waiting = [i for i, res in zip(waiting, results) if advance(i, res)]
    return {"seconds": clock.now, "tokens": float(sum(len(st["out"]) for st in streams)),
            "drafted": float(sum(st["stats"].n_drafted for st in streams)), "cycles": float(sum(st["stats"].n_cycles for st in streams))}


def predict_streams(data: Mapping[str, Any], cost: Curve, spec: Any, n: int, suites: Sequence[str] = (),
                    kinds: Sequence[str] = KINDS) -> dict[str, Any]:
    """The aggregate rate of n streams together against the same prompts one after another (replay_streams), per suite
    (its prompts in groups of n, each way from a fresh engine state), for plain decoding and each drafter kind; with
    the drafted tokens per cycle each way (shorter drafts beside others on flat curves)."""
    if data.get("format") == 3:
        raise ValueError("the streams replay takes greedy recordings")
    out: dict[str, Any] = {"curve": cost.name, "streams": n, "suites": {}}
    by_suite: dict[str, list[Any]] = {}
    for p in data["prompts"]:
        if not suites or p["suite"] in suites:
            by_suite.setdefault(p["suite"], []).append(p)
    for suite, recs in by_suite.items():
        groups = [recs[i:i + n] for i in range(0, len(recs) - n + 1, n)] or [recs]
        row: dict[str, Any] = {}
        plain_alone = 1.0
        for kind in (None, *kinds):
            ways = {}
            for way in ("alone", "together"):
                state = new_state(cost)
                tot = {"seconds": 0.0, "tokens": 0.0, "drafted": 0.0, "cycles": 0.0}
                for g in groups:
                    parts = [replay_streams([r], data, kind, cost, state, spec) for r in g] if way == "alone" else \
                        [replay_streams(g, data, kind, cost, state, spec)]
                    for part in parts:
                        for k in tot:
                            tot[k] += part[k]
                ways[way] = tot
            a, t = ways["alone"], ways["together"]
            if kind is None:
                plain_alone = a["tokens"] / a["seconds"]
            row[str(kind or "plain")] = {
                "ratio": round((t["tokens"] / t["seconds"]) / (a["tokens"] / a["seconds"]), 3),
                "together_vs_plain_alone": round((t["tokens"] / t["seconds"]) / plain_alone, 3),
                "drafted_per_cycle": [round(a["drafted"] / max(a["cycles"], 1), 2), round(t["drafted"] / max(t["cycles"], 1), 2)],
            }
        out["suites"][suite] = row
    return out


def format_streams(res: Mapping[str, Any]) -> str:
    lines = [f"{res['curve']}: {res['streams']} streams, aggregate tok/s together / the same kind one after another "
             "[together / plain one after another] (drafted per cycle alone -> together)"]
    for suite, row in res["suites"].items():
        cells = [f"{k} {v['ratio']:.2f} [{v['together_vs_plain_alone']:.2f}] ({v['drafted_per_cycle'][0]} -> {v['drafted_per_cycle'][1]})"
                 for k, v in row.items()]
        lines.append(f"  {suite:16} " + "  ".join(cells))
    return "\n".join(lines)


def replay_tree_paths(kind: str, spec: Any, meta: Mapping[str, Any]) -> int:
    """The tree sequences Engine.load gives the target for `kind` (speculators.tree_paths_for), a draft model's
    siblings only from format-2 and format-3 recordings, which record the draft's alternatives (its distributions)."""
    from edgespec.drafting import tree_paths_for

    return tree_paths_for(kind, spec, meta.get("format", 1) >= 2)


def model_sibling_hits(
    rec: Mapping[str, Any], meta: Mapping[str, Any], proposals: Sequence[tuple[list[float], int, int]]
) -> list[int] | None:
    """Per position t, from model_proposals' (confidences, accepted r, offered) there: where the draft's chain misses
    (r < offered, not ended by an end token), the rank (1, 2, ...) of the trace's token among the draft's recorded
    alternatives at that position, else 0; None for traces without alternatives (format 1)."""
    if meta.get("format", 1) < 2:
        return None
    trace, eog = rec["trace"], frozenset(meta["eog_ids"])
    out = []
    for t, (_, r, offered) in enumerate(proposals):
        hit = 0
        if r < offered and t + r < len(trace) and not (r and trace[t + r - 1] in eog):
            alts = continuation_with_alternatives(rec["segments"], t, int(meta["draft_len"]))[2]
            if alts is not None:
                hit = next((j + 1 for j, (x, _) in enumerate(alts[r]) if x == trace[t + r]), 0)
        out.append(hit)
    return out


def model_proposals(rec: Mapping[str, Any], meta: Mapping[str, Any], k_max: int) -> list[tuple[list[float], int, int]]:
    """Per position t: the draft model's recorded confidences (first k_max), how many of its tokens the target would
    accept, and how many it offers (a continuation ends at an end token)."""
    trace, eog = rec["trace"], frozenset(meta["eog_ids"])
    out = []
    for t in range(len(trace)):
        toks, conf = continuation(rec["segments"], t, int(meta["draft_len"]))
        r = 0
        while r < min(k_max, len(toks)) and t + r < len(trace) and toks[r] == trace[t + r]:
            r += 1
            if toks[r - 1] in eog:
                break
        out.append((list(conf[:k_max]), r, min(k_max, len(toks))))
    return out


def ngram_proposals(rec: Mapping[str, Any], spec: Any, k_max: int) -> list[tuple[int, int, int]]:
    """Per position t: the n-gram lookup's proposal as (match run, proposed tokens, tokens the target would accept);
    run -1 where the lookup finds nothing."""
    from edgespec.drafting.ngram import NgramIndex
    from edgespec.llama.prompt_cache import common_prefix

    prompt, trace = list(rec["prompt"]), list(rec["trace"])
    idx = NgramIndex(spec.ngram_n_max, spec.ngram_n_min)
    out = []
    for t in range(len(trace)):
        m = idx.lookup(prompt + trace[:t], k_max)
        out.append((m.run if m.tokens else -1, len(m.tokens), common_prefix(m.tokens, trace[t:])))
    return out


def fitted_run_table(
    traces: Sequence[tuple[int, list[tuple[int, int, int]]]], cost: Curve, k_max: int, passes: int = 3
) -> tuple[float, dict[int, int]]:
    """The best any rule "draft k(m) tokens of a lookup whose match run is m" can do on these traces: a table from
    the estimator's run buckets (MatchLengthEstimator.BUCKET_EDGES) to k, fitted on the traces themselves by
    coordinate descent (so an optimistic bound for such rules; the engine's NgramPolicy learns online instead).
    traces: (n_prompt, ngram_proposals) per prompt. Returns (modelled seconds, {bucket's lowest run: k})."""
    from edgespec.drafting.costs import VerifyCurve
    from edgespec.drafting.estimators import MatchLengthEstimator

    v = VerifyCurve(cost.verify)
    edges = MatchLengthEstimator.BUCKET_EDGES
    bucket = [MatchLengthEstimator().bucket(m) for m in range(max(edges) + 2)]

    def seconds(table: list[int]) -> float:
        total = 0.0
        for n_prompt, props in traces:
            n, t = len(props), 0
            while t < n:
                run, n_tok, acc = props[t]
                k = 0 if run < 0 else min(table[bucket[min(run, len(bucket) - 1)]], n_tok, n - t - 1)
                total += cycle_decode_seconds(v, cost, t, k, False, n_prompt) + cost.overhead
                t += min(k, acc) + 1
        return total

    table = [0] * len(edges)
    best = seconds(table)
    for _ in range(passes):
        for b in range(len(edges)):
            for k in range(k_max + 1):
                trial = table[:b] + [k] + table[b + 1 :]
                sec = seconds(trial)
                if sec < best - 1e-12:
                    best, table = sec, trial
    return best, dict(zip(edges, table))


RULE_GRID = {"K": tuple(range(0, 9)), "theta": (0.0, 0.5, 0.7, 0.8, 0.9, 0.95), "R": (0, 1, 2, 3, 4, 1 << 30),
             "Kn": (1, 2, 4, 8, 16)}


def rule_seconds(
    prompts: Sequence[tuple[int, bool, list[tuple[list[float], int, int]], list[tuple[int, int, int]]]], cost: Curve,
    K: int, theta: float, R: int, Kn: int,
) -> float:
    """Modelled decode seconds of the fixed rule (K, theta, R, Kn) on these prompts: a cycle verifies the n-gram
    lookup's proposal (up to Kn tokens) when its match run is >= R, else the draft model drafts up to K tokens,
    stopping after the first whose confidence is below theta (K = 0: plain). Costs as the replay charges them: the
    target's decode of k + 1 tokens (k after the prefill's row on the first cycle), the draft's catch-up as one batch
    of the tokens it has not seen, then one decode per further drafted token, and the overhead per cycle.
    prompts: (n_prompt, first cycle from the prefill, model_proposals, ngram_proposals) per prompt."""
    from edgespec.drafting.costs import VerifyCurve

    v = VerifyCurve(cost.verify)
    dv = VerifyCurve(cost.draft_verify or cost.verify)
    total = 0.0
    for P, first_from_prefill, model, ngram in prompts:
        n, t, behind = len(model), 0, 1
        while t < n:
            room = n - t - 1
            run, n_tok, acc_n = ngram[t]
            k = acc = 0
            by_model = False
            if 0 <= R <= run:
                k = min(n_tok, Kn, room)
                acc = min(k, acc_n)
            if k == 0 and K:
                conf, r, offered = model[t]
                while k < min(K, offered, room):
                    k += 1
                    if conf[k - 1] < theta:
                        break
                if k:
                    by_model = True
                    acc = min(k, r)
                    total += draft_call_seconds(cost, dv, behind, P + t)  # the catch-up, with the first draft's row
                    total += sum(draft_call_seconds(cost, dv, 1, P + t + i) for i in range(1, k))
            total += cycle_decode_seconds(v, cost, t, k, first_from_prefill, P) + cost.overhead
            # the draft's cache: after its own cycle all but its last draft (and the bonus) or up to its first miss;
            # after a lookup or plain cycle it falls behind by every token emitted
            behind = (2 if acc == k else 1) if by_model else behind + acc + 1
            t += acc + 1
    return total


def fitted_rule(
    prompts: Sequence[tuple[int, bool, list[tuple[list[float], int, int]], list[tuple[int, int, int]]]], cost: Curve,
    passes: int = 2,
) -> tuple[float, dict[str, float]]:
    """The best fixed rule of rule_seconds' family on these prompts, fitted on them in hindsight by coordinate descent
    over RULE_GRID (from: plain decoding). A bound of the kind fitted_run_table is for the lookup alone: what a policy
    that decides from the draft's confidence and the lookup's match run, with its thresholds tuned to the suite, can
    reach. Returns (modelled seconds, the rule)."""
    rule = {"K": 0, "theta": 0.0, "R": 1 << 30, "Kn": 1}
    best = rule_seconds(prompts, cost, **rule)  # type: ignore[arg-type]
    for _ in range(passes):
        for pair in (("K", "theta"), ("R", "Kn")):
            a, b = pair
            for x in RULE_GRID[a]:
                for y in RULE_GRID[b]:
                    trial = {**rule, a: x, b: y}
                    sec = rule_seconds(prompts, cost, **trial)  # type: ignore[arg-type]
                    if sec < best - 1e-12:
                        best, rule = sec, trial
    return best, rule


def oracle_seconds(
    n: int, cost: Curve, model_r: Sequence[int] | None, ngram_r: Sequence[int] | None, first_from_prefill: bool = False,
    n_prompt: int = 0, model_sib: Sequence[int] | None = None,
) -> float:
    """The fewest modelled seconds to produce n tokens when every cycle may decode plainly or draft any k up to the
    number of tokens its proposal will get accepted (dynamic programming over positions). first_from_prefill: the
    loop's prefill already decoded the last prompt token, so the first cycle decodes only its k drafts (verify(k),
    nothing for a plain first token). model_sib (the tree oracle, model_sibling_hits): where the trace's token at the
    chain's first miss is among the draft's alternatives, a cycle may also draft the chain up to that miss with the
    matching alternative beside it (one more row) and emit one token more."""
    from edgespec.drafting.costs import VerifyCurve

    v = VerifyCurve(cost.verify)
    o = cost.overhead

    def decode(t: int, k: int) -> float:
        return cycle_decode_seconds(v, cost, t, k, first_from_prefill, n_prompt)

    f = [0.0] * (n + 1)
    for t in range(n - 1, -1, -1):
        best = decode(t, 0) + o + f[t + 1]
        room = n - t - 1  # drafted tokens that still fit (the loop's budget)
        if model_r is not None:
            for k in range(1, min(model_r[t], room) + 1):
                best = min(best, k * cost.draft * cost.draft_factor(n_prompt + t) + decode(t, k) + o + f[t + k + 1])
            if model_sib is not None and model_sib[t] and model_r[t] + 1 <= room:
                k = model_r[t] + 1  # the chain through its miss, the alternative beside the missed token: k + 1 nodes
                best = min(best, k * cost.draft * cost.draft_factor(n_prompt + t) + decode(t, k + 1) + o + f[t + k + 1])
        if ngram_r is not None:
            for k in range(1, min(ngram_r[t], room) + 1):
                best = min(best, decode(t, k) + o + f[t + k + 1])
        f[t] = best
    return f[0]


def predict(
    data: Mapping[str, Any], cost: Curve, spec: Any, suites: Sequence[str] = (), kinds: Sequence[str] = KINDS, fit: bool = False,
    fit_rules: bool = False, seed: int = 0,
) -> dict[str, Any]:
    """Predicted speedups per suite (and overall) for each drafter kind, and the oracle bounds; with fit, also the
    best fixed k-by-match-run rule fitted on each suite's traces (fitted_run_table); with fit_rules, the best fixed
    confidence / match-run rule for model+ngram fitted on each suite's traces (fitted_rule; overall: each suite with
    its own rule). seed: a sampled replay's draws (prompt i of the recording draws from [seed, i], every kind alike)."""
    from edgespec.drafting.costs import draft_model_pays

    sampled = data.get("format") == 3
    if sampled and (fit or fit_rules):
        raise ValueError("the fitted rules replay greedy traces only (this recording is sampled)")
    if not sampled and spec.draft_max > int(data["draft_len"]):
        raise ValueError(f"draft_max {spec.draft_max} exceeds the recorded draft length {data['draft_len']}")
    vocab = SampledVocab(data) if sampled else None
    params = sampled_params(data) if sampled else None
    prompts = [(no, p) for no, p in enumerate(data["prompts"]) if not suites or p["suite"] in suites]
    if not prompts:
        raise ValueError(f"no recorded prompts for suites {list(suites)}")
    from edgespec.stats import Totals

    states = {k: new_state(cost) for k in kinds}
    plain_state = new_state(cost)

    def new_sums() -> dict[str, Any]:
        oracles = {"model": 0.0, "ngram": 0.0, "model+ngram": 0.0, "model tree": 0.0, "model+ngram tree": 0.0}
        return {"prompts": 0, "plain": Totals(), **{k: Totals() for k in kinds}, "oracle": oracles, "oracle_tokens": 0,
                "proposals": [], "rules": [], "alpha": []}

    per_suite: dict[str, dict[str, Any]] = {}
    total = new_sums()
    oracle_cap = max(spec.draft_max, 1)
    ngram_cap = spec.ngram_draft_max if spec.adaptive else spec.draft_max
    for no, rec in prompts:
        sums = (per_suite.setdefault(rec["suite"], new_sums()), total)
        sp = SampledPrompt(rec, vocab) if vocab is not None else None
        st, first = run_one(rec, data, None, cost, plain_state, spec, sp, [seed, no])
        runs = {"plain": st, **{k: run_one(rec, data, k, cost, states[k], spec, sp, [seed, no])[0] for k in kinds}}
        n = len(rec["trace"])
        P = len(rec["prompt"])
        props: list[tuple[int, int, int]] = []
        if sp is not None:  # the expected-time oracles (a sampled replay's draws are not known ahead)
            alpha, lookup = sampled_acceptance(sp, params, ngram_cap, spec)
            oracle = {"model": expected_oracle_seconds(n, cost, alpha, None, oracle_cap, first, P),
                      "ngram": expected_oracle_seconds(n, cost, None, lookup, oracle_cap, first, P),
                      "model+ngram": expected_oracle_seconds(n, cost, alpha, lookup, oracle_cap, first, P)}
        else:
            mp = model_proposals(rec, data, oracle_cap)
            mr = [r for _, r, _ in mp]
            props = ngram_proposals(rec, spec, ngram_cap)
            nr = [acc for _, _, acc in props]
            oracle = {"model": oracle_seconds(n, cost, mr, None, first, P), "ngram": oracle_seconds(n, cost, None, nr, first, P),
                      "model+ngram": oracle_seconds(n, cost, mr, nr, first, P)}
            sib = model_sibling_hits(rec, data, mp)
            if sib is not None:  # the tree oracles: chains, or a chain with the matching alternative at its miss
                oracle["model tree"] = oracle_seconds(n, cost, mr, None, first, P, sib)
                oracle["model+ngram tree"] = oracle_seconds(n, cost, mr, nr, first, P, sib)
        for s in sums:
            s["prompts"] += 1
            s["oracle_tokens"] += n
            s["alpha"] += rec.get("alpha", [])
            s["proposals"].append((P, props))
            if fit_rules:
                s["rules"].append((P, first, mp, props))
            for k, r in runs.items():
                s[k].add(r)
            for k, v in oracle.items():
                s["oracle"][k] += v

    def summary(s: dict[str, Any]) -> dict[str, Any]:
        plain: Totals = s["plain"]
        out: dict[str, Any] = {"prompts": s["prompts"], "tokens": plain.n_generated, "plain_seconds": round(plain.decode_seconds, 6)}
        plain_rate = plain.n_generated / plain.decode_seconds  # tokens per modelled second (a sampled replay's
        # sides may stop at different lengths: rates, as `edgespec bench` compares them)
        for k in kinds:
            side: Totals = s[k]
            out[k] = {
                "speedup": round(side.n_generated / side.decode_seconds / plain_rate, 4),
                "seconds": round(side.decode_seconds, 6),
                "cycles": side.n_cycles,
                "spec_cycles": side.n_spec_cycles,
                "drafted": side.n_drafted,
                "accepted": side.n_accepted,
                "acceptance": round(side.acceptance, 4) if side.n_drafted else None,
                "sources": dict(sorted(side.source_counts.items())),
            }
        out["oracle"] = {k: round(s["oracle_tokens"] / v / plain_rate, 4) for k, v in s["oracle"].items() if v > 0}
        if s["alpha"]:  # a sampled recording: the draft's mean acceptance rate along the trajectories
            out["alpha"] = round(sum(s["alpha"]) / len(s["alpha"]) / CONF_SCALE, 4)
        if fit:
            sec, table = fitted_run_table(s["proposals"], cost, ngram_cap)
            out["fitted_ngram"] = {"speedup": round(plain.decode_seconds / sec, 4), "k_by_run": table}
        if fit_rules and s is not total:
            sec, rule = fitted_rule(s["rules"], cost)
            out["fitted_rule"] = {"speedup": round(plain.decode_seconds / sec, 4), "seconds": sec, "rule": rule}
        return out

    suite_results = {name: summary(s) for name, s in per_suite.items()}
    overall = summary(total)
    if fit_rules:  # every suite with its own fitted rule
        sec = sum(r["fitted_rule"]["seconds"] for r in suite_results.values())
        overall["fitted_rule"] = {"speedup": round(overall["plain_seconds"] / sec, 4), "seconds": sec}
    fresh = new_state(cost)  # what an engine starts with on this curve
    gate = draft_model_pays(fresh.cost_model(), max(spec.draft_max, 1), spec.draft_min)
    return {
        "curve": cost.describe(),
        "spec": {"draft_max": spec.draft_max, "adaptive": spec.adaptive, "ngram_draft_max": spec.ngram_draft_max},
        "draft_model_pays": gate,  # the hardware gate on this curve (adaptive mode)
        "draft_model_used": fresh.model_draft_used("model", spec),  # a fixed draft length bypasses the gate
        "traces": {k: data.get(k) for k in ("target", "draft", "recorded", "machine", "max_tokens", "draft_len", "sampling")},
        "suites": suite_results,
        "overall": overall,
    }


def format_table(result: Mapping[str, Any], kinds: Sequence[str] = KINDS) -> str:
    c = result["curve"]
    rel = c["verify_relative"]
    shown = " ".join(f"{n}:{rel[n]:.2f}" for n in rel if int(n) in (2, 4, 8, 16, 17, 32, 64))
    one = float(c["verify"].get("1") or min(c["verify"].values()))
    lines = [
        f"curve {c['name']}: 1 token {1000 * one:.2f} ms; verify x one token {shown}; draft {c['draft_relative']:.2f} x one "
        f"target token; overhead {1000 * c['overhead']:.2f} ms/cycle",
        "draft model " + ("pays here (hardware gate open)" if result["draft_model_pays"]
                          else "cannot pay here (hardware gate closed)")
        + ("" if result["draft_model_used"] == result["draft_model_pays"] else
           ("; used anyway: a fixed draft length bypasses the gate" if result["draft_model_used"] else ""))
        + ("" if result["draft_model_used"] else ": the engine does not run it (model = plain, model+ngram = ngram)"),
        "",
    ]
    fitted = "fitted_ngram" in result["overall"]
    rule = "fitted_rule" in result["overall"]
    chains = [k for k in KINDS if k in result["overall"]["oracle"]]
    head = (["suite", "n", "tokens"] + list(kinds) + (["fitted k(run) ngram"] if fitted else []) + (["fitted rule m+n"] if rule else [])
            + [f"oracle {k}" for k in chains])
    rows = []
    for name, s in list(result["suites"].items()) + [("overall", result["overall"])]:
        rows.append([name, str(s["prompts"]), str(s["tokens"])] + [f"{s[k]['speedup']:.2f}" for k in kinds]
                    + ([f"{s['fitted_ngram']['speedup']:.2f}"] if fitted else []) + ([f"{s['fitted_rule']['speedup']:.2f}"] if rule else [])
                    + [f"{s['oracle'][k]:.2f}" for k in chains])
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    fmt = lambda r: "  ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(r, widths)))  # noqa: E731
    lines.append(fmt(head))
    lines.append("  ".join("-" * w for w in widths))
    lines += [fmt(r) for r in rows]
    lines.append("")
    lines.append("speedup = speculative tokens per modelled second / plain's, summed over the suite's prompts; "
                 "oracle = the best any policy drafting chains from the same proposals could do (the suffix drafters "
                 "verify trees: they have none)."
                 + (f" Sampled replay ({result['traces']['sampling']}): the oracle is the best expected rate of a policy "
                    "that knows each position's acceptance probability, not the draws." if result["traces"].get("sampling") else "")
                 + (" fitted k(run) = the best table from match run to draft length, fitted on the suite's own traces "
                    "(what any rule that sees only the match run can reach)." if fitted else ""))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- profiles
DEFAULT_PROFILES = HERE / "data" / "curves"
DEFAULT_RELATIVE = (0.3, 0.45, 0.6, 0.8)
PROFILE_KINDS = (DrafterKind.MODEL, DrafterKind.MODEL_NGRAM)
# issue 23's goals for the default drafter (model+ngram): against its oracle overall and in every suite, against plain
# decoding in every suite, and where nothing pays (a profile whose name says Q4 on Metal)
GOALS = {"overall_vs_oracle": 0.90, "suite_vs_oracle": 0.85, "suite_vs_plain": 0.98, "nothing_pays_vs_plain": 0.99}


def profile_rows(data: Mapping[str, Any], curves: Sequence[tuple[str, Curve]], rels: Sequence[float], spec: Any,
                 suites: Sequence[str] = (), fit_rules: bool = False, seed: int = 0) -> list[dict[str, Any]]:
    """Every profile x draft cost x suite (and overall): the default drafter (model+ngram), its oracle, the draft
    model alone and its oracle; with fit_rules the best fixed rule for model+ngram fitted on each suite (fitted_rule)."""
    rows = []
    for pname, base in curves:
        for rel in rels:
            res = predict(data, base.with_draft_relative(rel), spec, suites, kinds=PROFILE_KINDS, fit_rules=fit_rules, seed=seed)
            for sname, s in list(res["suites"].items()) + [("overall", res["overall"])]:
                rows.append({
                    "profile": pname, "draft": rel, "suite": sname, "tokens": s["tokens"],
                    "default": s["model+ngram"]["speedup"], "oracle_default": s["oracle"]["model+ngram"],
                    "model": s["model"]["speedup"], "oracle_model": s["oracle"]["model"],
                    "model_used": res["draft_model_used"],
                    **({"oracle_default_tree": s["oracle"]["model+ngram tree"], "oracle_model_tree": s["oracle"]["model tree"]}
                       if "model tree" in s["oracle"] else {}),
                    "default_sources": s["model+ngram"]["sources"],
                    **({"alpha": s["alpha"]} if "alpha" in s else {}),
                    **({"fitted_rule": s["fitted_rule"]["speedup"]} if fit_rules else {}),
                })
    return rows


def goals_check(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per profile: the worst ratios over its draft costs, and whether issue 23's goals hold (see GOALS)."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        g = out.setdefault(r["profile"], {"overall_vs_oracle": math.inf, "suite_vs_oracle": math.inf, "suite_vs_plain": math.inf})
        ratio = r["default"] / r["oracle_default"]
        if r["suite"] == "overall":
            g["overall_vs_oracle"] = min(g["overall_vs_oracle"], ratio)
        else:
            g["suite_vs_oracle"] = min(g["suite_vs_oracle"], ratio)
            g["suite_vs_plain"] = min(g["suite_vs_plain"], r["default"])
    for name, g in out.items():
        nothing_pays = "q4" in name.lower() and "metal" in name.lower()
        g["met"] = (g["overall_vs_oracle"] >= GOALS["overall_vs_oracle"] and g["suite_vs_oracle"] >= GOALS["suite_vs_oracle"]
                    and g["suite_vs_plain"] >= GOALS["nothing_pays_vs_plain" if nothing_pays else "suite_vs_plain"])
    return out


def format_profiles(rows: Sequence[Mapping[str, Any]]) -> str:
    fitted = bool(rows) and "fitted_rule" in rows[0]
    trees = bool(rows) and "oracle_default_tree" in rows[0]
    head = ["profile", "draft", "suite", "default", "oracle m+n", "ratio", "model", "oracle model", "ratio"]
    head += ["tree oracle m+n", "tree oracle model"] if trees else []
    head += ["fitted rule", "default/fitted"] if fitted else []
    body = [[r["profile"], f"{r['draft']:g}", r["suite"], f"{r['default']:.2f}", f"{r['oracle_default']:.2f}",
             f"{r['default'] / r['oracle_default']:.2f}", f"{r['model']:.2f}" if r["model_used"] else "off",
             f"{r['oracle_model']:.2f}", f"{r['model'] / r['oracle_model']:.2f}"]
            + ([f"{r['oracle_default_tree']:.2f}", f"{r['oracle_model_tree']:.2f}"] if trees else [])
            + ([f"{r['fitted_rule']:.2f}", f"{r['default'] / r['fitted_rule']:.2f}"] if fitted else []) for r in rows]
    widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    fmt = lambda r: "  ".join(x.ljust(w) if i < 3 else x.rjust(w) for i, (x, w) in enumerate(zip(r, widths)))  # noqa: E731
    lines = [fmt(head), "  ".join("-" * w for w in widths)] + [fmt(b) for b in body]
    sampled = bool(rows) and "alpha" in rows[0]
    lines += ["", "default = model+ngram (the engine's drafter with a draft model), x plain decoding; oracle m+n = the best "
              + ("expected rate of any policy that knows each position's acceptance probability (not the draws), drafting "
                 "from the same proposals (a sampled replay); " if sampled else
                 "any policy drafting from the same proposals could do; ")
              + "model = the draft model alone ('off' = the engine "
              "does not run it on this curve: plain decoding); draft = the draft's cost in target tokens."
              + (" tree oracle = the same bound when a cycle may also verify the draft's recorded alternative (draft-model "
                 "trees) beside the token where its chain misses." if trees else "")
              + (" fitted rule = the best fixed rule 'the lookup when its match run >= R (up to Kn tokens), else the "
                 "draft model while its confidence >= theta (up to K)', fitted on the suite's own traces in hindsight "
                 "(overall: each suite its own rule): what a policy deciding from those two signals can reach."
                 if fitted else ""), "",
              "goals (worst over the draft costs): default/oracle overall >= 0.90, every suite >= 0.85, default >= 0.98x "
              "plain in every suite (>= 0.99x on Metal Q4)"]
    for name, g in goals_check(rows).items():
        lines.append(f"  {name:<22} overall/oracle {g['overall_vs_oracle']:.3f}  worst suite/oracle {g['suite_vs_oracle']:.3f}  "
                     f"worst suite x plain {g['suite_vs_plain']:.3f}  {'MET' if g['met'] else 'not met'}")
    return "\n".join(lines)


def load_traces(path: str | Path) -> dict[str, Any]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    if data.get("format") not in (1, 2, 3):
        raise ValueError(f"{path}: unknown traces format {data.get('format')}")
    return data


# --------------------------------------------------------------------------------------------- measure
def parse_sizes(text: str) -> list[int]:
    """"1-64" or "1,2,4,8" or "1-9,12,16"."""
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            out += list(range(int(a), int(b) + 1))
        elif part.strip():
            out.append(int(part))
    return sorted(set(out))


def _at_depths(model: Any, sizes: Sequence[int], rounds: int, depths: Sequence[int]) -> dict[int, dict[int, float]]:
    """{depth: {n: median seconds}}: batches of n decoded after `depth` cached tokens (filler ids), every depth and
    size once per round (interleaved, so that a busy moment hits all alike)."""
    import statistics

    from edgespec.drafting.calibration import _time_sizes

    times: dict[int, dict[int, list[float]]] = {d: {n: [] for n in sizes} for d in depths}
    for _ in range(rounds):
        for d in depths:
            model.reset()
            model.decode([(100 + 7 * i) % model.n_vocab for i in range(d)], 0, ())
            t, _ = _time_sizes(model, sizes, d, 1)
            for n in sizes:
                times[d][n] += t[n]
    model.reset()
    return {d: {n: statistics.median(v) for n, v in t.items()} for d, t in times.items()}


def measure(target: str, draft: str | None, n_gpu_layers: int, sizes: Sequence[int], rounds: int, threads: int | None,
            depths: Sequence[int] = ()) -> dict[str, Any]:
    """A curve file's contents for this machine: the target's verify curve, the draft's per-token cost and its
    small-batch curve, measured with edgespec.drafting.calibration.measure_decode_costs (after a 16-token context, as the
    engine calibrates); with `depths`, also how those costs grow with the context depth (depth_scale)."""
    import time

    from edgespec.llama.backend import Model
    from edgespec.drafting.calibration import measure_decode_costs
    from edgespec.config import ModelSpec

    out: dict[str, Any] = {"name": f"measured {Path(target).name}" + (f" + {Path(draft).name}" if draft else "")}
    n_ctx = max(256, max(sizes) + 64, max(depths, default=0) + max(sizes) + 8)
    t0 = time.perf_counter()
    scale: dict[str, Any] = {}
    with Model(ModelSpec(target, n_gpu_layers=n_gpu_layers, n_ctx=n_ctx, n_threads=threads)) as m:
        measure_decode_costs(m, sizes=(1, 2, 4), rounds=1)  # warm-up (first calls allocate, GPU kernels load)
        verify, steady = measure_decode_costs(m, sizes=sizes, rounds=rounds)
        if depths:
            at = _at_depths(m, sizes, rounds, sorted({16, *depths}))
            scale["verify"] = {str(d): {str(n): round(at[d][n] / at[16][n], 4) for n in sizes} for d in sorted(at)}
    out["verify"] = {str(n): s for n, s in sorted(verify.items())}
    out["steady"] = steady
    if draft:
        with Model(ModelSpec(draft, n_gpu_layers=n_gpu_layers, n_ctx=n_ctx, n_threads=threads)) as d:
            measure_decode_costs(d, sizes=(1, 2), rounds=1)
            dv, dsteady = measure_decode_costs(d, sizes=[n for n in sizes if n <= 17] or [1], rounds=rounds)
            one, _ = measure_decode_costs(d, sizes=(1,), rounds=5)
            if depths:
                at = _at_depths(d, [1], rounds, sorted({16, *depths}))
                scale["draft"] = {str(k): round(at[k][1] / at[16][1], 4) for k in sorted(at)}
        out["draft"] = one[1]
        out["draft_verify"] = {str(n): s for n, s in sorted(dv.items())}
        out["steady"] = steady and dsteady
    else:
        out["draft"] = 0.0
    if scale:
        out["depth_scale"] = scale
    out["n_gpu_layers"] = n_gpu_layers
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


# --------------------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "measure":
        ap = argparse.ArgumentParser(prog="predict_speedup.py measure", description="Write a curve file for a GGUF pair on this machine.")
        ap.add_argument("target")
        ap.add_argument("draft", nargs="?", default=None)
        ap.add_argument("--n-gpu-layers", "-ngl", type=int, default=0)
        ap.add_argument("--sizes", default="1-64", help="verify batch sizes, e.g. 1-64 or 1-9,12,16,17 (default 1-64)")
        ap.add_argument("--rounds", type=int, default=3)
        ap.add_argument("--threads", type=int, default=None)
        ap.add_argument("--depths", default="", help="also measure at these context depths, e.g. 256,640 (depth_scale)")
        ap.add_argument("--out", type=Path, required=True)
        a = ap.parse_args(argv[1:])
        depths = [int(x) for x in a.depths.split(",") if x.strip()]
        res = measure(a.target, a.draft, a.n_gpu_layers, parse_sizes(a.sizes), a.rounds, a.threads, depths)
        atomic_write_text(Path(a.out), json.dumps(res, indent=1) + "\n")
        one = res["verify"]["1"]
        print(f"wrote {a.out}: 1 token {1000 * one:.2f} ms, " + " ".join(
            f"{n}:{s / one:.2f}" for n, s in res["verify"].items() if int(n) in (2, 4, 8, 16, 32, 64)
        ) + (f"; draft {1000 * res['draft']:.2f} ms/token" if res["draft"] else "") + f" ({res['seconds']} s)")
        return 0
    if argv and argv[0] == "predict":
        argv = argv[1:]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="subcommand: predict_speedup.py measure TARGET [DRAFT] --out FILE (see measure --help)")
    ap.add_argument("--curve", action="append", default=[], help="curve file(s) (or bench --json report, or calibration cache)")
    ap.add_argument("--profiles", type=Path, nargs="?", const=DEFAULT_PROFILES, default=None,
                    help="replay every curve file in this folder (default research/data/curves) at every --draft-relative "
                         "and print one table (profile x draft cost x suite) with the issue-23 goals")
    ap.add_argument("--draft-relative", default=None,
                    help="the draft's cost in target tokens, comma-separated (e.g. 0.3,0.45,0.6,0.8): replays each curve at "
                         "each (default: the curve's own; with --profiles 0.3,0.45,0.6,0.8)")
    ap.add_argument("--traces", type=Path, default=None, help=f"a recording (default {DEFAULT_TRACES.name}, greedy)")
    ap.add_argument("--sampled", action="store_true",
                    help=f"replay sampling at T = 1.0 (the bench's settings) from {DEFAULT_SAMPLED.name} (see the module docstring)")
    ap.add_argument("--replay-seed", type=int, default=0, help="--sampled: the replay's draws (prompt i draws from [seed, i])")
    ap.add_argument("--suite", action="append", default=[])
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help=f"drafters to replay, comma-separated, of {', '.join(KINDS + TREE_KINDS)} (default {','.join(KINDS)})")
    ap.add_argument("--draft-max", type=int, default=8)
    ap.add_argument("--draft-siblings", type=int, default=None,
                    help="the most alternatives a draft model's chain may carry a cycle (draft-model trees; default SpecConfig's; "
                         "0 = chains; needs format-2 traces, which record the draft's alternatives)")
    ap.add_argument("--ngram-draft-max", type=int, default=None, help="most tokens an n-gram lookup drafts (default: SpecConfig's)")
    ap.add_argument("--fixed-k", action="store_true", help="always draft --draft-max (no adaptive controller, no gate)")
    ap.add_argument("--overhead", type=float, default=None, help="seconds of per-cycle overhead (overrides the curve file's)")
    ap.add_argument("--host-cost", default=None, metavar="CYCLE_MS,ROW_MS",
                    help="charge the engine's host work: milliseconds per cycle and per logits row (a verified row or a "
                         "drafted token), as bench/host_bench.py --fit measures them; added to every curve and profile")
    ap.add_argument("--python-time", action="store_true",
                    help="also charge the Python work the replay really does (this machine's wall clock) on top of the modelled "
                         "model calls: the engine's own per-cycle and per-token costs outside llama.cpp (results then vary run to run)")
    ap.add_argument("--depth-scale", default=None,
                    help="a curve file whose depth_scale (cost growth with context depth, from `measure --depths`) applies to every --curve")
    ap.add_argument("--fit-run-table", action="store_true",
                    help="also fit, per suite, the best table from an n-gram match's run to its draft length (a bound for run-based rules)")
    ap.add_argument("--fit-rules", action="store_true",
                    help="also fit, per suite, the best fixed confidence / match-run rule for model+ngram (a bound for "
                         "policies that decide from those signals; ~3x slower)")
    ap.add_argument("--streams", type=int, default=None,
                    help="N streams together against one after another (an engine's slots; predict_streams), per curve or profile")
    ap.add_argument("--json", type=Path, default=None, help="write the results (a list, one per curve) here")
    a = ap.parse_args(argv)

    from dataclasses import replace

    from edgespec.config import SpecConfig
    from edgespec.errors import ConfigError

    try:
        spec = SpecConfig(draft_max=a.draft_max, adaptive=not a.fixed_k)
        if a.ngram_draft_max is not None:
            spec = replace(spec, ngram_draft_max=a.ngram_draft_max)
        if a.draft_siblings is not None:
            spec = replace(spec, draft_siblings=a.draft_siblings)
        rels = [float(x) for x in a.draft_relative.split(",") if x.strip()] if a.draft_relative else []
        kinds = tuple(k.strip() for k in a.kinds.split(",") if k.strip())
        unknown = [k for k in kinds if k not in KINDS + TREE_KINDS]
        if unknown or not kinds:
            raise ValueError(f"--kinds: unknown drafter(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(KINDS + TREE_KINDS)}")
        if not a.curve and a.profiles is None:
            raise ValueError("give --curve FILE or --profiles [DIR]")
        data = load_traces(a.traces or (DEFAULT_SAMPLED if a.sampled else DEFAULT_TRACES))
        if a.sampled and data.get("format") != 3:
            raise ValueError(f"--sampled: {a.traces} is not a sampled recording (record_traces.py --sampled)")
        if a.profiles is not None:
            files = sorted(Path(a.profiles).glob("*.json"))
            if not files:
                raise ValueError(f"{a.profiles}: no curve files (*.json)")
            profiles = [(f.stem, load_curve(f)) for f in files]
            for _, c in profiles:
                c.python_time = a.python_time
        costs = [load_curve(path) for path in a.curve]
        for c in costs:
            c.python_time = a.python_time
        scale = load_curve(a.depth_scale) if a.depth_scale else None
        if a.host_cost is not None:
            parts = [float(x) / 1000.0 for x in a.host_cost.split(",")]
            if len(parts) != 2:
                raise ValueError("--host-cost takes CYCLE_MS,ROW_MS")
            costs = [c.with_host(*parts) for c in costs]
            if a.profiles is not None:
                profiles = [(name, c.with_host(*parts)) for name, c in profiles]
    except (OSError, ValueError, KeyError, TypeError, ConfigError) as e:
        print(f"predict_speedup: error: {e}", file=sys.stderr)
        return 2
    if a.streams is not None:
        if a.streams < 1:
            print("predict_speedup: error: --streams must be at least 1", file=sys.stderr)
            return 2
        results = []
        for cost in [c for _, c in profiles] if a.profiles is not None else costs:
            res = predict_streams(data, cost, spec, a.streams, a.suite, kinds=kinds)
            results.append(res)
            print(format_streams(res))
        if a.json:
            atomic_write_text(Path(a.json), json.dumps(results, indent=1) + "\n")
        return 0
    if a.profiles is not None:
        rows = profile_rows(data, profiles, rels or DEFAULT_RELATIVE, spec, a.suite, fit_rules=a.fit_rules, seed=a.replay_seed)
        print(format_profiles(rows))
        if a.json:
            atomic_write_text(Path(a.json), json.dumps({"rows": rows, "goals": goals_check(rows)}, indent=1) + "\n")
        return 0
    if rels:
        costs = [c.with_draft_relative(r) for c in costs for r in rels]
    results = []
    for cost in costs:
        if a.overhead is not None:
            cost.overhead = a.overhead
        if scale is not None:
            cost.depth_scale = scale.depth_scale
            cost.name += f" x depth scale of {Path(a.depth_scale).name}"
        res = predict(data, cost, spec, a.suite, kinds=kinds, fit=a.fit_run_table, fit_rules=a.fit_rules, seed=a.replay_seed)
        results.append(res)
        print(format_table(res, kinds))
        print()
    if a.json:
        atomic_write_text(Path(a.json), json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
