"""Settings llama.cpp aborts on together, API arguments of the wrong type or range, prompts too large to tokenize,
and CLI options that override each other (issue 20, items 1, 6 and 8)."""

from __future__ import annotations

import math

import pytest
from click.testing import CliRunner

from edgespec.cli import main
from edgespec.config import ModelSpec, SpecConfig, check_tree_fits
from edgespec.runtime.engine import Engine
from edgespec.errors import ConfigError, ContextFullError
from edgespec.runtime.handle import check_timeout

from support.shared import run_child


# --------------------------------------------------------------------------------------------- item 1: tree limits
@pytest.mark.parametrize("n_batch,n_ctx,nodes,ok", [
    (8, 4096, 8, False), (9, 4096, 8, True), (512, 8, 8, False), (512, 9, 8, True), (32, 4096, 64, False), (65, 65, 64, True),
    (1, 4096, 1, False), (2, 16, 1, True),
])
def test_check_tree_fits(n_batch, n_ctx, nodes, ok):
    spec = ModelSpec("x.gguf", n_batch=n_batch, n_ctx=n_ctx)
    if ok:
        check_tree_fits(spec, nodes)
    else:
        with pytest.raises(ConfigError, match=f"at least {nodes + 1}") as e:
            check_tree_fits(spec, nodes)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("load", [
    "Engine.load(ModelSpec(T, n_batch=8, n_threads=1), drafter='suffix', memory=False, calibrate_costs=False)",
    "Engine.load(ModelSpec(T, n_ctx=8, n_threads=1), drafter='suffix', memory=False, calibrate_costs=False)",
    "Engine.load(ModelSpec(T, n_batch=16, n_threads=1), D, drafter='model+suffix', spec=SpecConfig(tree_nodes=20), memory=False, "
    "calibrate_costs=False)",
    "Model(ModelSpec(T, n_batch=4, n_threads=1), tree_paths=8)",
])
def test_a_batch_smaller_than_the_tree_is_a_config_error_not_a_signal(tiny, load):
    """llama.cpp aborts the process (SIGABRT, n_outputs_max) on these: run them in a child process."""
    p = run_child(f"""
        from edgespec import Engine, ModelSpec, SpecConfig
        from edgespec.llama.backend import Model
        from edgespec.errors import ConfigError
        T, D = {str(tiny["target"])!r}, {str(tiny["draft"])!r}
        try:
            {load}
        except ConfigError as e:
            print("REFUSED", e)
    """)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    assert p.stdout.startswith("REFUSED") and "n_batch and n_ctx must be at least" in p.stdout, p.stdout


@pytest.mark.parametrize("n_batch,paths", [(512, 5), (5, 4), (4, 3), (3, 2), (2, 0)])
def test_draft_model_trees_fit_the_batch_instead_of_refusing_it(tiny, n_batch, paths):
    """The draft-model kinds load the target with draft_siblings + 1 tree sequences, or as many as its batch holds
    (llama.cpp aborts on a batch smaller than the sequence count): a small batch means fewer siblings, never an error.
    In a child process in case llama.cpp aborts."""
    p = run_child(f"""
        from edgespec import Engine, ModelSpec, SamplingParams
        e = Engine.load(ModelSpec({str(tiny["target"])!r}, n_batch={n_batch}, n_ctx=256, n_threads=1),
                        ModelSpec({str(tiny["target"])!r}, n_batch={n_batch}, n_ctx=256, n_threads=1), drafter="model",
                        calibrate_costs=False)
        r = e.generate("abc d", max_tokens=24, sampling=SamplingParams(temperature=1.0))
        print("PATHS", e.target.tree_paths, len(r.token_ids))
        e.close()
    """)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    got, n = map(int, p.stdout.split()[1:3])
    assert got == paths and n == 24, p.stdout


def test_the_smallest_batch_that_fits_verifies_trees(tiny):
    """At the boundary (n_batch = tree_nodes + 1) trees are verified, in a child process in case llama.cpp aborts."""
    p = run_child(f"""
        from edgespec import Engine, ModelSpec, SamplingParams
        e = Engine.load(ModelSpec({str(tiny["target"])!r}, n_batch=9, n_ctx=256, n_threads=1), drafter="suffix", memory=False,
                        calibrate_costs=False)
        e.remember("abcabcabcabc abcabcabc " * 30)
        r = e.generate("abcabcabc abc", max_tokens=60, sampling=SamplingParams(temperature=0))
        e.close()
        print("DRAFTED", r.stats.n_drafted, len(r.token_ids))
    """)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    drafted, n = map(int, p.stdout.split()[1:3])
    assert n == 60 and drafted > 0, p.stdout


