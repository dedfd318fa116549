"""The live-rate check every adaptive speculator runs under (`RateGuard`, through guard.GuardedSpeculator): what the
cycles really deliver against plain decoding. Pure: timings are passed in, nothing reads a clock, nothing touches a
model.
"""

from __future__ import annotations

import math


class RateGuard:
    """Is speculation delivering on this machine now? A check on what the cycles really achieve, beside the plans.

    Every drafting policy (model_policy.py, lookup_policy.py) plans from the cost model: a curve measured or learnt on
    this machine and estimates of acceptance. What a cycle really costs can differ from what the curve says in ways the curve never learns: a batched
    decode that another process slows more than a single-token one, the thread count that suits one and not the other,
    Python work per cycle, a draft catching up. The guard measures the outcome instead: tokens per second of the
    speculative cycles (those that verified a draft) against tokens per second of the plain ones, over the same decodes
    the generation does anyway (`observe`: tokens emitted and the cycle's whole period, from one observe to the next).
    Where the speculative rate falls below (1 - margin) of the plain rate, the generation decodes plainly (`allow`
    False) for `hold` tokens, then speculates again (a re-probe, judged afresh); each probe that loses again doubles
    the hold, up to max_hold, and one that wins resets it. Whatever the curve says, speculation that loses here is off.
    A run is judged after min_tokens speculative tokens, or once it has taken as long as min_tokens plain tokens would
    (a re-probe of speculation that loses badly costs no more than that). A re-probe's first cycle is not judged:
    it pays the draft's catch-up on the tokens of the hold, which steady speculation does not.

    Both rates are decayed sums (per token emitted: the last few dozen tokens weigh most), so they follow a load that
    changes. Plain evidence comes from the cycles the policies decode plainly anyway; where there is none (a lookup
    drafting every cycle of a copied text) the guard takes a short plain sample (`sample` tokens) once a run can be
    judged, and again every `sample_every` speculative tokens without plain evidence (doubling up to max_sample_every
    while speculation wins by the margin, back to the start when it does not). No sample is taken where speculation
    delivers clear_win times the plain rate the cost model expects (observe's plain_hint): there it cannot be losing.

    With a frozen cost model (seeded runs) the caller passes the model's cycle times instead of the clock's
    (GuardedSpeculator does), so the same seed makes the same decisions. Pure: no clock, no model.
    """

    def __init__(
        self, *, margin: float = 0.03, min_tokens: int = 16, sample: int = 6, hold: int = 32, max_hold: int = 512,
        sample_every: int = 96, max_sample_every: int = 1536, decay: float = 0.98, plain_decay: float = 0.995,
        clear_win: float = 1.5,
    ) -> None:
        if not (0.0 <= margin < 1.0) or min_tokens < 1 or sample < 1 or hold < 1 or max_hold < hold:
            raise ValueError("need 0 <= margin < 1, min_tokens >= 1, sample >= 1, 1 <= hold <= max_hold")
        if sample_every < 1 or max_sample_every < sample_every or not (0.0 < decay <= 1.0) or not (0.0 < plain_decay <= 1.0):
            raise ValueError("need 1 <= sample_every <= max_sample_every and decays in (0, 1]")
        if clear_win < 1.0:
            raise ValueError(f"clear_win must be >= 1, got {clear_win}")
        self.margin, self.min_tokens, self.sample = margin, min_tokens, sample
        self.base_hold, self.max_hold = hold, max_hold
        self.base_sample_every, self.max_sample_every = sample_every, max_sample_every
        self.decay, self.plain_decay = decay, plain_decay
        self.clear_win = clear_win
        self._spec = [0.0, 0.0]  # decayed (tokens, seconds) of speculative cycles since the last (re)start
        self._plain = [0.0, 0.0]  # the same for plain cycles
        self._hold = 0  # plain tokens still to decode before speculating again
        self._sampling = False  # the hold is a plain sample (not a verdict)
        self._hold_next = hold
        self._sample_every = sample_every
        self._since_sample = 0  # speculative tokens since plain evidence was last refreshed
        self._fresh_plain = 0  # plain tokens seen since then
        self._skip = False  # the next speculative cycle opens a re-probe: not judged (see observe)
        # Statistics.
        self.verdicts = 0  # times speculation was found losing and switched off
        self.samples = 0
        self.held_tokens = 0  # plain tokens decoded because of the guard

    def allow(self) -> bool:
        """May the coming cycle speculate?"""
        return self._hold <= 0

    @property
    def speculative_rate(self) -> float | None:
        return self._spec[0] / self._spec[1] if self._spec[1] > 0 else None

    @property
    def plain_rate(self) -> float | None:
        return self._plain[0] / self._plain[1] if self._plain[1] > 0 else None

    def observe(self, speculative: bool, n_tokens: int, seconds: float, plain_hint: float | None = None) -> None:
        """One cycle: it verified a draft (speculative) or not, emitted n_tokens, and took `seconds` in all.
        plain_hint: the plain rate the cost model expects (1 / T(0)), which spares a plain sample where speculation
        already delivers clear_win times more."""
        if n_tokens < 1 or not (0.0 < seconds < math.inf):
            return
        if speculative and self._skip:
            # the first speculative cycle after a hold pays the draft's catch-up on every token of the hold (up to
            # max_hold): counted, a long hold would make its own re-probe look losing and double itself
            self._skip = False
            return
        held = self._hold > 0
        ds, dp = self.decay**n_tokens, self.plain_decay**n_tokens
        self._spec = [self._spec[0] * ds, self._spec[1] * ds]
        self._plain = [self._plain[0] * dp, self._plain[1] * dp]
        bucket = self._spec if speculative else self._plain
        bucket[0] += n_tokens
        bucket[1] += seconds
        if not speculative:
            self._fresh_plain += n_tokens
            if self._fresh_plain >= self.sample:  # the plain evidence is fresh again
                self._since_sample, self._fresh_plain = 0, 0
            if held:
                self.held_tokens += n_tokens
                self._hold -= n_tokens
                if self._hold <= 0:
                    self._end_hold()
            return
        self._since_sample += n_tokens
        # judged after min_tokens speculative tokens, or as long as min_tokens plain tokens take (a probe of a
        # speculation that loses badly costs no more than that)
        rp = self.plain_rate
        if held or (self._spec[0] < self.min_tokens and (rp is None or self._spec[1] * rp < self.min_tokens)):
            return
        if self._plain[1] <= 0 or self._since_sample >= self._sample_every:
            rs = self.speculative_rate
            if plain_hint is None or rs is None or rs < self.clear_win * plain_hint:
                self._start_hold(self.sample, sampling=True)
                return
            self._since_sample = 0  # far above what plain decoding could do here: no sample needed
        if self._losing():
            self._verdict()

    def _losing(self) -> bool:
        rs, rp = self.speculative_rate, self.plain_rate
        return rs is not None and rp is not None and rs < (1.0 - self.margin) * rp

    def _start_hold(self, n: int, *, sampling: bool) -> None:
        self._hold, self._sampling = n, sampling
        if sampling:
            self.samples += 1
        self._since_sample, self._fresh_plain = 0, 0

    def _verdict(self) -> None:
        self.verdicts += 1
        self._start_hold(self._hold_next, sampling=False)
        self._hold_next = min(2 * self._hold_next, self.max_hold)
        self._sample_every = self.base_sample_every

    def _end_hold(self) -> None:
        self._hold = 0
        if self._sampling:  # fresh plain evidence: judge the run that was sampled
            rs, rp = self.speculative_rate, self.plain_rate
            if self._losing():
                self._verdict()
                return
            if rs is not None and rp is not None and rs >= (1.0 + self.margin) * rp:
                self._hold_next = self.base_hold  # speculation wins here: the next verdict starts short
                self._sample_every = min(2 * self._sample_every, self.max_sample_every)
            else:
                self._sample_every = self.base_sample_every
        else:  # a re-probe: the speculative run that follows is judged on its own cycles, from its second one
            self._spec = [0.0, 0.0]
            self._skip = True
        self._since_sample = 0

    def stats(self) -> dict:
        rs, rp = self.speculative_rate, self.plain_rate
        return {
            "speculative_rate": None if rs is None else round(rs, 3),
            "plain_rate": None if rp is None else round(rp, 3),
            "verdicts": self.verdicts,
            "samples": self.samples,
            "held_tokens": self.held_tokens,
            "holding": self._hold,
        }


__all__ = ["RateGuard"]
