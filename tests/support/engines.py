"""Engines the tests build on tiny models: `make_engine` (the tiny pair as backend Models with a flat calibration:
test_engine, test_request) and `load` (Engine.load on model files, uncalibrated: the servers' tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import edgespec.llama.backend as backend
from edgespec.config import ModelSpec, SamplingParams, SpecConfig
from edgespec.drafting.calibration import Calibration
from edgespec.runtime.engine import Engine

GREEDY = SamplingParams(temperature=0)
FLAT_CALIBRATION = Calibration({1: 1e-3, 16: 1.05e-3}, 2e-4, "fixed")  # a GPU-like curve: drafting pays, decisions are stable
FIXED = SpecConfig(draft_max=4, adaptive=False)  # every cycle drafts 4: a cancellation is seen within 5 tokens
PROMPTS = ["abc d", "hhh gg", "the cat", "a b c d e f", "ggggg", "ba ba ba", "fe dc ba", "hello"]
N_CTX = 16384  # load's context


def make_engine(tiny, *, n_ctx=512, n_batch=64, drafter="auto", spec=FIXED, draft="draft", **kw) -> Engine:
    """An Engine over the tiny set's target and `draft` (None: the target alone), each with a prompt cache."""
    t = backend.Model(ModelSpec(tiny["target"], n_ctx=n_ctx, n_batch=n_batch, n_threads=1), prompt_cache_bytes=32 << 20)
    d = backend.Model(ModelSpec(tiny[draft], n_ctx=n_ctx, n_batch=n_batch, n_threads=1), prompt_cache_bytes=32 << 20) if draft else None
    return Engine(t, d, drafter=drafter, spec=spec, calibration=FLAT_CALIBRATION, **kw)


def load(path: Path, draft: Path | None = None, *, n_ctx: int = N_CTX, **kw: Any) -> Engine:
    """Engine.load on `path` (and `draft`): n_ctx tokens, one thread, FIXED unless `spec` is given, no calibration."""
    d = ModelSpec(str(draft), n_ctx=n_ctx, n_threads=1) if draft is not None else None
    kw.setdefault("spec", FIXED)
    return Engine.load(ModelSpec(str(path), n_ctx=n_ctx, n_threads=1), d, calibrate_costs=False, **kw)
