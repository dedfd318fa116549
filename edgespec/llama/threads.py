"""How many CPU threads llama.cpp should use for the next decode: a pure decision on measured decode times.

llama.cpp's CPU threads meet at a barrier after every operation of the graph. When another process holds one of
the cores, a thread count equal to the core count makes every barrier wait for a thread that is not running: on a
2-core machine with one busy process, 2 threads decode at a third of their quiet speed while 1 thread keeps two
thirds of it. Which count is faster depends on what else the machine is doing *now*, so it is learnt from the
decodes the engine does anyway, never from a separate measurement.

`ThreadTuner` keeps, for each candidate count, an exponential moving average of the time of small decodes (token
generation and verification, batches of fewer than LARGE_FROM tokens) normalised by the batch's work (`work(n)`).
It uses the count with the lowest estimate and now and then *probes* another count with a single decode:

* a candidate whose estimate is older than `probe_after` seconds is probed (the interval doubles after each probe
  that does not change the choice, up to `max_probe_after`, or up to `max_probe_after_all` while the count in use is
  the first candidate, all the cores: a load that arrives then slows the count in use and the rule below probes at
  once, so the timer is only a safety net there; a change of choice resets it);
* a candidate whose estimate was taken while the current count ran at another speed (the current estimate moved by
  more than `shift` since) is stale at once: the machine's load changed, so the comparison is made again. This is
  what follows a load change within a few decodes.

One probe decode at a slower count costs about one decode time more: every few seconds while a reduced count is in
use (about 1-3% of the throughput), every half minute or so on a quiet machine (four streams on 2 cores probed 4-5
of ~130 decodes, ~3% of the aggregate, before the longer interval).
Prompt processing (large batches) runs with the current count and is never probed: a probe there would cost seconds.
The class has no clock and no model: the caller passes `now` and the measured seconds (tests use fake timings).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

LARGE_FROM = 32  # batches of this many tokens or more (prompt chunks) neither probe nor teach


def work(n_tokens: int) -> float:
    """A small batch's relative cost, to compare decodes of different sizes: they are memory-bound, so their cost
    grows slower than their size (the square root is within ~20% of the measured CPU curves up to 16 tokens)."""
    return math.sqrt(max(1, int(n_tokens)))


def candidate_counts(n_cores: int) -> tuple[int, ...]:
    """The thread counts worth comparing on a machine with n_cores usable cores, best guess first: all of them, one
    fewer (one core taken by another process), half of them (a busy machine), and one on small machines."""
    n = max(1, int(n_cores))
    out: list[int] = []
    for c in (n, n - 1, n // 2, 1 if n <= 4 else 0):
        if c >= 1 and c not in out:
            out.append(c)
    return tuple(out)


@dataclass
class _Estimate:
    value: float  # EMA of seconds / work(n)
    when: float  # when it was last observed
    ref: float  # the current count's estimate at that moment (to tell when the load changed since)


class ThreadTuner:
    """Chooses a thread count per decode among `candidates` (see the module docstring).

    Protocol: `t = choose(n_tokens, now)`; run the decode with t threads; `observe(t, n_tokens, seconds, now)`.
    """

    def __init__(
        self,
        candidates: Sequence[int],
        *,
        alpha: float = 0.25,
        probe_after: float = 1.0,
        max_probe_after: float = 4.0,
        max_probe_after_all: float = 32.0,
        shift: float = 1.3,
        min_gain: float = 1.1,
    ) -> None:
        cands = [int(c) for c in candidates]
        if not cands or any(c < 1 for c in cands) or len(set(cands)) != len(cands):
            raise ValueError(f"candidates must be distinct thread counts >= 1, got {list(candidates)}")
        if (not (0.0 < alpha <= 1.0) or probe_after <= 0 or max_probe_after < probe_after
                or max_probe_after_all < max_probe_after or shift <= 1.0 or min_gain < 1.0):
            raise ValueError("need 0 < alpha <= 1, 0 < probe_after <= max_probe_after <= max_probe_after_all, shift > 1, "
                             "min_gain >= 1")
        self.candidates = tuple(cands)
        self.alpha = alpha
        self.base_probe_after = probe_after
        self.max_probe_after = max_probe_after
        self.max_probe_after_all = max_probe_after_all
        self.shift = shift
        self.min_gain = min_gain
        self.current = cands[0]
        self.probe_after = probe_after
        self._est: dict[int, _Estimate] = {}
        self._probing: int | None = None
        self.decodes: dict[int, int] = {c: 0 for c in cands}  # decodes run with each count
        self.probes = 0
        self.switches = 0

    def choose(self, n_tokens: int, now: float) -> int:
        """The thread count for a decode of n_tokens tokens starting at `now`."""
        self._probing = None
        if len(self.candidates) == 1 or n_tokens >= LARGE_FROM:
            return self.current
        cur = self._est.get(self.current)
        if cur is None:
            return self.current
        for c in self.candidates:
            if c == self.current:
                continue
            e = self._est.get(c)
            if e is None:  # never measured: once the current count has a figure to compare with
                return self._probe(c)
            moved = cur.value / e.ref
            if now - e.when >= self.probe_after or moved > self.shift or moved < 1.0 / self.shift:
                return self._probe(c)
        return self.current

    def _probe(self, c: int) -> int:
        self._probing = c
        self.probes += 1
        return c

    def observe(self, threads: int, n_tokens: int, seconds: float, now: float) -> None:
        """Fold in one decode of n_tokens tokens with `threads` threads that took `seconds`."""
        probed, self._probing = self._probing == threads, None
        if threads not in self.decodes or not (0.0 < seconds < math.inf) or n_tokens < 1:
            return
        self.decodes[threads] += 1
        if n_tokens >= LARGE_FROM:
            return
        x = seconds / work(n_tokens)
        e = self._est.get(threads)
        cur = self._est.get(self.current)
        if threads != self.current:
            # a probe replaces the old figure, which was stale (or there was none)
            self._est[threads] = _Estimate(x, now, cur.value if cur is not None else x)
        elif e is None:
            self._est[threads] = _Estimate(x, now, x)
        else:
            # the count in use: an EMA (one slow decode moves it little, a lasting change within a few decodes)
            e.value = (1.0 - self.alpha) * e.value + self.alpha * min(x, 2.0 * e.value)
            e.when, e.ref = now, e.value
        self._decide(probed)

    def _decide(self, probed: bool) -> None:
        cur = self._est.get(self.current)
        if cur is None:
            return
        best, best_v = self.current, cur.value
        for c, e in self._est.items():
            if c != self.current and e.value * self.min_gain < best_v:
                best, best_v = c, e.value
        if best != self.current:
            old, self.current = self.current, best
            self.switches += 1
            self.probe_after = self.base_probe_after
            old_v = self._est[old].value
            for c, e in self._est.items():  # other figures: judged against the new count's speed from now on
                if c != best:
                    e.ref = best_v if c == old else best_v * e.ref / old_v
        elif probed:
            cap = self.max_probe_after_all if self.current == self.candidates[0] else self.max_probe_after
            self.probe_after = min(2.0 * self.probe_after, cap)

    def describe(self) -> dict[str, Any]:
        """For stats and reports: the candidates, the count in use and how often each ran."""
        return {
            "mode": "auto",
            "candidates": list(self.candidates),
            "current": self.current,
            "decodes": {str(c): n for c, n in self.decodes.items()},
            "probes": self.probes,
            "switches": self.switches,
        }


__all__ = ["ThreadTuner", "candidate_counts", "work", "LARGE_FROM"]
