"""Run statistics: one record per generation, carried by the result itself; aggregates are sums of records.

`GenerationStats` is filled by the speculation loop and the engine: token counts, cycles, drafted and accepted
tokens (by draft position and by source), the time split, time to first token, how the prompt was served (KV
reuse), the costs the controller planned with and its decisions. `Totals` adds records up (a chat session, a
benchmark side). `summary_line` is the one-line summary the CLI prints for either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Timings:
    """Seconds spent, split by where. `queue` is time waiting for the engine and `waited` time the generation stood
    aside while other generations ran beside it (neither is part of wall). `llama` is the time inside llama_decode
    (both models, prefill included) and `host` the rest of wall: the engine's own work (sampling, acceptance,
    drafting bookkeeping, detokenization, scheduling). With several generations in slots, `llama` counts every decode
    made while this one ran, its neighbours' included."""

    queue: float = 0.0
    waited: float = 0.0
    prefill: float = 0.0
    draft: float = 0.0
    target: float = 0.0
    overhead: float = 0.0
    llama: float = 0.0
    host: float = 0.0

    def add(self, other: "Timings") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_dict(self) -> dict[str, float]:
        return {name: round(getattr(self, name), 4) for name in self.__dataclass_fields__}


class _Ratios:
    """μ, acceptance and rates for anything with the counters below (a record or a sum of records)."""

    n_generated: int
    n_cycles: int
    n_spec_cycles: int
    n_drafted: int
    n_accepted: int

    @property
    def mu(self) -> float:
        """Mean drafted tokens accepted per speculative cycle."""
        return self.n_accepted / self.n_spec_cycles if self.n_spec_cycles else 0.0

    @property
    def acceptance(self) -> float:
        """Share of drafted tokens the target kept."""
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def tokens_per_cycle(self) -> float:
        return self.n_generated / self.n_cycles if self.n_cycles else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Decode rate: generated tokens / seconds after prefill."""
        seconds = self._decode_seconds()
        return self.n_generated / seconds if self.n_generated and seconds > 0 else 0.0

    def _decode_seconds(self) -> float:
        raise NotImplementedError


def _add_positions(acc: list[int], more: list[int]) -> None:
    if len(acc) < len(more):
        acc.extend([0] * (len(more) - len(acc)))
    for i, v in enumerate(more):
        acc[i] += v


def acceptance_by_position(accepted: list[int], drafted: list[int]) -> list[float | None]:
    """Acceptance at each draft position (a position drafted but never accepted is 0.0, not left out)."""
    return [round((accepted[i] if i < len(accepted) else 0) / d, 4) if d else None for i, d in enumerate(drafted)]


@dataclass
class GenerationStats(_Ratios):
    n_prompt: int = 0
    n_cached: int = 0  # prompt tokens served from the KV cache (not decoded again)
    n_prefill: int = 0  # prompt tokens decoded for this generation
    n_generated: int = 0  # tokens the caller got (after a stop string cut the text, only those before it)
    n_cycles: int = 0
    n_spec_cycles: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    drafted_by_pos: list[int] = field(default_factory=list)
    accepted_by_pos: list[int] = field(default_factory=list)
    source_counts: dict[str, int] = field(default_factory=dict)  # cycles by drafting source ("plain", "model", ...)
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    expected_match_accepted: float = 0.0  # what "match" verification would have accepted on the same drafts
    expected_exact_accepted: float = 0.0  # what this rule accepts in expectation on the same drafts
    timings: Timings = field(default_factory=Timings)
    wall: float = 0.0  # seconds from the start of processing (after the queue) to the end
    ttft: float = 0.0  # seconds from the start of processing to the first generated token
    stop_reason: str = ""  # "eos", "length", "stop", "context", "cancelled", "error"
    costs: dict[str, Any] = field(default_factory=dict)  # what the controller planned with at the start
    controller: dict[str, Any] = field(default_factory=dict)  # its decisions and estimates at the end
    threads: dict[str, Any] = field(default_factory=dict)  # per model: how its CPU thread count was chosen, and used

    @property
    def decode_seconds(self) -> float:
        """Generation time after prefill."""
        return max(self.wall - self.timings.prefill, 1e-9)

    def _decode_seconds(self) -> float:
        return self.decode_seconds

    @property
    def host_ms_per_token(self) -> float:
        """Milliseconds of host work (wall less the time inside llama_decode) per generated token."""
        return 1000.0 * self.timings.host / self.n_generated if self.n_generated else 0.0

    def record_cycle(self, n_drafted: int, n_accepted: int, n_emitted: int, source: str, t_draft: float, t_target: float) -> None:
        self.n_cycles += 1
        self.n_generated += n_emitted
        self.source_counts[source] = self.source_counts.get(source, 0) + 1
        if n_drafted:
            self.n_spec_cycles += 1
            self.n_drafted += n_drafted
            self.n_accepted += n_accepted
            self.accepted_by_source[source] = self.accepted_by_source.get(source, 0) + n_accepted
            _add_positions(self.drafted_by_pos, [1] * n_drafted)
            _add_positions(self.accepted_by_pos, [1] * n_accepted)
        self.timings.draft += t_draft
        self.timings.target += t_target

    def finish(self, wall: float) -> None:
        self.wall = wall
        t = self.timings
        t.overhead = max(0.0, wall - t.prefill - t.draft - t.target)

    def as_dict(self) -> dict[str, Any]:
        return {
            "n_prompt": self.n_prompt,
            "n_cached": self.n_cached,
            "n_prefill": self.n_prefill,
            "n_generated": self.n_generated,
            "n_cycles": self.n_cycles,
            "n_spec_cycles": self.n_spec_cycles,
            "n_drafted": self.n_drafted,
            "n_accepted": self.n_accepted,
            "mu": round(self.mu, 4),
            "acceptance": round(self.acceptance, 4),
            "acceptance_by_pos": acceptance_by_position(self.accepted_by_pos, self.drafted_by_pos),
            "drafted_by_pos": list(self.drafted_by_pos),
            "accepted_by_pos": list(self.accepted_by_pos),
            "sources": dict(self.source_counts),
            "accepted_by_source": dict(self.accepted_by_source),
            "expected_match_accepted": round(self.expected_match_accepted, 3),
            "expected_exact_accepted": round(self.expected_exact_accepted, 3),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "host_ms_per_token": round(self.host_ms_per_token, 4),
            "ttft": round(self.ttft, 4),
            "seconds": {**self.timings.as_dict(), "wall": round(self.wall, 4), "decode": round(self.decode_seconds, 4)},
            "stop_reason": self.stop_reason,
            "costs": self.costs,
            "controller": self.controller,
            "threads": self.threads,
        }


@dataclass
class Totals(_Ratios):
    """A sum of GenerationStats (a chat session, one side of a benchmark)."""

    runs: int = 0
    interrupted: int = 0
    n_prompt: int = 0
    n_cached: int = 0
    n_prefill: int = 0
    n_generated: int = 0
    n_cycles: int = 0
    n_spec_cycles: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    drafted_by_pos: list[int] = field(default_factory=list)
    accepted_by_pos: list[int] = field(default_factory=list)
    source_counts: dict[str, int] = field(default_factory=dict)
    decode_seconds: float = 0.0
    wall: float = 0.0
    timings: Timings = field(default_factory=Timings)

    def _decode_seconds(self) -> float:
        return self.decode_seconds

    @property
    def host_ms_per_token(self) -> float:
        """Milliseconds of host work (wall less the time inside llama_decode) per generated token."""
        return 1000.0 * self.timings.host / self.n_generated if self.n_generated else 0.0

    def add(self, s: GenerationStats) -> None:
        self.runs += 1
        self.interrupted += int(s.stop_reason == "cancelled")
        for name in ("n_prompt", "n_cached", "n_prefill", "n_generated", "n_cycles", "n_spec_cycles", "n_drafted", "n_accepted"):
            setattr(self, name, getattr(self, name) + getattr(s, name))
        _add_positions(self.drafted_by_pos, s.drafted_by_pos)
        _add_positions(self.accepted_by_pos, s.accepted_by_pos)
        for k, v in s.source_counts.items():
            self.source_counts[k] = self.source_counts.get(k, 0) + v
        if s.n_generated:
            self.decode_seconds += s.decode_seconds
        self.wall += s.wall
        self.timings.add(s.timings)

    def as_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "interrupted": self.interrupted,
            "n_prompt": self.n_prompt,
            "n_cached": self.n_cached,
            "n_prefill": self.n_prefill,
            "n_generated": self.n_generated,
            "n_cycles": self.n_cycles,
            "n_spec_cycles": self.n_spec_cycles,
            "n_drafted": self.n_drafted,
            "n_accepted": self.n_accepted,
            "mu": round(self.mu, 4),
            "acceptance": round(self.acceptance, 4),
            "acceptance_by_pos": acceptance_by_position(self.accepted_by_pos, self.drafted_by_pos),
            "drafted_by_pos": list(self.drafted_by_pos),
            "sources": dict(self.source_counts),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "host_ms_per_token": round(self.host_ms_per_token, 4),
            "decode_seconds": round(self.decode_seconds, 4),
            "seconds": {**self.timings.as_dict(), "wall": round(self.wall, 4)},
        }


def summary_line(s: GenerationStats | Totals) -> str:
    """One line: tokens, tok/s, μ and acceptance when anything was drafted, the time split, the prompt (decoded /
    from cache) and, for one generation, why it stopped; for totals, how many runs."""
    t = s.timings
    parts = []
    if isinstance(s, Totals):
        parts.append(f"{s.runs} run{'s' if s.runs != 1 else ''}")
    parts += [f"{s.n_generated} tokens", f"{s.tokens_per_second:.1f} tok/s"]
    if s.n_drafted:
        parts.append(f"μ {s.mu:.2f}")
        parts.append(f"accepted {100 * s.acceptance:.0f}%")
    parts.append(f"draft {t.draft:.2f}s / target {t.target:.2f}s / overhead {t.overhead:.2f}s")
    if t.llama or t.host:
        parts.append(f"host {s.host_ms_per_token:.2f} ms/token")
    prompt = f"prompt {s.n_prompt} tok ({s.n_prefill} decoded in {t.prefill:.2f}s"
    parts.append(prompt + (f", {s.n_cached} cached)" if s.n_cached else ")"))
    if isinstance(s, GenerationStats):
        if s.stop_reason:
            parts.append(f"stop: {s.stop_reason}")
    elif s.interrupted:
        parts.append(f"{s.interrupted} interrupted")
    return " · ".join(parts)


__all__ = ["Timings", "GenerationStats", "Totals", "summary_line", "acceptance_by_position"]
