"""llama-server's `samplers` field (a custom sampler chain) mapped onto the engine's one fixed warping.

llama-server builds its sampler from the chain it is sent, in that order, and samples the result at temperature 1
(`dist`); a sampler left out of the chain is not applied whatever its setting. edgespec's warping (sampling.warp)
always runs penalties -> top_k -> temperature -> top_p -> min_p -> infill (the last when SamplingParams.infill is on).
So a chain is mapped this way:

- a sampler absent from the chain has its settings made neutral (top_k 0, top_p 1, min_p 0, temperature 1, no
  penalties), as llama-server leaves it out;
- `dry`, `xtc`, `typ_p` and `top_n_sigma` are no-ops here: their settings are refused unless neutral
  (refused.UNSUPPORTED), where llama-server does nothing with them either;
- `infill` (llama.cpp's FIM sampler: merges tokens sharing a prefix, drops unlikely ones and ends the completion
  where nothing is likely enough; infill.infill_filter) sets SamplingParams.infill: it is applied after every other
  sampler, so it must come after the active ones in the chain, as in the chains of llama.vim and llama.vscode
  (["top_k", "top_p", "infill"]);
- the active samplers must come in an order that gives the engine's distribution: pairs that commute (top_k with
  temperature or min_p; temperature 0, greedy, with top_p and min_p) may come in either order, and min_p before a
  temperature T > 0 is min_p ** (1/T) after it (both keep the tokens with logit >= max logit + ln(min_p), the
  second on logits divided by T); any other order (top_p before top_k, min_p before top_p, top_p before a
  temperature, penalties after another sampler, infill before another) or a non-idempotent sampler listed twice is a
  400 that names it.

The chain is an array of llama.cpp's names (`dry`, `top_k`, `typ_p`, `top_p`, `min_p`, `xtc`, `temperature`,
`infill`, `penalties`, `top_n_sigma`) or a string of their letters (`d k y p m x t i e s`), as llama-server takes it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgespec.config import SamplingParams

NAMES = ("dry", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature", "infill", "penalties", "top_n_sigma")
LETTERS = {"d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "m": "min_p", "x": "xtc", "t": "temperature",
           "i": "infill", "e": "penalties", "s": "top_n_sigma"}
NO_OPS = frozenset({"dry", "xtc", "typ_p", "top_n_sigma"})  # neutral by refused.UNSUPPORTED
ENGINE_ORDER = ("penalties", "top_k", "temperature", "top_p", "min_p", "infill")  # sampling.warp's order
IDEMPOTENT = frozenset({"top_k", "min_p"})  # applying twice is applying once


class ChainError(ValueError):
    """A chain the engine cannot honour exactly (the message names the sampler)."""


def parse_names(v: Any) -> list[str]:
    """The chain as canonical names (ChainError for anything else)."""
    if isinstance(v, str):
        bad = [c for c in v if c not in LETTERS]
        if bad:
            raise ChainError(f"samplers: unknown sampler letter {bad[0]!r} (known: {' '.join(LETTERS)})")
        return [LETTERS[c] for c in v]
    if not isinstance(v, list) or not all(isinstance(n, str) for n in v):
        raise ChainError("samplers must be an array of sampler names or a string of sampler letters")
    for n in v:
        if n not in NAMES:
            raise ChainError(f"samplers: unknown sampler {n!r} (llama.cpp's names: {', '.join(NAMES)})")
    return list(v)


def _active(name: str, s: SamplingParams) -> bool:
    if name == "top_k":
        return s.top_k > 0
    if name == "top_p":
        return s.top_p < 1.0
    if name == "min_p":
        return s.min_p > 0.0
    if name == "temperature":
        return s.temperature != 1.0
    if name == "penalties":
        return s.repeat_penalty != 1.0 or s.presence_penalty != 0.0 or s.frequency_penalty != 0.0
    return name == "infill"


def _commute(a: str, b: str, s: SamplingParams) -> bool:
    pair = {a, b}
    if pair in ({"top_k", "temperature"}, {"top_k", "min_p"}):
        return True
    # greedy keeps the argmax (infill before it can drop the argmax, or end the completion)
    return "temperature" in pair and s.temperature == 0.0 and not pair & {"penalties", "infill"}


def apply_chain(names: list[str], s: SamplingParams) -> SamplingParams:
    """The sampling settings that give this chain's distribution (ChainError for a chain the engine cannot honour)."""
    present = set(names)
    s = replace(
        s,
        infill="infill" in present,
        top_k=s.top_k if "top_k" in present else 0,
        top_p=s.top_p if "top_p" in present else 1.0,
        min_p=s.min_p if "min_p" in present else 0.0,
        temperature=s.temperature if "temperature" in present else 1.0,
    )
    if "penalties" not in present:
        s = replace(s, repeat_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)
    active = [n for n in names if n in ENGINE_ORDER and _active(n, s)]
    seen: set[str] = set()
    for n in active:
        if n in seen and n not in IDEMPOTENT:
            raise ChainError(f"samplers: {n!r} is listed twice; this engine applies each sampler once")
        seen.add(n)
    rank = {n: i for i, n in enumerate(ENGINE_ORDER)}
    if "min_p" in active and "temperature" in active and active.index("min_p") < active.index("temperature") and s.temperature > 0:
        # min_p on the untempered distribution = min_p ** (1/T) on the tempered one (see the module docstring)
        s = replace(s, min_p=s.min_p ** (1.0 / s.temperature))
        active = [n for n in active if n != "min_p"]
        active.insert(active.index("temperature") + 1, "min_p")
        if s.min_p == 0.0:  # below float's range: keeps every token, as the threshold it stands for
            active.remove("min_p")
    for i, a in enumerate(active):
        for b in active[i + 1:]:
            if rank[a] > rank[b] and not _commute(a, b, s):
                raise ChainError(f"samplers: {a!r} before {b!r} cannot be honoured exactly: this engine applies "
                                 f"{', '.join(ENGINE_ORDER)} in that order; reorder the chain or drop one")
    return s


__all__ = ["apply_chain", "parse_names", "ChainError", "NAMES", "LETTERS", "ENGINE_ORDER"]
