"""`edgespec bench` on the tiny generated models: the report's shape, both sides run, prompt files, one-line errors
for bad prompt files, the plot. No timing assertions (the tiny models produce nonsense, quickly)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from edgespec.bench import BenchError, load_prompts_jsonl, load_suites
from edgespec.cli import main

from support import ROOT

SUITES = ("code-completion", "coding-chat", "creative-writing", "math-reasoning", "input-grounded", "multi-turn")


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def pair(tiny) -> list[str]:
    # a fixed draft length: the tiny draft costs as much as the tiny target, so the adaptive controller would
    # (rightly) not draft, and these tests need drafting to happen
    return ["--target", str(tiny["target"]), "--draft", str(tiny["draft"]), "--ctx", "4096", "--draft-max", "4", "--fixed-k"]


def check_summary(s: dict, n: int) -> None:
    assert s["n_prompts"] == n
    for side in ("plain", "spec"):
        assert s[side]["tokens"] > 0 and s[side]["tokens_per_second"] > 0 and s[side]["decode_seconds"] > 0
    assert s["speedup"] > 0 and s["speedup_geomean"] > 0
    split = s["spec"]["time_split"]
    assert set(split) == {"draft", "target", "overhead"} and all(v >= 0 for v in split.values())
    assert 0.0 <= (s["acceptance"] or 0.0) <= 1.0
    assert s["drafted"] > 0 and s["spec_cycles"] > 0
    assert len(s["acceptance_by_pos"]) == len(s["drafted_by_pos"]) > 0
    assert sum(s["sources"].values()) == s["cycles"]


def test_builtin_suites_shape():
    suites = load_suites()
    assert set(suites) == set(SUITES)
    for name, entries in suites.items():
        assert 4 <= len(entries) <= 6, name
    assert all("prompt" in e for e in suites["code-completion"])
    for name in SUITES[1:]:
        assert all("messages" in e for e in suites[name]), name
    # input-grounded prompts carry a sizeable text to work on; multi-turn ones an earlier answer to change
    assert all(len(e["messages"][-1]["content"]) > 1200 for e in suites["input-grounded"])
    assert all([m["role"] for m in e["messages"]] == ["user", "assistant", "user"] for e in suites["multi-turn"])


def test_bench_json_code_completion(tiny):
    r = run("bench", *pair(tiny), "--suite", "code-completion", "--max-tokens", "16", "--json", "-q")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert set(rep) >= {"settings", "models", "prompts", "suites", "overall"}
    assert rep["settings"]["temperature"] == 0 and rep["settings"]["max_tokens"] == 16
    assert rep["models"]["draft"] and rep["models"]["drafter"] == "model+ngram"
    n = len(load_suites()["code-completion"])
    assert list(rep["suites"]) == ["code-completion"] and len(rep["prompts"]) == n
    for p in rep["prompts"]:
        assert p["suite"] == "code-completion" and p["kind"] == "raw" and p["n_prompt"] > 0
        assert len(p["plain"]) == len(p["spec"]) == 1
        plain, spec = p["plain"][0], p["spec"][0]
        assert plain["n_generated"] > 0 and spec["n_generated"] > 0
        assert plain["n_drafted"] == 0  # the plain side never drafts
        assert p["plain_tokens_per_second"] > 0 and p["spec_tokens_per_second"] > 0 and p["speedup"] > 0
        assert p["identical"] is True  # greedy speculative decoding reproduces the target exactly
        for side in (plain, spec):
            assert {"prefill", "draft", "target", "overhead", "wall", "draft_prefill"} <= set(side["seconds"])
    check_summary(rep["suites"]["code-completion"], n)
    check_summary(rep["overall"], n)
    assert rep["overall"]["identical"] == n
    assert "_runs" not in json.dumps(rep) and "record" not in json.dumps(rep)
    assert rep["costs"]["calibration"]["source"] in ("measured", "cache", "measured-unsteady", "remeasured", "recalibrated")


def test_bench_table_output(tiny):
    r = run("bench", *pair(tiny), "--suite", "math-reasoning", "--max-tokens", "8", "-q")
    assert r.exit_code == 0, r.output
    out = r.stdout
    for words in ("plain tok/s", "spec tok/s", "speedup", "math-reasoning", "overall", "acceptance by draft position", "identical"):
        assert words in out, words


def test_bench_prompts_jsonl_sampled_with_repeats(tiny, tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text(
        "# a comment line, then a blank one\n\n"
        + json.dumps({"prompt": "def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n"}) + "\n"
        + json.dumps({"messages": [{"role": "user", "content": "Say hello."}], "suite": "chatty", "name": "hello"}) + "\n"
    )
    r = run("bench", *pair(tiny), "--prompts", str(f), "--max-tokens", "12", "--temperature", "1.0",
            "--seed", "7", "--repeats", "2", "--json", "-q")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert set(rep["suites"]) == {"mine", "chatty"}  # only the file: no built-in suite without --suite
    assert [p["name"] for p in rep["prompts"]] == ["mine-1", "hello"]
    for p in rep["prompts"]:
        assert len(p["plain"]) == len(p["spec"]) == 2
        assert p["identical"] is None  # not meaningful when sampling
        assert p["speedup"] > 0
    assert rep["overall"]["identical"] is None and rep["settings"]["seed"] == 7


def test_bench_prompts_and_suite_together(tiny, tmp_path):
    f = tmp_path / "extra.jsonl"
    f.write_text(json.dumps({"prompt": "x = 1\n"}) + "\n")
    r = run("bench", *pair(tiny), "--prompts", str(f), "--suite", "creative-writing", "--max-tokens", "4", "--json", "-q")
    assert r.exit_code == 0, r.output
    assert list(json.loads(r.stdout)["suites"]) == ["creative-writing", "extra"]


@pytest.mark.parametrize(
    "line, words",
    [
        ('{"prompt": "ok"', "invalid JSON"),
        ('["prompt", "x"]', "expected a JSON object"),
        ('{"prompt": "a", "messages": []}', "exactly one of"),
        ('{"messages": [{"role": "user"}]}', "messages[0]"),
        ('{"prompt": ""}', "non-empty string"),
        ("[" * 100_000, "nested too deeply"),
    ],
)
def test_bench_bad_jsonl_line_one_line_error(tiny, tmp_path, line, words):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps({"prompt": "fine"}) + "\n" + line + "\n")
    r = run("bench", *pair(tiny), "--prompts", str(f), "--max-tokens", "4")
    assert r.exit_code == 1
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1, r.output
    assert f"{f}:2:" in lines[0] and words in lines[0] and "Traceback" not in r.output


def test_load_prompts_jsonl_errors(tmp_path):
    with pytest.raises(BenchError, match="no prompts"):
        (tmp_path / "empty.jsonl").write_text("\n# nothing\n")
        load_prompts_jsonl(tmp_path / "empty.jsonl")
    with pytest.raises(BenchError, match="cannot read"):
        load_prompts_jsonl(tmp_path / "missing.jsonl")


def test_bench_missing_prompts_file_is_one_line_error(tiny, tmp_path):
    r = run("bench", *pair(tiny), "--prompts", str(tmp_path / "nope.jsonl"))
    assert r.exit_code == 1 and "cannot read" in r.output and len(r.output.strip().splitlines()) == 1


def test_bench_refuses_no_draft(tiny):
    r = run("bench", "--target", str(tiny["target"]), "--no-draft", "--suite", "code-completion")
    assert r.exit_code == 2 and "nothing to compare" in r.output


def test_bench_plot_writes_png(tiny, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib not installed (pip install 'edgespec[plot]')")
    png = tmp_path / "bench.png"
    r = run("bench", *pair(tiny), "--suite", "code-completion", "--suite", "coding-chat", "--max-tokens", "6",
            "--plot", str(png), "-q")
    assert r.exit_code == 0, r.output
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


@pytest.mark.parametrize("name, words", [("nodir/x.png", "is not a folder"), ("x.xyz", "cannot write a plot as '.xyz': use one of")])
def test_bench_plot_path_is_checked_before_the_run(tiny, tmp_path, monkeypatch, name, words):
    monkeypatch.chdir(tmp_path)
    r = run("bench", *pair(tiny), "--suite", "code-completion", "--max-tokens", "4", "--plot", name, "-q")
    assert r.exit_code == 1 and words in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_a_failed_plot_write_keeps_the_old_plot_and_the_results(tiny, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="matplotlib not installed (pip install 'edgespec[plot]')")
    import errno

    import edgespec.bench.report as br

    png = tmp_path / "bench.png"
    png.write_bytes(b"the old plot")

    def full_disk(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(br, "atomic_write_bytes", full_disk)
    r = run("bench", *pair(tiny), "--suite", "code-completion", "--max-tokens", "4", "--plot", str(png), "-q")
    assert r.exit_code == 1 and f"cannot write the plot {png}: No space left on device" in r.output
    assert "code-completion" in r.stdout  # the results were printed first
    assert png.read_bytes() == b"the old plot"


def test_bench_plot_without_matplotlib_is_one_line_error(tiny, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    r = run("bench", *pair(tiny), "--suite", "code-completion", "--max-tokens", "4", "--plot", str(tmp_path / "x.png"))
    assert r.exit_code == 1 and "needs matplotlib" in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "x.png").exists()


def test_bench_module_imports_first():
    """edgespec.bench is a library (no click) and the CLI registers its command."""
    code = ("import sys, edgespec.bench as b; assert 'click' not in sys.modules; from edgespec.cli import main; "
            "print(hasattr(b, 'run_bench'), 'bench' in main.commands)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["True", "True"]
