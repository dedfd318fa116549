"""Code infill (fill-in-the-middle): the prompt layout as a pure function, FIM tokens read from the GGUF vocabulary,
Engine.infill on a tiny FIM model pair (speculative = plain, greedy), the clear error for a model without FIM
tokens, lookups that draft from the suffix, `edgespec infill`, and one real-pair check."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from edgespec.cli import main
from edgespec.config import ModelSpec, SamplingParams, SpecConfig
from edgespec.runtime.engine import Engine
from edgespec.errors import ConfigError
from edgespec.prompts.infill import ExtraChunk, FimTokens, fim_layout
from edgespec.drafting.ngram import NgramIndex

from support.tiny import FIM_TOKENS, MERGES, SPECIAL_TOKENS

GREEDY = SamplingParams(temperature=0)
FIM = FimTokens(prefix=1, suffix=2, middle=3, pad=4, repo=5, sep=6)
FIM_BASE = 256 + len(MERGES) + len(SPECIAL_TOKENS)  # the tiny FIM vocabulary's first FIM token id


# --------------------------------------------------------------------------------------------- the layout (pure)
def test_layout_prefix_suffix_middle():
    assert fim_layout(FIM, [10, 11], [20]) == [1, 10, 11, 2, 20, 3]
    assert fim_layout(FIM, [10], [20], prompt=[12]) == [1, 10, 12, 2, 20, 3]  # llama.cpp: prompt follows the prefix
    assert fim_layout(FIM, [10], [], bos=99) == [99, 1, 10, 2, 3]


def test_layout_extra_chunks_with_repo_and_file_tokens():
    out = fim_layout(FIM, [10], [20], extra=[([30], [31, 32]), ([40], [41])], repo=[50], current_file=[60])
    assert out == [5, 50, 6, 30, 31, 32, 6, 40, 41, 6, 60, 1, 10, 2, 20, 3]
    no_sep = FimTokens(prefix=1, suffix=2, middle=3)
    assert fim_layout(no_sep, [10], [20], extra=[([30], [31])]) == [30, 31, 1, 10, 2, 20, 3]  # plain text chunks


def test_layout_budget_cuts_extra_then_prefix_start_then_suffix_end():
    pre, suf = list(range(100, 140)), list(range(200, 220))
    extra = [([30], list(range(300, 330)))]
    full = fim_layout(FIM, pre, suf, extra=extra, repo=[50], current_file=[60])
    assert len(full) == 3 + 40 + 20 + 1 + 1 + 1 + 1 + 30 + 1 + 1  # markers + prefix + suffix + header
    # room for prefix and suffix and a little extra: the extra context keeps its end (nearest the cursor)
    out = fim_layout(FIM, pre, suf, extra=extra, repo=[50], current_file=[60], budget=3 + 60 + 5)
    assert len(out) == 68 and out[-63:] == fim_layout(FIM, pre, suf) and out[:5] == [327, 328, 329, 6, 60]
    # no room for extra: prefix keeps its end, suffix its start, the prefix keeps >= 3/4
    out = fim_layout(FIM, pre, suf, extra=extra, budget=3 + 20)
    assert len(out) == 23 and out[0] == 1 and out[-1] == 3
    p, s = out[1:out.index(2)], out[out.index(2) + 1:-1]
    assert p == pre[-len(p):] and s == suf[:len(s)] and len(p) >= 15 and len(p) + len(s) == 20
    # a short prefix leaves the rest to the suffix
    out = fim_layout(FIM, [100, 101], suf, budget=3 + 10)
    assert out == [1, 100, 101, 2, *suf[:8], 3]


def test_layout_refuses_a_vocabulary_without_fim_tokens():
    with pytest.raises(ValueError, match="prefix"):
        fim_layout(FimTokens(None, 2, 3), [1], [2])
    assert FimTokens(None, None, 3).missing == ["prefix", "suffix"]


def test_prompt_lookup_drafts_from_the_suffix():
    """The lookup index covers the whole prompt: once the middle starts repeating the suffix's opening, the rest of
    the suffix line is proposed (what makes infill speculation pay)."""
    suffix = [70, 71, 72, 73, 74, 75, 76]
    ctx = fim_layout(FIM, [10, 11, 12], suffix) + [70, 71, 72]  # the model wrote the suffix's first three tokens
    match = NgramIndex(4, 1).lookup(ctx, 8)
    assert match.tokens[:4] == [73, 74, 75, 76]


# --------------------------------------------------------------------------------------------- the engine (tiny FIM pair)


def test_fim_tokens_come_from_the_vocabulary(fim_engine):
    fim = fim_engine.fim_tokens()
    names = dict(zip(FIM_TOKENS, range(FIM_BASE, FIM_BASE + len(FIM_TOKENS))))
    assert fim == FimTokens(prefix=names["<|fim_prefix|>"], suffix=names["<|fim_suffix|>"], middle=names["<|fim_middle|>"],
                            pad=names["<|fim_pad|>"], repo=names["<|repo_name|>"], sep=names["<|file_sep|>"])
    assert fim_engine.target.token_bytes(fim.middle, special=True) == b"<|fim_middle|>"


def test_infill_tokens_layout_and_text_stays_text(fim_engine):
    fim = fim_engine.fim_tokens()
    toks = fim_engine.infill_tokens("def f(", "):\n", extra=[("util.py", "x = 1\n")])
    tok = fim_engine.target.tokenize
    assert toks == fim_layout(fim, tok("def f(", parse_special=False), tok("):\n", parse_special=False),
                              extra=[(tok("util.py\n", parse_special=False), tok("x = 1\n", parse_special=False))],
                              repo=tok("myproject\n", parse_special=False), current_file=tok("filename\n", parse_special=False))
    # control-token text inside the code stays characters
    assert fim_engine.infill_tokens("a <|fim_middle|> b", "").count(fim.middle) == 1  # the layout's own, at the end
    assert fim_engine.infill_tokens("a", "b", extra=[ExtraChunk("t", "n")]) == fim_engine.infill_tokens("a", "b", extra=[{"filename": "n", "text": "t"}])


def test_infill_speculative_equals_plain_greedy(fim_engine):
    for prefix, suffix in (("abc", "gh"), ("hello wor", " and more text after"), ("", "only a suffix")):
        spec = fim_engine.infill(prefix, suffix, sampling=GREEDY, max_tokens=24)
        plain = fim_engine.infill(prefix, suffix, sampling=GREEDY, max_tokens=24, speculative=False)
        assert spec.token_ids == plain.token_ids and spec.text == plain.text
        same = fim_engine.generate(tokens=fim_engine.infill_tokens(prefix, suffix), sampling=GREEDY, max_tokens=24, speculative=False)
        assert same.token_ids == plain.token_ids
    assert spec.stats.n_drafted > 0  # speculation ran


def test_infill_argument_errors(fim_engine):
    with pytest.raises(ConfigError, match="prefix must be a string"):
        fim_engine.infill(3, "x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"extra\[0\]"):
        fim_engine.infill("a", "b", extra=[42])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="unknown keys"):
        fim_engine.infill("a", "b", extra=[{"txt": "x"}])


def test_model_without_fim_tokens_is_a_clear_error(tiny):
    with Engine.load(ModelSpec(str(tiny["target"]), n_ctx=256, n_threads=1), calibrate_costs=False) as eng:
        assert eng.fim_tokens().missing == ["prefix", "suffix", "middle"]
        with pytest.raises(ConfigError, match=r"tiny-target.gguf cannot fill in the middle: its vocabulary has no FIM prefix/suffix/middle token"):
            eng.infill("a", "b")


def test_long_code_is_cut_to_fit_the_context(fim_engine):
    toks = fim_engine.infill_tokens("x" * 5000, "y" * 5000, reserve=100)
    assert len(toks) <= fim_engine.target.n_ctx - 100
    r = fim_engine.infill("x" * 5000, "y" * 5000, sampling=GREEDY, max_tokens=4)
    assert r.stats.n_prompt <= fim_engine.target.n_ctx


# --------------------------------------------------------------------------------------------- CLI
def test_cli_infill(fim_pair, tmp_path):
    src = tmp_path / "code.py"
    src.write_text("def add(a, b):\n    return <CURSOR>\n")
    other = tmp_path / "other.py"
    other.write_text("x = a + b\n")
    base = ["infill", "--target", str(fim_pair["target"]), "--no-draft", "--temperature", "0", "-n", "6", "--ctx", "512"]
    r = CliRunner().invoke(main, [*base, str(src), "--extra", str(other), "--json"])
    assert r.exit_code == 0, r.output
    import json

    got = json.loads(r.stdout.strip().splitlines()[0])
    assert got["finish_reason"] in ("length", "eos") and len(got["token_ids"]) <= 6
    r2 = CliRunner().invoke(main, [*base, "--prefix", "def add(a, b):\n    return ", "--suffix", "\n", "--extra", str(other), "--json"])
    assert r2.exit_code == 0 and json.loads(r2.stdout.strip().splitlines()[0])["token_ids"] == got["token_ids"]
    nomark = tmp_path / "nomark.py"
    nomark.write_text("no marker here\n")
    r3 = CliRunner().invoke(main, [*base, str(nomark)])
    assert r3.exit_code == 2 and "exactly once" in r3.output


def test_cli_infill_model_without_fim(tiny, tmp_path):
    r = CliRunner().invoke(main, ["infill", "--target", str(tiny["target"]), "--no-draft", "--prefix", "a", "--suffix", "b", "--ctx", "256"])
    assert r.exit_code == 1 and "cannot fill in the middle" in r.output and "Traceback" not in r.output


# --------------------------------------------------------------------------------------------- the real pair
@pytest.mark.real
@pytest.mark.slow
def test_real_pair_infill(real_pair):
    """Qwen2.5-Coder's FIM tokens read from its GGUF; speculative infill = plain (greedy); the obvious middle; the same
    answer through POST /infill. No cost measurements (fixed K needs none; they take minutes on a busy CPU)."""
    import httpx

    from edgespec.server import create_app
    from support.server_thread import ServerThread

    target, draft = real_pair
    spec = SpecConfig(draft_max=4, adaptive=False)
    with Engine.load(ModelSpec(str(target), n_ctx=1024), ModelSpec(str(draft), n_ctx=1024), spec=spec, calibrate_costs=False) as eng:
        fim = eng.fim_tokens()
        assert not fim.missing and fim.repo is not None and fim.sep is not None
        assert eng.target.token_bytes(fim.middle, special=True) == b"<|fim_middle|>"
        prefix = "def fibonacci(n):\n    if n < 2:\n        return n\n    return "
        suffix = "\n\n\nprint(fibonacci(10))\n"
        spec_r = eng.infill(prefix, suffix, sampling=GREEDY, max_tokens=20)
        plain = eng.infill(prefix, suffix, sampling=GREEDY, max_tokens=20, speculative=False)
        assert spec_r.token_ids == plain.token_ids
        assert spec_r.text.replace(" ", "").startswith("fibonacci(n-1)+fibonacci(n-2)"), spec_r.text
        assert spec_r.stats.n_accepted > 0
        s = ServerThread(create_app(eng))
        try:
            j = httpx.post(s.url + "/infill", json={"input_prefix": prefix, "input_suffix": suffix, "n_predict": 20, "temperature": 0},
                           timeout=300).json()
            assert j["content"] == spec_r.text
        finally:
            s.stop()
