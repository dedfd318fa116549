"""Frozen settings shared by every layer: which model to load, how to sample, how to speculate.

Validation happens here, once, so the library and the CLI refuse bad values with the same message.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


from .errors import ConfigError, EdgespecError


@dataclass(frozen=True)
class ModelSpec:
    """How to load one GGUF model.

    n_gpu_layers: layers offloaded to the GPU (-1 = all, 0 = CPU only). Ignored by CPU-only builds.
    n_threads: CPU threads for single-token decode (None = all physical cores llama.cpp sees).
    n_ctx: context window in tokens (prompt + output).
    n_batch: largest number of tokens per llama_decode call (prefill is split into chunks of this size).
    """

    path: str
    n_gpu_layers: int = 0
    n_threads: int | None = None
    n_ctx: int = 4096
    n_batch: int = 512

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", os.fspath(self.path))
        if self.n_ctx < 8:
            raise ConfigError(f"n_ctx must be at least 8, got {self.n_ctx}")
        if self.n_batch < 1:
            raise ConfigError(f"n_batch must be positive, got {self.n_batch}")
        if self.n_threads is not None and self.n_threads < 1:
            raise ConfigError(f"n_threads must be positive, got {self.n_threads}")
        if self.n_gpu_layers < -1:
            raise ConfigError(f"n_gpu_layers must be -1 (all) or >= 0, got {self.n_gpu_layers}")


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. The same settings define the target distribution p on the plain path and
    in speculative verification, so both sample from the same distribution.

    temperature: 0 = greedy (argmax; ties go to the lowest token id).
    top_k: keep the k most likely tokens (0 = off).
    top_p: keep the smallest set of most likely tokens whose mass reaches top_p (1.0 = off).
    min_p: drop tokens whose probability is below min_p times the most likely token's (0 = off).
    repeat_penalty: llama.cpp-style: logits of tokens in the last `repeat_last_n` tokens are divided by it when
        positive, multiplied when negative (1.0 = off).
    presence_penalty / frequency_penalty: OpenAI-style, subtracted from the logits of tokens seen in the window
        (once / per occurrence) (0 = off).
    seed: None = a fresh random seed each generation.
    """

    temperature: float = 0.8
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_last_n: int = 64
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (0.0 <= self.temperature < float("inf")):
            raise ConfigError(f"temperature must be a finite number >= 0, got {self.temperature}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not (-float("inf") < v < float("inf")):
                raise ConfigError(f"{name} must be a finite number, got {v}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0, got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if not (0.0 <= self.min_p < 1.0):
            raise ConfigError(f"min_p must be in [0, 1), got {self.min_p}")
        if not (self.repeat_penalty > 0.0):
            raise ConfigError(f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        if self.repeat_last_n < 0:
            raise ConfigError(f"repeat_last_n must be >= 0, got {self.repeat_last_n}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def uses_history(self) -> bool:
        """True when the distribution depends on earlier tokens (a penalty is on)."""
        return self.repeat_last_n > 0 and (
            self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        )


@dataclass(frozen=True)
class SpecConfig:
    """How to speculate.

    draft_max: the most tokens drafted per cycle (the controller may draft fewer, or none).
    draft_min: the fewest tokens drafted when speculating at all.
    adaptive: let the controller pick the draft length each cycle from measured costs and acceptance;
        False = always draft `draft_max` (the classic fixed-K loop).
    draft_temperature: None = the draft samples with the same settings as the target; otherwise its own
        temperature (other settings shared). Exactness never depends on this: q is always reported.
    ngram_n_max, ngram_n_min: the longest and shortest context suffix the n-gram drafter looks up.
    ngram_draft_max: the most tokens an n-gram proposal drafts (adaptive mode; a lookup is free, so it may
        draft longer than the model drafter when the text is being copied).
    """

    draft_max: int = 8
    draft_min: int = 1
    adaptive: bool = True
    draft_temperature: float | None = None
    ngram_n_max: int = 4
    ngram_n_min: int = 2
    ngram_draft_max: int = 16

    def __post_init__(self) -> None:
        if self.draft_max < 0 or self.draft_max > 64:
            raise ConfigError(f"draft_max must be in [0, 64], got {self.draft_max}")
        if self.ngram_draft_max < 1 or self.ngram_draft_max > 64:
            raise ConfigError(f"ngram_draft_max must be in [1, 64], got {self.ngram_draft_max}")
        if self.draft_min < 1 or (self.draft_max and self.draft_min > self.draft_max):
            raise ConfigError(f"draft_min must be in [1, draft_max], got {self.draft_min}")
        if self.draft_temperature is not None and self.draft_temperature < 0:
            raise ConfigError(f"draft_temperature must be >= 0, got {self.draft_temperature}")


class DraftRatios:
    """μ and acceptance for any stats record with n_accepted, n_drafted and n_spec_cycles counters (one
    generation's GenerationStats, a chat session's ChatTotals)."""

    @property
    def mu(self) -> float:
        """Mean drafted tokens accepted per speculative cycle."""
        return self.n_accepted / self.n_spec_cycles if self.n_spec_cycles else 0.0  # type: ignore[attr-defined]

    @property
    def acceptance(self) -> float:
        """Share of drafted tokens the target kept."""
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0  # type: ignore[attr-defined]


@dataclass
class Timings:
    """Seconds spent, split by where."""

    draft: float = 0.0
    target: float = 0.0
    overhead: float = 0.0
    prefill: float = 0.0

    def add(self, other: "Timings") -> None:
        self.draft += other.draft
        self.target += other.target
        self.overhead += other.overhead
        self.prefill += other.prefill


__all__ = ["EdgespecError", "ConfigError", "ModelSpec", "SamplingParams", "SpecConfig", "DraftRatios", "Timings"]
