"""CLI behaviour on tiny generated models: one-line errors and non-zero exits for bad input, never a traceback or
a crash; greedy output identical with and without a draft."""

from __future__ import annotations

import json
import os
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
    assert r.exit_code == 0  # two ordinary tokens differ: drafted with the ids mapped (docs/vocabularies.md)
    assert json.loads(r.stdout)["compatible"] is False and json.loads(r.stdout)["vocabulary"]["mode"] == "mapped"
    r = run("info", "--json", str(tiny["target"]), str(tiny["other_script"]))
    assert r.exit_code == 1
    assert json.loads(r.stdout)["vocabulary"]["mode"] == "none"


@pytest.mark.parametrize("key, words", [("truncated", "truncated"), ("text", "not a GGUF file"), ("f64", "F64")])
def test_bad_files_one_line_error_in_a_real_process(tiny, key, words):
    """A real process (a segfault would show as a negative return code), for info and for generate."""
    for args in (["info", str(tiny[key])], ["generate", "hi", "--target", str(tiny[key]), "--no-draft"]):
        p = subprocess.run([sys.executable, "-m", "edgespec", *args], capture_output=True, text=True, timeout=60)
        _one_line_error(p, words)


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
    """A draft sharing nothing with the target is refused; one of another vocabulary that shares enough drafts."""
    r = CliRunner().invoke(main, ["generate", "hi", "--target", str(tiny["target"]), "--draft", str(tiny["other_script"])])
    assert r.exit_code == 1
    assert "cannot be used with target" in r.stderr and "not worth drafting" in r.stderr
    args = ["--draft", str(tiny["mismatch_size"]), "--max-tokens", "4", "--ctx", "256"]
    r = CliRunner().invoke(main, ["generate", "hi", "--target", str(tiny["target"]), *args])
    assert r.exit_code == 0, r.output


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


# --------------------------------------------------------------------------------------------- hostile I/O
def _proc(args, **kw):
    return subprocess.run([sys.executable, "-m", "edgespec", *args], capture_output=True, timeout=120, **kw)


def test_invalid_utf8_on_stdin_is_not_a_traceback(tiny):
    junk = b"abc \xff\xfe\xc3 def\n"
    p = _proc(["generate", "-", "--target", str(tiny["target"]), "--no-draft", "--max-tokens", "3", "--ctx", "512"], input=junk)
    assert p.returncode == 0 and b"Traceback" not in p.stderr, p.stderr
    chat = _proc(["chat", "--target", str(tiny["target"]), "--draft", "ngram", "--max-tokens", "3", "--ctx", "512"],
                 input=b"hello \xff there\nsecond \xc3\n")
    assert chat.returncode == 0 and b"Traceback" not in chat.stderr, chat.stderr
    assert chat.stdout.count(b"tokens \xc2\xb7") == 2  # both messages answered, the conversation went on


def test_closed_stdin_and_full_stdout_are_one_line_errors(tiny):
    args = ["generate", "--target", str(tiny["target"]), "--no-draft", "--max-tokens", "3", "--ctx", "512"]
    p = _proc(args, stdin=subprocess.DEVNULL)
    assert p.returncode == 2 and b"Traceback" not in p.stderr  # an empty prompt: a usage error
    with open("/dev/full", "wb") as full:
        p = subprocess.run([sys.executable, "-m", "edgespec", *args, "hello"], stdout=full, stderr=subprocess.PIPE, timeout=120)
    lines = [ln for ln in p.stderr.decode().splitlines() if ln.strip()]
    assert p.returncode == 1 and "Traceback" not in p.stderr.decode(), p.stderr
    assert any("cannot write the output" in ln for ln in lines) and len(lines) <= 2, lines


def _one_line_error(p: subprocess.CompletedProcess, words: str) -> None:
    err = p.stderr if isinstance(p.stderr, str) else p.stderr.decode()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert p.returncode == 1 and len(lines) == 1 and words in lines[0] and "Traceback" not in err, (p.returncode, err)


