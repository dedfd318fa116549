"""The exact law of a real (tiny) llama.cpp model's first tokens, enumerated from the target alone: what the
chi-square smoke tests through llama.cpp compare with (test_speculate, test_slots, test_draft_trees)."""

from __future__ import annotations

import numpy as np

from edgespec.config import SamplingParams
from edgespec.decoding.sampling import warp
from edgespec.llama.backend import Model

PROMPT = [ord(c) for c in "abc d"]  # the smoke tests' prompt (a tiny model's byte-level tokens)


def exact_distribution(target: Model, ctx: list[int], sp: SamplingParams, n: int) -> dict[tuple[int, ...], float]:
    """P(x1..xn | ctx) enumerated from the target alone (plain path's warp), pruning branches below 1e-12."""
    out: dict[tuple[int, ...], float] = {}

    def rec(prefix: list[int], mass: float) -> None:
        full = ctx + prefix
        p = warp(target.sync(full)[0], sp, full)
        for x in np.flatnonzero(p > 0):
            m = mass * float(p[x])
            if m < 1e-12:
                continue
            if len(prefix) + 1 == n or target.is_eog(int(x)):
                out[tuple(prefix + [int(x)])] = out.get(tuple(prefix + [int(x)]), 0.0) + m
            else:
                rec(prefix + [int(x)], m)

    rec([], 1.0)
    return out
