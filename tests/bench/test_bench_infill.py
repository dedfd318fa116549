"""The infill benchmark's prompt builder (edgespec/bench/infill_suite.py; bench/bench_infill.py is its command line),
pure, no model: spans blanked out of a real installed package's functions, the same prompts every run, prefix +
middle + suffix contiguous in the source file."""

from __future__ import annotations

import importlib
from pathlib import Path

from edgespec.bench.infill_suite import GROUPS, build_prompts, summarize


def test_prompts_are_real_code_with_a_span_blanked_out():
    prompts = build_prompts("click", 3, 1200, 500, seed=0)
    assert [p.group for p in prompts].count("line") == 3 and {p.group for p in prompts} == set(GROUPS) and len(prompts) == 9
    root = Path(importlib.import_module("click").__file__ or "").parent.parent
    for p in prompts:
        src = (root / p.source.rsplit(":", 1)[0]).read_text(encoding="utf-8")
        assert p.middle.strip() and p.prefix + p.middle + p.suffix in src
        assert len(p.prefix) <= 1200 and len(p.suffix) <= 500
        if p.group == "line":
            assert p.middle.count("\n") == 1
    assert build_prompts("click", 3, 1200, 500, seed=0) == prompts  # fixed seed: the same suite every run


def test_summary_ratios():
    rows = [
        {"group": "line", "n_generated": 10, "plain_s": 2.0, "spec_n": 10, "spec_s": 1.0, "ratio": 2.0, "prefill_s": 1.0,
         "draft_prefill_s": 1.0, "exact": True, "exact_spec": True, "same": True},
        {"group": "tail", "n_generated": 10, "plain_s": 1.0, "spec_n": 10, "spec_s": 1.0, "ratio": 1.0, "prefill_s": 1.0,
         "draft_prefill_s": 0.0, "exact": False, "exact_spec": False, "same": True},
    ]
    s = {x["group"]: x for x in summarize(rows)}
    assert s["line"]["ratio"] == 2.0 and s["line"]["cold_ratio"] == 1.0  # (1 + 2) / (1 + 1 + 1)
    assert s["all"]["ratio"] == 20 / 2.0 / (20 / 3.0) and s["all"]["min_ratio"] == 1.0 and s["all"]["exact_plain"] == 0.5
    assert "block" not in s
