"""`edgespec models list/pairs/dirs` over fake trees, --target/--draft by name, --draft auto, and the default pair and
a model given by path loading as before."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support import ROOT
from support.model_trees import write_model_trees
from support.tiny import write_tiny_model

GEN = ["generate", "hi", "--max-tokens", "3", "--ctx", "256", "--temperature", "0", "--json", "--threads", "1"]


def _env(tmp_path: Path, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OLLAMA_MODELS", "HF_HOME", "HF_HUB_CACHE", "LLAMA_CACHE", "EDGESPEC_MODEL_DIRS",
                        "EDGESPEC_TARGET", "EDGESPEC_DRAFT")}
    env.update(HOME=str(home), EDGESPEC_CACHE_DIR=str(tmp_path / "cache"), EDGESPEC_DATA_DIR=str(tmp_path / "data"),
               PYTHONPATH=str(ROOT), **extra)
    return env


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgespec", *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture()
def trees(tmp_path):
    t = write_model_trees(tmp_path)
    return t, _env(tmp_path, t["home"], EDGESPEC_MODEL_DIRS=str(t["mine"]))


def test_list_shows_every_model_and_each_broken_one_in_one_line(trees):
    t, env = trees
    p = _run(["models", "list"], env)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    lines = p.stdout.splitlines()
    for name in ("tinybig:latest", "someone/tinysmall:q8", "small-lms", "merge", "org_repo_split"):
        row = next(ln for ln in lines if ln.startswith(name + " "))
        assert "UNUSABLE" not in row and "llama" in row
    for name, why in (("escape:latest", "not a sha256 digest"), ("empty:latest", "empty file"), ("loop-a", "symlink loop"),
                      ("sparse", "bad magic"), ("fifo", "FIFO"), ("isdir:latest", "directory")):
        assert len([ln for ln in lines if ln.startswith(name + " ") and "UNUSABLE" in ln and why in ln]) == 1, (name, p.stdout)
    data = json.loads(_run(["models", "list", "--json"], env).stdout)
    by_name = {m["name"]: m for m in data["models"]}
    assert by_name["tinybig:latest"]["names"] == ["ollama:tinybig:latest"] and by_name["sparse"]["error"]
    assert "pairs" in data


def test_pairs_and_dirs(trees, tmp_path):
    t, env = trees
    p = _run(["models", "pairs", "tinybig:latest", "--json"], env)
    assert p.returncode == 0, p.stderr
    row = json.loads(p.stdout)
    assert row["target"] == "tinybig:latest"
    assert {d["name"] for d in row["drafts"]} == {"someone/tinysmall:q8", "small-lms", "org_repo_split"}
    p = _run(["models", "pairs"], env)
    assert "merge: no draft found" in p.stdout and "escape" not in p.stdout  # usable targets only
    assert "escape:latest: unusable: " in _run(["models", "pairs", "escape:latest"], env).stdout
    extra = tmp_path / "extra"
    extra.mkdir()
    write_tiny_model(extra / "added.gguf", seed=9)
    p = _run(["models", "dirs", "--add", str(extra)], env)
    assert p.returncode == 0 and f"folder    {extra}" in p.stdout, p.stdout + p.stderr
    assert "added" in _run(["models", "list"], env).stdout
    p = _run(["models", "dirs", "--remove", str(extra)], env)
    assert str(extra) not in p.stdout
    assert _run(["models", "dirs", "--add", str(tmp_path / "nope")], env).returncode == 1


def test_generate_by_name_and_draft_auto(trees):
    t, env = trees
    p = _run([*GEN, "--target", "tinybig:latest"], env)
    assert p.returncode == 0, p.stderr
    note = [ln for ln in p.stderr.splitlines() if "--draft auto" in ln]
    assert len(note) == 1 and "drafts for" in note[0], p.stderr
    assert json.loads(p.stdout)["stats"]["n_generated"] > 0
    p = _run([*GEN, "--target", "ollama:tinybig", "--draft", "small-lms"], env)
    assert p.returncode == 0 and "--draft auto" not in p.stderr, p.stderr
    p = _run([*GEN, "--target", "tinybigg"], env)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 1 and len(lines) == 1 and "close matches: tinybig:latest" in lines[0], p.stderr
    # one merge apart: never picked by auto, but a draft the user names is the engine's to check, as before (the
    # draft reads the target's token ids, it never tokenizes text)
    p = _run([*GEN, "--target", "tinybig", "--draft", "merge"], env)
    assert p.returncode == 0 and "--draft auto" not in p.stderr, p.stderr
    p = _run([*GEN, "--target", "empty:latest"], env)
    assert p.returncode == 1 and "empty file" in p.stderr and "Traceback" not in p.stderr
    p = _run(["info", "small-lms"], env)
    assert p.returncode == 0 and "tiny-lms" in p.stdout


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _role(wheels: Path, prefix: str, data: bytes) -> dict:
    """A manifest role whose file is `data` in one part wheel (as tests/models/test_models.py builds them)."""
    mod, version = prefix.replace("-", "_") + "_part1", "0.1.0"
    fn, member = f"{mod}-{version}-py3-none-any.whl", f"{mod}/data/part01.bin"
    with zipfile.ZipFile(wheels / fn, "w") as z:
        z.writestr(member, data)
        z.writestr(f"{mod}-{version}.dist-info/METADATA", f"Name: {prefix}-part1\nVersion: {version}\n")
    wb = (wheels / fn).read_bytes()
    part = {"package": f"{prefix}-part1", "version": version, "member": member, "size": len(data), "sha256": _sha(data),
            "wheel": {"filename": fn, "size": len(wb), "sha256": _sha(wb)}}
    return {"file": f"{prefix}.gguf", "size": len(data), "sha256": _sha(data), "parts": [part]}


def test_the_default_pair_and_a_path_load_as_before(trees, tmp_path):
    """A default pair of tiny models in the cache: no --target, or --target naming its target by path, loads its
    draft (no auto); a path to another model gets --draft auto."""
    t, env = trees
    src = tmp_path / "pair"
    src.mkdir()
    pt = write_tiny_model(src / "pt.gguf", seed=11, d_model=64, d_ff=128, n_layers=4)
    pd = write_tiny_model(src / "pd.gguf", seed=12)
    wheels, mdir = tmp_path / "wheels", tmp_path / "manifests"
    wheels.mkdir()
    mdir.mkdir()
    manifest = {"format_version": 1, "name": "tiny-pair", "default": True, "description": "t", "license": "MIT",
                "roles": {"target": _role(wheels, "tiny-pt", pt.read_bytes()), "draft": _role(wheels, "tiny-pd", pd.read_bytes())}}
    (mdir / "tiny-pair.json").write_text(json.dumps(manifest))
    env = {**env, "EDGESPEC_MANIFESTS_DIR": str(mdir), "EDGESPEC_INDEX_URL": "http://127.0.0.1:9/simple"}
    p = _run(["models", "pull", "--wheels-dir", str(wheels), "-q"], env)
    assert p.returncode == 0, p.stderr
    cached = tmp_path / "cache" / "models" / "tiny-pt.gguf"
    for args in ([], ["--target", str(cached)], ["--target", "tiny-pair"]):
        p = _run([*GEN, *args, "--drafter", "model"], env)
        assert p.returncode == 0 and "--draft auto" not in p.stderr, (args, p.stderr)
        assert "draft" in json.loads(p.stdout)["stats"]["threads"], (args, p.stdout[:3000])  # a draft model loaded
    p = _run([*GEN, "--target", str(t["target"])], env)  # a path to a model outside the pair: auto
    assert p.returncode == 0 and "--draft auto" in p.stderr, p.stderr


def test_serve_a_model_by_name_reports_that_name(trees, monkeypatch):
    import httpx

    from support.serve_process import ServeProcess

    t, env = trees
    for k in ("OLLAMA_MODELS", "HF_HOME", "HF_HUB_CACHE", "LLAMA_CACHE", "EDGESPEC_TARGET", "EDGESPEC_DRAFT"):
        monkeypatch.delenv(k, raising=False)
    for k in ("HOME", "EDGESPEC_CACHE_DIR", "EDGESPEC_DATA_DIR", "EDGESPEC_MODEL_DIRS"):
        monkeypatch.setenv(k, env[k])
    s = ServeProcess(["--target", "tinybig:latest", "--ctx", "256", "--threads", "1", "--parallel", "1"], timeout=120)
    try:
        ids = [m["id"] for m in httpx.get(s.url + "/v1/models").json()["data"]]
        assert ids[0] == "tinybig:latest" and len(ids) == len(set(ids))  # the pinned model, then the others found, once each
        assert "someone/tinysmall:q8" in ids
        r = httpx.post(s.url + "/v1/chat/completions", timeout=60,
                       json={"model": "tinybig:latest", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert r.status_code == 200 and r.json()["model"] == "tinybig:latest"
        r = httpx.post(s.url + "/v1/chat/completions", timeout=60,  # another model found on the machine, by its name
                       json={"model": "someone/tinysmall:q8", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert r.status_code == 200 and r.json()["model"] == "someone/tinysmall:q8", r.text
        assert any("--draft auto" in ln and "drafts for" in ln for ln in s.lines), s.lines
    finally:
        s.stop()
