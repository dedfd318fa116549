"""`edgespec generate --json-schema / --json-object / --regex / --choice / --grammar` on the tiny models."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from click.testing import CliRunner

from edgespec.cli import main


def gen(tiny, *args: str, draft: bool = True):
    models = ["--target", str(tiny["target"])] + (["--draft", str(tiny["draft"])] if draft else ["--no-draft"])
    return CliRunner().invoke(main, ["generate", "--raw", *models, "--ctx", "512", "--threads", "1", *args])


def test_regex_choice_and_grammar(tiny, tmp_path):
    for seed in range(3):
        r = gen(tiny, "abc", "--regex", "[a-c]{2}-[0-9]", "--seed", str(seed), "--json")
        assert r.exit_code == 0, r.stderr
        out = json.loads(r.stdout)
        assert re.fullmatch("[a-c]{2}-[0-9]", out["text"]) and out["finish_reason"] == "eos"
    r = gen(tiny, "abc", "--choice", "yes,no", "--temperature", "0")
    assert r.exit_code == 0 and r.stdout.strip() in ("yes", "no")
    g = tmp_path / "g.gbnf"
    g.write_text('root ::= "ab" [c-e]{2}\n')
    r = gen(tiny, "abc", "--grammar", str(g), draft=False)
    assert r.exit_code == 0 and re.fullmatch("ab[c-e]{2}", r.stdout.strip()), r.stdout


def test_json_schema_file(tiny, tmp_path):
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": {"enum": ["x", "y"]}},
              "required": ["a", "b"], "additionalProperties": False}
    f = tmp_path / "s.json"
    f.write_text(json.dumps(schema))
    r = gen(tiny, "abc", "--json-schema", str(f), "--temperature", "0.9", "--seed", "1")
    assert r.exit_code == 0, r.stderr
    obj = json.loads(r.stdout)
    assert set(obj) == {"a", "b"} and 0 <= obj["a"] <= 9 and obj["b"] in ("x", "y")


def test_bad_constraints_are_one_line_before_loading(tiny, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "nonsense"}')
    for args, words in ((["--regex", "("], "invalid regex"), (["--json-schema", str(bad)], "invalid json schema"),
                        (["--choice", ","], "choice")):
        p = subprocess.run([sys.executable, "-m", "edgespec", "generate", "hi", "--target", "/nonexistent.gguf", *args],
                           capture_output=True, text=True, timeout=60)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert p.returncode == 1 and len(lines) == 1 and words in lines[0].lower() and "Traceback" not in p.stderr, p.stderr
    r = gen(tiny, "hi", "--regex", "a", "--choice", "a,b")
    assert r.exit_code == 2 and "at most one of" in r.stderr
    r = gen(tiny, "hi", "--json-schema", str(tmp_path / "missing.json"))
    assert r.exit_code == 2 and "cannot read" in r.stderr