def test_closed_stdout_or_stderr_is_not_a_traceback(tiny):
    """Started without a stdout (`>&-`): one line and exit 1; without a stderr: the output, and exit 0."""
    gen = [sys.executable, "-m", "edgespec", "generate", "hi", "--target", str(tiny["target"]), "--no-draft",
           "--max-tokens", "3", "--ctx", "512", "--threads", "1"]
    for argv in (gen, [sys.executable, "-m", "edgespec", "info", str(tiny["target"])]):
        p = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *argv], stderr=subprocess.PIPE, text=True, timeout=120)
        _one_line_error(p, "cannot write the output: stdout is closed")
    p = subprocess.run(["sh", "-c", 'exec "$@" 2>&-', "sh", *gen], stdout=subprocess.PIPE, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip(), p


def test_bad_corpus_model_path_and_index_url_are_one_line_errors(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_CACHE_DIR", str(tmp_path / "cache"))
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate(5 * 2**20)  # a named file past the corpus bound (a folder skips such files)
    common = ["generate", "hi", "--target", str(tiny["target"]), "--drafter", "suffix", "--max-tokens", "3", "--ctx", "512",
              "--threads", "1", "--no-memory"]
    fifo = tmp_path / "fifo.txt"
    os.mkfifo(fifo)  # opening it would wait for a writer forever
    for corpus, words in ((big, "larger than 4 MiB"), ("/dev/zero", "not a regular file"), (fifo, "not a regular file")):
        _one_line_error(_proc([*common, "--lookup-corpus", str(corpus)]), words)
    long_path = str(tmp_path / ("a" * 300 + ".gguf"))
    _one_line_error(_proc(["generate", "hi", "--target", long_path]), "File name too long")
    for url, words in (("http://[::1", "Invalid IPv6 URL"), ("http://127.0.0.1:abc/simple", "port")):
        p = _proc(["models", "pull", "--index-url", url, "-q"])
        _one_line_error(p, f"not a valid index URL: '{url}")
        assert words in p.stderr.decode()


def test_sigint_while_loading_is_kept_for_after_the_load():
    """llama.cpp's log callback runs Python during a load: a KeyboardInterrupt raised there is dropped by ctypes,
    so load_engine notes Ctrl-C during the load and raises it afterwards."""
    import signal

    from edgespec.cli.common import _sigint_deferred

    import time

    # _sigint_deferred engages only over Python's default Ctrl-C handling (as the CLI has it): start from that
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with _sigint_deferred() as interrupted:
            # to this thread (the main one): a signal to the process may land on any of its threads (llama.cpp's, an
            # engine's left running by an earlier test) and reach Python's handler later
            signal.raise_signal(signal.SIGINT)
            # the handler runs at the next check and only notes it (no KeyboardInterrupt here): wait for the note
            deadline = time.monotonic() + 10.0
            while not interrupted and time.monotonic() < deadline:
                time.sleep(0.001)
        assert interrupted == [True] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)
    # a second Ctrl-C during the load ends the process at once, by SIGINT. The second comes once the first was noted:
    # two signals that arrive before Python's handler runs are one call of it (as one Ctrl-C would be)
    code = ("import os, signal, time; from edgespec.cli.common import _sigint_deferred\n"
            "with _sigint_deferred() as seen:\n    os.kill(os.getpid(), signal.SIGINT)\n"
            "    deadline = time.monotonic() + 10\n    while not seen and time.monotonic() < deadline:\n        time.sleep(0.001)\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n    time.sleep(5)\nprint('survived')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == -signal.SIGINT and "survived" not in p.stdout, (p.returncode, p.stderr)


def test_the_cli_leaves_the_warning_format_as_it_found_it(tiny):
    import warnings

    before = warnings.formatwarning
    run("info", str(tiny["target"]))
    assert warnings.formatwarning is before


def test_settings_out_of_range_are_usage_errors(tiny):
    base = ["generate", "hi", "--target", str(tiny["target"]), "--no-draft", "--max-tokens", "2"]
    assert run(*base, "--ctx", "4294967312").exit_code == 2
    assert run(*base, "--seed", "-2").exit_code == 2
    r = run(*base, "--seed", "-1", "--ctx", "512")  # -1 = a fresh seed, as in llama.cpp
    assert r.exit_code == 0


def test_nan_logits_are_one_line(tmp_path):
    import numpy as np

    from support.tiny import write_tiny_model

    path = write_tiny_model(tmp_path / "nan.gguf", seed=1, bias=float("nan"))
    p = _proc(["generate", "hi", "--target", str(path), "--no-draft", "--max-tokens", "3", "--ctx", "256"])
    err = [ln for ln in p.stderr.decode().splitlines() if ln.strip()]
    assert p.returncode == 1 and len(err) == 1 and "NaN" in err[0], p.stderr
    assert np.isnan(float("nan"))


def test_chat_history_that_is_a_directory_does_not_stop_the_chat(tiny, tmp_path):
    from edgespec.cli.chat import _history

    data = tmp_path / "data"
    (data / "chat_history").mkdir(parents=True)
    import os

    old = os.environ.get("EDGESPEC_DATA_DIR")
    os.environ["EDGESPEC_DATA_DIR"] = str(data)
    try:
        notes: list[str] = []
        h = _history(notes)
        assert notes and "history off" in notes[0]
        h.append_string("still works in memory")
        # a huge history file: only its tail is read
        (data / "chat_history").rmdir()
        (data / "chat_history").write_bytes(b"\n# t\n+old line\n" * 200_000)
        notes.clear()
        h = _history(notes)
        assert not notes and len(list(h.load_history_strings())) < 20_000
    finally:
        if old is None:
            os.environ.pop("EDGESPEC_DATA_DIR")
        else:
            os.environ["EDGESPEC_DATA_DIR"] = old


def test_ctrl_c_stops_a_generation_with_130(tiny):
    import signal
    import time

    p = subprocess.Popen(
        [sys.executable, "-m", "edgespec", "generate", "abc", "--raw", "--target", str(tiny["target"]), "--no-draft",
         "--max-tokens", "20000", "--ctx", "32768", "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert p.stdout is not None
    p.stdout.read(64)  # it is generating
    time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert b"interrupted" in err and b"Traceback" not in err and b"stop: cancelled" in err


def test_suffix_drafter_with_a_lookup_corpus_and_a_memory(tiny, tmp_path, monkeypatch):
    """--drafter suffix: greedy output equals plain; a corpus file the answer copies from makes drafts accepted;
    the memory persists in the cache unless --no-memory."""
    monkeypatch.setenv("EDGESPEC_CACHE_DIR", str(tmp_path / "cache"))
    common = ["--target", str(tiny["target"]), "--temperature", "0", "--max-tokens", "40", "--ctx", "512", "--json", "--raw"]
    plain = json.loads(run("generate", "abc d", "--no-draft", *common).stdout)
    corpus = tmp_path / "notes"
    corpus.mkdir()
    text = CliRunner().invoke(main, ["generate", "abc d", "--no-draft", *common[:-2], "--raw"]).stdout
    (corpus / "seen.txt").write_text("abc d" + text.strip("\n"))
    r = json.loads(run("generate", "abc d", "--drafter", "suffix", "--lookup-corpus", str(corpus), "--no-memory", *common).stdout)
    assert r["token_ids"] == plain["token_ids"]
    assert r["stats"]["n_accepted"] > 10  # the answer was in the corpus
    assert not (tmp_path / "cache" / "suffix").exists()  # --no-memory: nothing saved
    # a fixed tree shape: the adaptive one follows the costs measured at load, and a slower moment could draft
    # smaller trees on the second run than on the first and accept fewer tokens though more is remembered
    r = json.loads(run("generate", "abc d", "--drafter", "suffix", "--fixed-k", *common).stdout)
    assert r["token_ids"] == plain["token_ids"] and any((tmp_path / "cache" / "suffix").glob("*.idx"))
    again = json.loads(run("generate", "abc d", "--drafter", "suffix", "--fixed-k", *common).stdout)
    assert again["token_ids"] == plain["token_ids"] and again["stats"]["n_accepted"] > r["stats"]["n_accepted"]  # remembered


def test_stdin_larger_than_the_bound_is_a_usage_error(monkeypatch):
    import io

    import click

    from edgespec.cli import common

    class Stdin:
        def __init__(self, data: bytes) -> None:
            self.buffer = io.BytesIO(data)

    monkeypatch.setattr(common, "MAX_STDIN_BYTES", 1024)
    monkeypatch.setattr(sys, "stdin", Stdin(b"x" * 1024))
    assert common.read_stdin_text() == "x" * 1024  # up to the bound: read whole
    monkeypatch.setattr(sys, "stdin", Stdin(b"x" * 1025))
    with pytest.raises(click.UsageError, match="larger than"):
        common.read_stdin_text()
    monkeypatch.setattr(sys, "stdin", None)
    with pytest.raises(click.UsageError, match="stdin is closed"):
        common.read_stdin_text()


def test_serve_listens_on_loopback_unless_told_otherwise():
    from edgespec.cli.serve import serve

    host = next(p for p in serve.params if p.name == "host")
    assert host.default == "127.0.0.1"


def test_a_llama_cpp_that_cannot_load_is_one_line(tiny, tmp_path):
    """A CUDA build on a machine without the CUDA runtime or cuBLAS: llama_cpp raises RuntimeError at import (as
    llama_cpp._ctypes_extensions does); the CLI says so in one line and exits 1, no traceback."""
    fake = tmp_path / "llama_cpp"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "raise RuntimeError(\"Failed to load shared library 'libllama.so': libcublas.so.13: cannot open shared object file\")\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-m", "edgespec", "generate", "hi", "--target", str(tiny["target"]), "--no-draft", "--max-tokens", "2"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "llama.cpp's library could not be loaded" in p.stderr and "libcublas.so.13" in p.stderr


def test_deterministic_option(tiny, tmp_path):
    """--deterministic: a model it cannot hold for, or a tree drafter, is one line and exit 1; on a Q4_1 pair the
    greedy output is plain decoding's."""
    from support.tiny import write_tiny_model

    r = CliRunner().invoke(main, ["generate", "hi", "--target", str(tiny["target"]), "--no-draft", "--deterministic"])
    assert r.exit_code == 1 and "multiple of 32" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    shape = {"d_model": 128, "n_head": 4, "n_head_kv": 2, "d_ff": 128}
    t = write_tiny_model(tmp_path / "t.gguf", seed=1, quant="q4_1", name="tiny-q41", **shape)
    d = write_tiny_model(tmp_path / "d.gguf", seed=2, layer_scale=0.4, quant="q4_1", name="tiny-q41-draft", **shape)
    r = CliRunner().invoke(main, ["generate", "hi", "--target", str(t), "--drafter", "suffix", "--deterministic"])
    assert r.exit_code == 1 and "chains only" in r.stderr
    base = ["generate", "the quick", "--raw", "--target", str(t), "--temperature", "0", "--max-tokens", "40", "--ctx", "256",
            "--json", "--deterministic"]
    plain = json.loads(run(*base, "--no-draft").stdout)
    spec = json.loads(run(*base, "--draft", str(d), "--fixed-k", "--draft-max", "6").stdout)
    assert spec["token_ids"] == plain["token_ids"]
