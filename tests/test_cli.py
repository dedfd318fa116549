"""CLI behaviour on tiny generated models: one-line errors and non-zero exits for bad input, never a traceback or
a crash; greedy output identical with and without a draft."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from edgespec import __version__
from edgespec.cli import main


def run(*args: str, input: str | None = None):
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def test_version_and_help():
    r = run("--version")
    assert r.exit_code == 0 and __version__ in r.output
    for cmd in ([], ["generate"], ["info"], ["models"], ["models", "pull"], ["models", "list"]):
        assert run(*cmd, "--help").exit_code == 0


def test_info_one_and_two_files(tiny):
    r = run("info", str(tiny["target"]))
    assert r.exit_code == 0
    assert "architecture  llama" in r.output and "263 tokens" in r.output and "chat template yes" in r.output
    r = run("info", str(tiny["target"]), str(tiny["draft"]))
    assert r.exit_code == 0 and "pair: compatible" in r.output
    r = run("info", "--json", str(tiny["target"]), str(tiny["mismatch_text"]))
    assert r.exit_code == 1
    assert json.loads(r.stdout)["compatible"] is False


@pytest.mark.parametrize("key, words", [("truncated", "truncated"), ("text", "not a GGUF file"), ("f64", "F64")])
def test_bad_files_one_line_error_in_a_real_process(tiny, key, words):
    """A real process (a segfault would show as a negative return code), for info and for generate."""
    for args in (["info", str(tiny[key])], ["generate", "hi", "--target", str(tiny[key]), "--no-draft"]):
        p = subprocess.run([sys.executable, "-m", "edgespec", *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == 1, (args, p.returncode, p.stderr)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in p.stderr, p.stderr


def test_generate_json_same_ids_with_and_without_draft(tiny):
    common = ["--target", str(tiny["target"]), "--temperature", "0", "--max-tokens", "40", "--ctx", "512", "--json"]
    plain = json.loads(run("generate", "abc def", "--no-draft", *common).stdout)
    spec = json.loads(run("generate", "abc def", "--draft", str(tiny["draft"]), "--fixed-k", "--draft-max", "4", *common).stdout)
    ngram = json.loads(run("generate", "abc def", "--draft", "ngram", *common).stdout)
    assert set(plain) >= {"text", "token_ids", "stats"}
    assert spec["token_ids"] == plain["token_ids"] == ngram["token_ids"]
    assert spec["stats"]["n_drafted"] > 0 and plain["stats"]["n_drafted"] == 0
    assert len(plain["token_ids"]) == 40


def test_generate_streams_text_and_stats_line(tiny):
    r = run("generate", "--raw", "--target", str(tiny["target"]), "--draft", str(tiny["draft"]), "--max-tokens", "12", "--seed", "3", "--ctx", "512", "hello")
    assert r.exit_code == 0
    assert "12 tokens" in r.stderr and "tok/s" in r.stderr
    assert r.stdout.strip()


def test_generate_reads_stdin(tiny):
    r = run("generate", "-", "--target", str(tiny["target"]), "--no-draft", "--max-tokens", "3", "--ctx", "512", input="abc")
    assert r.exit_code == 0


def test_mismatched_pair_is_refused(tiny):
    r = CliRunner().invoke(main, ["generate", "hi", "--target", str(tiny["target"]), "--draft", str(tiny["mismatch_size"])])
    assert r.exit_code == 1
    assert "cannot be used with target" in r.stderr and "vocabulary sizes differ by 300" in r.stderr


def test_bad_settings(tiny):
    r = CliRunner().invoke(main, ["generate", "hi", "--target", str(tiny["target"]), "--temperature", "-1"])
    assert r.exit_code == 2
    r = CliRunner().invoke(main, ["generate", "hi", "--target", "/nonexistent/model.gguf"])
    assert r.exit_code == 1 and "not found" in r.stderr
    r = CliRunner().invoke(main, ["generate", "  ", "--target", str(tiny["target"])])
    assert r.exit_code == 2


def test_seed_fixes_the_output_whatever_the_drafting(tiny):
    """A seed fixes every position's randomness: the adaptive controller (whose decisions follow this machine's
    timings), a fixed draft length and plain decoding all give the same tokens."""
    args = ["generate", "abc", "--raw", "--target", str(tiny["target"]), "--draft", str(tiny["draft"]),
            "--temperature", "1.0", "--seed", "42", "--max-tokens", "60", "--ctx", "512", "--json"]
    adaptive = json.loads(run(*args).stdout)
    fixed = json.loads(run(*args, "--fixed-k", "--draft-max", "4").stdout)
    plain = json.loads(run(*args, "--no-draft").stdout)
    assert fixed["stats"]["n_drafted"] > 0 and plain["stats"]["n_drafted"] == 0
    assert adaptive["token_ids"] == fixed["token_ids"] == plain["token_ids"]
    other = json.loads(run(*args[:-5], "--seed", "43", "--max-tokens", "60", "--ctx", "512", "--json").stdout)
    assert other["token_ids"] != plain["token_ids"]
