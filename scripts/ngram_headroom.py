#!/usr/bin/env python3
"""How much can n-gram (prompt-lookup) drafting gain on this machine, and how close does the policy come?

    .venv/bin/python scripts/ngram_headroom.py [--suite input-grounded ...] [--max-tokens 96] [--traces FILE]

1. Greedy plain generations of the bench prompts with the target (or a saved --traces file from an earlier run).
2. The target's verify-cost curve: the calibration edgespec measured at load (cached per machine).
3. A replay of every generation at temperature 0, where acceptance is deterministic (a drafted token is kept iff it
   equals the target's greedy token), so each policy's cycles and their cost can be computed without the model:
   - `policy`: edgespec's n-gram drafter and NgramPolicy, exactly as the engine runs them (fresh per prompt);
   - `oracle`: knows in advance how many of the lookup's tokens will be accepted and drafts the count that
     maximises tokens per second for that cycle. No policy that drafts from the same lookups can do better by
     more than a rounding (it is a per-cycle greedy optimum).
Speedup = plain decode time (n tokens x verify(1)) / replayed time, per suite (total time over the suite's prompts).
This is a model of the cost, not a timing: it isolates the policy from machine noise, which on a shared 2-core VM
moves single bench runs by +-10% per prompt.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edgespec.bench import load_suites
from edgespec.config import ModelSpec, SamplingParams, SpecConfig
from edgespec.controller import CostModel, NgramPolicy
from edgespec.drafters.ngram import NgramDrafter
from edgespec.drafters.policy import LookupSpeculator
from edgespec.engine import Engine
from edgespec.models import resolve_model


def collect(suites: list[str], max_tokens: int) -> tuple[list[dict], dict[int, float]]:
    eng = Engine.load(ModelSpec(str(resolve_model(None, "target")), n_ctx=4096), None, drafter="none")
    try:
        traces = []
        for suite, prompts in load_suites().items():
            if suites and suite not in suites:
                continue
            for i, p in enumerate(prompts):
                ctx = eng.prompt_tokens(p.get("prompt"), messages=p.get("messages"))
                r = eng.generate(tokens=ctx, sampling=SamplingParams(temperature=0), max_tokens=max_tokens, speculative=False)
                traces.append({"suite": suite, "index": i, "prompt": ctx, "output": r.token_ids})
                print(f"  {suite}-{i + 1}: {len(r.token_ids)} tokens", file=sys.stderr)
        return traces, dict(eng.verify_costs)
    finally:
        eng.close()


def replay(prompt: list[int], out: list[int], cost_of, plan) -> float:
    """Seconds to produce `out` when `plan(ctx, remaining) -> (draft tokens, callback)` chooses each cycle."""
    ctx, j, t = list(prompt), 0, 0.0
    while j < len(out):
        draft, done = plan(ctx, len(out) - j - 1, out[j:])
        n = 0
        while n < len(draft) and draft[n] == out[j + n]:
            n += 1
        seconds = cost_of(len(draft) + 1)
        done(len(draft), n, seconds)
        ctx += out[j : j + n + 1]
        j += n + 1
        t += seconds
    return t


def policy_plan(spec: SpecConfig, verify: dict[int, float]):
    lookup = LookupSpeculator(NgramDrafter(spec.ngram_n_max, spec.ngram_n_min),
                              NgramPolicy(spec, CostModel(verify, frozen=True)))

    def plan(ctx, cap, _future):
        k = min(lookup.next_k(), cap)
        d = lookup.propose(ctx, k).tokens if k > 0 else []
        return d, lambda nd, na, s: lookup.observe(nd, na, 0.0, s)

    return plan


def oracle_plan(spec: SpecConfig, cost_of):
    ng = NgramDrafter(spec.ngram_n_max, spec.ngram_n_min)

    def plan(ctx, cap, future):
        d = ng.lookup(ctx, min(spec.ngram_draft_max, cap)).tokens
        r = 0
        while r < len(d) and d[r] == future[r]:
            r += 1
        k = max(range(r + 1), key=lambda k: (k + 1) / cost_of(k + 1))
        return d[:k], lambda nd, na, s: None

    return plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", action="append", default=[], help="bench suite(s); default: all")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--traces", type=Path, default=None, help="JSON file: read traces from it if it exists, else write them")
    a = ap.parse_args()
    if a.traces and a.traces.exists():
        saved = json.loads(a.traces.read_text())
        traces, verify = saved["traces"], {int(n): s for n, s in saved["verify"].items()}
        traces = [t for t in traces if not a.suite or t["suite"] in a.suite]
    else:
        traces, verify = collect(a.suite, a.max_tokens)
        if a.traces:
            a.traces.write_text(json.dumps({"traces": traces, "verify": verify}))
    cm = CostModel(verify, frozen=True)
    one = cm.verify(1)
    print("verify cost, x one token: " + "  ".join(f"{n}: {s / one:.2f}" for n, s in sorted(cm.points.items())))
    spec = SpecConfig()
    print(f"{'suite':18} {'prompts':>7} {'policy':>7} {'oracle':>7}")
    for suite in dict.fromkeys(t["suite"] for t in traces):
        ts = [t for t in traces if t["suite"] == suite]
        n_tok = sum(len(t["output"]) for t in ts)
        plain = n_tok * one
        pol = sum(replay(t["prompt"], t["output"], cm.verify, policy_plan(spec, verify)) for t in ts)
        orc = sum(replay(t["prompt"], t["output"], cm.verify, oracle_plan(spec, cm.verify)) for t in ts)
        print(f"{suite:18} {len(ts):>7} {plain / pol:>6.2f}x {plain / orc:>6.2f}x")


if __name__ == "__main__":
    main()
