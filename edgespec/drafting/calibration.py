"""Measured costs: how long the target takes to verify n tokens in one batch, and the draft to make one token.

The controller plans with these numbers, so a wrong measurement makes speculation slower than plain decoding.
Three things keep one busy moment from deciding for good:

* A measurement runs in rounds (every size once per round) and takes the median per size; it is *steady* when the
  single-token time agrees across rounds within STEADY_SPREAD. An unsteady one is used for this session but never
  cached.
* A cached curve is checked at every load: three single-token decodes must agree with it within CHECK_FACTOR, or
  the curve is measured again.
* During generation the curve learns from the decodes the engine does anyway (costs.VerifyCurve rescales itself on
  a level shift); nothing is measured inside a request.

The cache (`calibration.json` in the user cache dir) is advisory: an entry that is malformed, implausible or whose
model file is gone is ignored and the file rewritten; entries expire after MAX_AGE_DAYS and at most MAX_ENTRIES
are kept. Writes are atomic.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import statistics
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from edgespec.fsutil import atomic_write_text, clear_odd_file, loads_json, read_json_file
from edgespec.paths import cache_dir

SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17)
ROUNDS = 3
MAX_ROUNDS = 5
STEADY_SPREAD = 1.3  # max/min of the per-round single-token times
CHECK_FACTOR = 1.5  # a cached curve whose single-token time is further off than this is measured again
MAX_SECONDS = 60.0  # no decode of a handful of tokens takes a minute: such a number is damage, not a machine
MAX_ENTRIES = 64
MAX_AGE_DAYS = 30
FORMAT = 2


@dataclass
class Calibration:
    """verify: {n: seconds}; draft: seconds per draft token (0 without a draft); source: "cache", "measured",
    "measured-unsteady" (not cached), "remeasured" (the cached one failed its check) or "fixed" (given by the caller: an engine plans with it as it is,
    never refining or re-measuring it)."""

    verify: dict[int, float]
    draft: float
    source: str
    steady: bool = True

    def describe(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "steady": self.steady,
            "verify": {int(n): round(s, 6) for n, s in sorted(self.verify.items())},
            "draft": round(self.draft, 6),
        }


# --------------------------------------------------------------------------------------------- measuring
def short_context(model: Any, n_extra: int) -> list[int]:
    """A short context to measure after (BOS + fillers), shorter when the context window is small."""
    n = max(1, min(16, model.n_ctx - n_extra))
    head = [model.bos] if 0 <= model.bos < model.n_vocab else [0]
    return (head + [min(100 + i, model.n_vocab - 1) for i in range(n - 1)])[:n]


def _fits(model: Any, sizes: Sequence[int], start: int) -> list[int]:
    return [n for n in sizes if start + n <= model.n_ctx and n <= model.n_batch]


def time_sizes(model: Any, sizes: Sequence[int], start: int, rounds: int) -> dict[int, list[float]]:
    """Seconds of a decode of each size, once per round, at position `start` (the cache holds `start` tokens and is
    left so)."""
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for r in range(rounds):
        for n in sizes:
            toks = [(7 * j + 11 + r) % model.n_vocab for j in range(n)]
            t0 = time.perf_counter()
            model.decode(toks, start, range(n))
            times[n].append(time.perf_counter() - t0)
            model.truncate(start)
    return times


def _steady(times: dict[int, list[float]]) -> bool:
    ones = times.get(1) or next(iter(times.values()))
    return len(ones) < 2 or max(ones) <= STEADY_SPREAD * min(ones)


def measure_decode_costs(model: Any, sizes: Sequence[int] = SIZES, rounds: int = ROUNDS) -> tuple[dict[int, float], bool]:
    """({n: median seconds of one batched decode of n tokens after a short context}, steady). Sizes that do not
    fit the context are skipped. Leaves the cache empty."""
    model.reset()
    base = short_context(model, max(sizes))
    model.decode(base, 0, ())
    sizes = _fits(model, sizes, len(base)) or [1]
    times = time_sizes(model, sizes, len(base), rounds)
    steady = _steady(times)
    extra = rounds
    while not steady and extra < MAX_ROUNDS:  # a busy moment: more rounds, medians over all of them
        more = time_sizes(model, sizes, len(base), 1)
        for n in sizes:
            times[n] += more[n]
        extra += 1
        steady = _steady({n: v[-3:] for n, v in times.items()})
    model.reset()
    return {n: statistics.median(v) for n, v in times.items()}, steady


def quick_check(model: Any, repeats: int = 3) -> float:
    """The median single-token decode time now (after a short context); the cache is left empty."""
    model.reset()
    base = short_context(model, 1)
    model.decode(base, 0, ())
    times = time_sizes(model, [1], len(base), repeats)
    model.reset()
    return statistics.median(times[1])


def agrees(measured: float, expected: float, factor: float = CHECK_FACTOR) -> bool:
    return expected > 0 and 1.0 / factor <= measured / expected <= factor


# --------------------------------------------------------------------------------------------- the cache
def cache_path() -> Path:
    return cache_dir() / "calibration.json"


def _build_id() -> str:
    """What llama.cpp was built with: a different build of the same version may decode at another speed."""
    try:
        import llama_cpp as C

        info = C.llama_print_system_info()
        raw = (getattr(C, "__version__", "?") + "|" + (info.decode() if isinstance(info, bytes) else str(info))).encode()
    except Exception:  # pragma: no cover - a pure import without llama.cpp
        raw = b"?"
    return hashlib.sha256(raw).hexdigest()[:16]


def model_key(model: Any) -> list[Any]:
    st = os.stat(model.spec.path)
    # the thread count the curve is measured at (backend: the one the tuner prefers now; tests may pass fakes)
    threads = getattr(model, "threads_now", model.n_threads)
    key = [os.path.abspath(model.spec.path), st.st_size, st.st_mtime_ns, threads, model.spec.n_gpu_layers, model.n_batch]
    rpc = getattr(model.spec, "rpc", ())
    split = getattr(model.spec, "tensor_split", ())
    # layers on RPC servers, or split otherwise, cost otherwise (a local run's key is unchanged); so do deterministic
    # mode's kernels (no repacked weights, no tiled product: docs/determinism.md)
    det = getattr(model.spec, "deterministic", False) is True
    return key + ([list(rpc)] if rpc else []) + ([["split", *split]] if split else []) + ([["deterministic"]] if det else [])


def entry_key(target: Any, draft: Any | None) -> str:
    return json.dumps([model_key(target), model_key(draft) if draft is not None else None, list(SIZES), _build_id()])


def valid_entry(entry: Any) -> Calibration | None:
    """The calibration in a cache entry, or None when anything about it is wrong or implausible."""
    try:
        raw = entry["verify"]
        verify = {int(n): float(s) for n, s in raw.items()}
        draft = float(entry["draft"])
        when = float(entry["when"])
    except (TypeError, KeyError, ValueError, AttributeError):
        return None
    if not verify or 1 not in verify or not math.isfinite(when):
        return None
    if not (0.0 <= draft <= MAX_SECONDS):
        return None
    one = verify[1]
    for n, s in verify.items():
        if n < 1 or not (0.0 < s <= MAX_SECONDS):
            return None
        # n tokens in one batch cost at least half of one token and at most 3n single tokens
        if not (0.5 * one <= s <= 3.0 * n * one):
            return None
    return Calibration(verify, draft, "cache")


MAX_TABLE_BYTES = 16 * 1024 * 1024  # MAX_ENTRIES entries take a few kB; more is not this cache


def _read_table(path: Path) -> dict[str, Any]:
    """The cache's entries; {} (with one warning, as it is then measured again and rewritten) when the file is not
    a regular file (a FIFO is never waited on), is too large, or is not the cache's strict JSON (NaN, a 5,000-digit
    number, 100,000-deep nesting)."""
    try:
        data = read_json_file(path, MAX_TABLE_BYTES)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):  # no cache yet (or no folder for one): nothing to say
            return {}
        return _dropped(path, e.strerror or str(e))
    except ValueError as e:
        return _dropped(path, f"not valid JSON ({' '.join(str(e).split())[:120]})")
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        return {}  # another format (an older edgespec's): replaced quietly
    return data["entries"]


def _dropped(path: Path, why: str) -> dict[str, Any]:
    warnings.warn(f"edgespec: ignoring the calibration cache {path}: {why}; costs are measured again", RuntimeWarning, stacklevel=3)
    return {}


def _prune(entries: dict[str, Any], now: float) -> dict[str, Any]:
    keep: list[tuple[float, str, Any]] = []
    for key, entry in entries.items():
        cal = valid_entry(entry)
        if cal is None or now - float(entry["when"]) > MAX_AGE_DAYS * 86400:
            continue
        try:
            target_path = loads_json(key)[0][0]
            if not isinstance(target_path, str):
                continue
        except (ValueError, TypeError, IndexError, KeyError):
            continue
        if not os.path.exists(target_path):
            continue
        try:
            used = float(entry.get("used", entry["when"]))
        except (TypeError, ValueError):
            continue
        if not math.isfinite(used):
            continue
        keep.append((used, key, entry))
    keep.sort(reverse=True)
    return {key: entry for _, key, entry in keep[:MAX_ENTRIES]}


def load_cached(key: str) -> Calibration | None:
    return valid_entry(_read_table(cache_path()).get(key))


def store(key: str, cal: Calibration) -> None:
    """Write (or refresh) one entry; pruning the rest. Failures to write are ignored: the cache is advisory."""
    path = cache_path()
    now = time.time()
    entries = _prune(_read_table(path), now)
    entries[key] = {"verify": {str(n): s for n, s in sorted(cal.verify.items())}, "draft": cal.draft, "when": now, "used": now}
    entries = _prune(entries, now)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        clear_odd_file(path)  # a FIFO or an empty folder where the cache belongs: rebuilt
        atomic_write_text(path, json.dumps({"format": FORMAT, "entries": entries}, indent=1))
    except OSError:
        pass


def calibrate(target: Any, draft: Any | None, *, use_cache: bool = True) -> Calibration:
    """The verify curve and draft cost for this pair on this machine: the cached entry when it passes its quick
    check, else a fresh measurement (cached when steady)."""
    key = entry_key(target, draft)
    source = "measured"
    if use_cache:
        cal = load_cached(key)
        if cal is not None:
            if agrees(quick_check(target), cal.verify[1]):
                return cal
            source = "remeasured"
    verify, steady = measure_decode_costs(target)
    c_draft = 0.0
    if draft is not None:
        one, _ = measure_decode_costs(draft, sizes=(1,), rounds=5)
        c_draft = one[1]
    # an implausible curve (a hiccup that even the median kept) counts as unsteady: used now, never cached
    steady = steady and valid_entry({"verify": verify, "draft": c_draft, "when": time.time()}) is not None
    cal = Calibration(verify, c_draft, source if steady else "measured-unsteady", steady)
    if use_cache and steady:
        store(key, cal)
    return cal


__all__ = [
    "SIZES",
    "Calibration",
    "measure_decode_costs",
    "quick_check",
    "agrees",
    "cache_path",
    "entry_key",
    "valid_entry",
    "load_cached",
    "store",
    "calibrate",
]
