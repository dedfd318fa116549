"""The tools that compare edgespec's speed with llama.cpp's (edgespec/bench/; bench/llamacpp_compare.py and
bench/plain_speed.py are their command lines): the parsing of the C++ tools' summaries (llamacpp) and the paired
ratios (llamacpp_compare), on hand-made runs, and plain_speed.py --paired's layers (bare_loop), which decode the same
tokens, on a tiny model. The comparisons themselves need the built tools and the real pair and take
minutes: they are benchmarks, run by hand, see docs/benchmarks.md."""

from __future__ import annotations

import pytest

from edgespec.bench import llamacpp_compare as lc
from edgespec.bench.llamacpp import parse_tool_output

# the end of llama-lookup's output (llama.cpp vendored in llama-cpp-python 0.3.36, log timestamps on)
LOOKUP_TAIL = """
0.02.150.732 I encoded   95 tokens in    0.412 seconds, speed:  230.600 t/s
0.02.150.755 I decoded  129 tokens in    4.870 seconds, speed:   26.489 t/s
0.02.150.820 I
0.02.150.838 I n_draft      = 8
0.02.150.857 I n_predict    = 129
0.02.150.875 I n_drafted    = 56
0.02.150.893 I t_draft_flat = 0.01 ms
0.02.150.912 I t_draft      = 0.16 ms, 2.86 us per token, 350000.00 tokens per second
0.02.150.930 I n_accept     = 31
0.02.150.948 I accept       = 55.357%
"""


def test_the_tools_summary_is_parsed():
    out = parse_tool_output(LOOKUP_TAIL)
    assert out == {"tokens": 129, "seconds": 4.87, "prompt_tokens": 95, "prompt_seconds": 0.412,
                   "n_predict": 129, "n_drafted": 56, "n_accept": 31}
    with pytest.raises(ValueError):
        parse_tool_output("main: error: failed to load model")


def run(prompt: int, pass_: int, tokens: int, seconds: float, **kw) -> dict:
    return {"prompt": prompt, "pass": pass_, "tokens": tokens, "seconds": seconds, **kw}


def test_ratios_are_paired_by_prompt_and_pass():
    # a slow pass (pass 1) slows both methods: the paired ratios stay 1.25 where unpaired rates would not
    a = [run(0, 0, 100, 4.0), run(0, 1, 100, 8.0), run(1, 0, 50, 2.0)]
    b = [run(0, 0, 100, 5.0), run(0, 1, 100, 10.0), run(1, 0, 50, 2.5), run(1, 1, 50, 2.5)]
    assert lc.paired_ratios(a, b) == pytest.approx([1.25, 1.25, 1.25])  # (1, 1) has no partner in a
    # a failed run drops its pair instead of counting as zero
    a_err = a + [{"prompt": 1, "pass": 1, "error": "exit 1"}]
    assert len(lc.paired_ratios(a_err, b)) == 3
    assert lc.paired_ratios([], b) == []


def test_summary_gives_the_median_and_the_range():
    assert lc.summarize([]) == "-"
    assert lc.summarize([1.1]) == "1.10"
    assert lc.summarize([0.9, 1.3, 1.0]) == "1.00 (0.90-1.30, 3)"
    assert lc.summarize([0.9, 1.0, 1.2, 1.3]) == "1.10 (0.90-1.30, 4)"


def test_best_speculative_tool_is_chosen_per_prompt_and_pass():
    runs = {
        "llama spec-simple": [run(0, 0, 100, 10.0), run(1, 0, 100, 2.0)],
        "llama lookup": [run(0, 0, 100, 5.0), run(1, 0, 100, 4.0), {"prompt": 2, "pass": 0, "error": "timed out"}],
    }
    best = lc.best_of(runs, ("llama spec-simple", "llama lookup"))
    assert sorted((r["prompt"], r["seconds"]) for r in best) == [(0, 5.0), (1, 2.0)]


def test_paired_steps_decode_the_same_tokens_in_every_layer(tiny):
    """bench/plain_speed.py --paired (edgespec.bench.bare_loop): the bare loop, the backend Model and a Model with tree sequences, stepped in
    turn, decode the same greedy continuation (so their per-token times compare like with like)."""
    import numpy as np

    from edgespec.bench import bare_loop as plain_speed
    from edgespec.llama.backend import Model
    from edgespec.config import ModelSpec

    path = str(tiny["target"])
    steppers = {
        "bare": plain_speed.BareStepper(path, 256, 1),
        "model": Model(ModelSpec(path, n_ctx=256, n_threads=1)),
        "model+trees": Model(ModelSpec(path, n_ctx=256, n_threads=1), tree_paths=4),
    }
    tokens: dict[str, list[int]] = {name: [] for name in steppers}

    class Recording:
        def __init__(self, name, inner):
            self.name, self.inner = name, inner

        @property
        def n_past(self):
            return self.inner.n_past

        def reset(self):
            self.inner.reset()

        def decode(self, toks, pos):
            out = self.inner.decode(toks, pos)
            tokens[self.name].append(int(np.argmax(out[-1])))
            return out

    try:
        times = plain_speed.paired_steps({name: Recording(name, m) for name, m in steppers.items()}, [5, 9, 13, 2, 7], 12)
    finally:
        for m in steppers.values():
            m.close()
    assert {name: len(ts) for name, ts in times.items()} == {name: 12 for name in steppers}
    assert all(t > 0 for ts in times.values() for t in ts)
    assert tokens["bare"] == tokens["model"] == tokens["model+trees"] and len(tokens["bare"]) == 13
