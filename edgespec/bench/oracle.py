"""The bounds the speedup replay's policies are measured against (speedup.py), on the same curve (curves.py) and the
same recorded proposals (traces.py).

The oracle (`oracle_seconds`): knowing how many tokens each proposal would get accepted (the recorded continuation's
and the lookup's match with the trace: `model_proposals`, `ngram_proposals`), the fewest modelled seconds to produce
each trace, by dynamic programming over positions (per cycle: plain, or any k up to the number that will be
accepted, from the model or the lookup). No policy that drafts from the same proposals can beat it (it ignores the
draft's catch-up cost, so it is a bound, slightly optimistic for the model drafter). The tree oracle also lets a
cycle verify the draft's recorded alternative beside the token where its chain misses (`model_sibling_hits`).

The sampled oracle (`expected_oracle_seconds`): the best expected rate of a policy that knows every position's
acceptance probability (the draft's recorded rate; the lookup's p of its proposed token along the recorded
trajectory) but not the draws, by dynamic programming over positions with acceptances independent.

Fitted rules: the best fixed rule of a family on the traces themselves, in hindsight (optimistic bounds for such
rules): a table from the lookup's match run to its draft length (`fitted_run_table`), and "the lookup when its match
run >= R (up to Kn tokens), else the draft model while its confidence >= theta (up to K)" (`fitted_rule`,
`rule_seconds`).

Pure Python: no model, no llama.cpp.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from .curves import Curve, cycle_decode_seconds, draft_call_seconds
from .traces import continuation, continuation_with_alternatives


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