# --------------------------------------------------------------------------------------------- item 6: API arguments
@pytest.fixture(scope="module")
def engine(tiny):
    eng = Engine.load(ModelSpec(str(tiny["target"]), n_ctx=256, n_threads=1), drafter="suffix", memory=False, calibrate_costs=False)
    yield eng
    eng.close()


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, "1", 1e300, -1, [1], True, 10**400])
def test_bad_timeouts_are_config_errors(engine, bad):
    with pytest.raises(ConfigError, match="timeout"):
        check_timeout(bad)
    g = engine.stream("abc", max_tokens=2)
    with pytest.raises(ConfigError, match="timeout"):
        g.result(timeout=bad)
    with pytest.raises(ConfigError, match="timeout"):
        g.wait(bad)
    assert g.result(timeout=60).finish_reason in ("length", "eos")


def test_good_timeouts_still_work(engine):
    assert check_timeout(None) is None and check_timeout(0) == 0.0 and check_timeout(2.5) == 2.5
    g = engine.stream("abc", max_tokens=2)
    assert g.wait(60) is True and g.result(timeout=0).token_ids


@pytest.mark.parametrize("call,match", [
    (lambda e: e.remember(None), "remember takes text"),
    (lambda e: e.remember(b"abc"), "remember takes text"),
    (lambda e: e.remember("abc", source=5), "source must be text"),
    (lambda e: e.generate(messages=[]), "must not be empty"),
    (lambda e: e.generate(messages={"role": "user", "content": "x"}), "messages must be a list"),
    (lambda e: e.generate(messages="hi"), "messages must be a list"),
    (lambda e: e.prompt_tokens(messages=()), "must not be empty"),
])
def test_bad_api_arguments_are_config_errors(engine, call, match):
    with pytest.raises(ConfigError, match=match):
        call(engine)


@pytest.mark.parametrize("kw,match", [
    (dict(memory=123), "memory must be"), (dict(memory=[]), "memory must be"), (dict(memory=""), "empty"),
    (dict(calibrate_costs="no"), "calibrate_costs"),
])
def test_bad_load_arguments_are_config_errors(tiny, kw, match):
    with pytest.raises(ConfigError, match=match):
        Engine.load(ModelSpec(str(tiny["target"]), n_ctx=256, n_threads=1), drafter="suffix", **kw)


def test_engine_init_refuses_a_memory_that_is_not_an_index(engine):
    with pytest.raises(ConfigError, match="SuffixIndex"):
        Engine(engine.target, drafter="none", memory=123)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------- item 8: bounded prompts
def test_a_prompt_that_cannot_fit_is_refused_before_tokenizing(engine):
    huge = "ab " * (4 << 20)  # 12 MB: millions of token ids if it were tokenized
    with pytest.raises(ContextFullError, match="bytes: far more than a context of 256 tokens"):
        engine.generate(huge)
    with pytest.raises(ContextFullError, match="far more than a context"):
        engine.generate(messages=[{"role": "user", "content": huge}])
    from edgespec.runtime.chat import ChatContextError, ChatSession

    with pytest.raises(ChatContextError, match="does not fit"):
        ChatSession(engine).send(huge)
    # the bound is an upper bound: a prompt of exactly the room tokenizes, and is refused only by its token count
    limit = engine.target.n_ctx * engine.max_token_bytes()
    assert engine.prompt_tokens("a" * 100)
    with pytest.raises(ContextFullError):
        engine.check_prompt_size(limit + 1)
    engine.check_prompt_size(limit)


# --------------------------------------------------------------------------------------------- item 8: what wins
def _notes(res) -> list[str]:
    return [ln for ln in res.stderr.splitlines() if ln.startswith("note:")]


def test_cli_says_which_of_two_overriding_options_wins(tiny, tmp_path):
    t = str(tiny["target"])
    base = ["generate", "abc", "--target", t, "--max-tokens", "2", "--ctx", "256", "--threads", "1"]
    res = CliRunner().invoke(main, base + ["--no-draft", "--drafter", "model"])
    assert res.exit_code == 0, res.output
    assert _notes(res) == ["note: --no-draft wins over --drafter model: plain decoding with the target alone"]
    corpus = tmp_path / "c.txt"
    corpus.write_text("abc abc abc")
    res = CliRunner().invoke(main, base + ["--draft", "ngram", "--lookup-corpus", str(corpus)])
    assert res.exit_code == 0, res.output
    assert len(_notes(res)) == 1 and "--lookup-corpus is ignored" in _notes(res)[0] and "ngram" in _notes(res)[0]
    res = CliRunner().invoke(main, base + ["--no-draft", "--raw", "--system", "be nice"])
    assert res.exit_code == 0, res.output
    assert len(_notes(res)) == 1 and "--system is ignored with --raw" in _notes(res)[0]
    res = CliRunner().invoke(main, base + ["--no-draft"])  # nothing overridden: nothing said
    assert res.exit_code == 0 and _notes(res) == []


def test_spec_config_default_tree_fits_the_default_model_spec():
    check_tree_fits(ModelSpec("x.gguf"), SpecConfig().tree_nodes)
