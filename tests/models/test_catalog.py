"""Discovery, names and drafts over fake Ollama, LM Studio, Hugging Face, llama.cpp and user trees holding tiny GGUFs:
found, named, paired (a tokenizer one merge apart is not), hostile entries one line each, nothing written."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from edgespec.errors import ModelsError, UnknownModelError
from edgespec.models import Catalog, places, resolve_path, resolve_spec
from edgespec.models import catalog as catalog_mod
from edgespec.models.discover import Place, save_setting_dirs
from support.model_trees import write_model_trees
from support.tiny import MERGES, write_tiny_model

@pytest.fixture()
def home(tmp_path: Path) -> dict[str, Path]:
    return write_model_trees(tmp_path)


def _where(home: dict[str, Path]) -> list[Place]:
    return places({"EDGESPEC_MODEL_DIRS": str(home["mine"])}, home["home"], system=False)


def _snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under root: kind, size, mtime, and the bytes' digest for small regular files."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            digest = None
            if os.path.isfile(p) and not os.path.islink(p) and st.st_size < 1 << 24:
                digest = hashlib.sha256(Path(p).read_bytes()).hexdigest()
            out[p] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return out


def test_found_named_and_hostile_entries_one_line_each_nothing_written(home, tmp_path):
    before = {**_snapshot(home["home"]), **_snapshot(home["mine"])}
    cat = Catalog(_where(home), cache=tmp_path / "cache" / "models.json")
    models = {m.name: m for m in cat.models()}
    assert {**_snapshot(home["home"]), **_snapshot(home["mine"])} == before
    good = {n for n, m in models.items() if m.error is None}
    assert good == {"tinybig:latest", "someone/tinysmall:q8", "small-lms", "merge", "org_repo_split"}
    assert models["tinybig:latest"].names == ["ollama:tinybig:latest"]
    assert models["tinybig:latest"].parameters > 4 * models["someone/tinysmall:q8"].parameters
    assert models["small-lms"].names == ["lmstudio:pub/repo/small-lms.gguf"]
    assert models["merge"].names == ["hf:org/repo/merge.gguf"]
    split = models["org_repo_split"]
    assert len(split.paths) == 3 and split.names == ["llamacpp:org_repo_split-00001-of-00003.gguf"]
    assert split.parameters == models["someone/tinysmall:q8"].parameters  # every part's tensors counted
    assert not any("mmproj" in n for m in models.values() for n in m.names)
    assert not any("linkdir" in n for m in models.values() for n in m.names)
    errors = {m.name: m.error for m in models.values() if m.error}
    assert "not a sha256 digest" in errors["escape:latest"]
    assert "empty file" in errors["empty:latest"]
    assert "directory" in errors["isdir:latest"]
    assert "symlink loop" in errors["loop-a"] and "symlink loop" in errors["loop-b"]
    assert "bad magic" in errors["sparse"]
    assert "FIFO" in errors["fifo"]
    assert "truncated" in errors["trunc"]
    assert "manifest cannot be read" in errors["fifo:latest"]
    assert "not a regular file" in errors["fsplit"]
    assert "truncated" in errors["f"]  # listed although its repo's refs/main is a FIFO
    assert all("\n" not in e for e in errors.values())


def test_pairs_share_the_tokenizer_checked_not_guessed(home, tmp_path):
    cat = Catalog(_where(home), cache=tmp_path / "models.json")
    ranked = cat.drafts_for("tinybig:latest")
    names = [d.name for d, _ in ranked]
    # the same tokenizer, fewer parameters; the model one merge apart and the target itself are not drafts
    assert set(names) == {"someone/tinysmall:q8", "small-lms", "org_repo_split"}
    assert "merge" not in names
    merge = cat.find("merge")
    assert merge.tokenizer != cat.find("tinybig:latest").tokenizer and merge.tokens == cat.find("tinybig:latest").tokens
    assert [s for _, s in ranked] == sorted((s for _, s in ranked), reverse=True) and ranked[0][1] > 1
    assert cat.best_draft("tinybig:latest") is ranked[0][0]
    assert cat.drafts_for("someone/tinysmall:q8") == []  # nothing smaller shares its tokenizer
    assert cat.best_draft("merge") is None


def test_names_short_full_and_close_matches(home, tmp_path):
    cat = Catalog(_where(home), cache=tmp_path / "models.json")
    t = cat.find("tinybig:latest")
    assert cat.find("ollama:tinybig:latest") is t and cat.find("ollama:tinybig") is t and cat.find("tinybig") is t
    assert cat.find("TINYBIG:latest") is t
    assert cat.find("hf:org/repo/merge.gguf") is cat.find("merge")
    assert cat.find(str(t.path)) is t  # a path to a discovered file is that model
    with pytest.raises(UnknownModelError) as e:
        cat.find("tinybigg")
    assert isinstance(e.value, ModelsError) and "tinybig:latest" in e.value.close_matches
    assert "close matches" in str(e.value)
    spec = cat.spec("small-lms", n_ctx=256)
    assert spec.path == str(cat.find("small-lms").path) and spec.n_ctx == 256
    with pytest.raises(ModelsError, match="empty file"):
        cat.spec("empty:latest")


def test_short_names_stay_unique_across_sources(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    write_tiny_model(a / "same.gguf", seed=1)
    write_tiny_model(b / "same.gguf", seed=2)
    cat = Catalog([Place("lmstudio", a), Place("folder", b)], use_cache=False)
    assert sorted(m.name for m in cat.models()) == ["folder:same", "lmstudio:same"]


def test_the_cache_is_used_warm_and_refreshed_when_a_file_changes(home, tmp_path, monkeypatch):
    cache = tmp_path / "models.json"
    first = {m.name: m.as_dict() for m in Catalog(_where(home), cache=cache).models()}
    assert cache.is_file()

    def no_reading(*a, **k):
        raise AssertionError("a header was read although the cache has it")

    monkeypatch.setattr(catalog_mod, "_read_record", no_reading)
    warm = Catalog(_where(home), cache=cache)
    assert {m.name: m.as_dict() for m in warm.models()} == first
    warm.drafts_for("tinybig:latest")  # pair verdicts cached too
    monkeypatch.undo()
    lms = home["home"] / ".lmstudio" / "models" / "pub" / "repo" / "small-lms.gguf"
    write_tiny_model(lms, seed=4, name="tiny-lms", merges=[*MERGES, "o n"])
    again = Catalog(_where(home), cache=cache)
    assert again.find("small-lms").tokenizer != first["small-lms"]["tokenizer"]
    assert "small-lms" not in [d.name for d, _ in again.drafts_for("tinybig:latest")]


def test_a_damaged_cache_is_rebuilt(home, tmp_path):
    cache = tmp_path / "models.json"
    cache.write_text("{not json")
    assert any(m.name == "tinybig:latest" for m in Catalog(_where(home), cache=cache).models())
    assert json.loads(cache.read_text())["format"] == catalog_mod.FORMAT


def test_places_follow_the_environment_and_settings(tmp_path, monkeypatch):
    h = tmp_path / "h"
    for d in ("om", "hfh/hub", "hub2", "lc", ".lmstudio", "lmsdl", "extra1", "extra2", "set"):
        (h / d).mkdir(parents=True)
    (h / ".lmstudio" / "settings.json").write_text(json.dumps({"downloadsFolder": str(h / "lmsdl")}))
    env = {"OLLAMA_MODELS": str(h / "om"), "HF_HOME": str(h / "hfh"), "LLAMA_CACHE": str(h / "lc"),
           "EDGESPEC_MODEL_DIRS": os.pathsep.join([str(h / "extra1"), str(h / "extra2")])}
    monkeypatch.setenv("EDGESPEC_DATA_DIR", str(tmp_path / "data"))
    save_setting_dirs([str(h / "set")])
    got = [(p.source, p.root) for p in places(env, h, system=False)]
    assert got == [("ollama", h / "om"), ("lmstudio", h / "lmsdl"), ("hf", h / "hfh" / "hub"), ("llamacpp", h / "lc"),
                   ("folder", h / "extra1"), ("folder", h / "extra2"), ("folder", h / "set")]
    env["HF_HUB_CACHE"] = str(h / "hub2")
    assert ("hf", h / "hub2") in [(p.source, p.root) for p in places(env, h, system=False)]


def test_paths_and_the_default_pair_resolve_as_before(home, tmp_path):
    target = home["target"]
    assert resolve_path(str(target), "target") == target  # a path: as given, no catalog
    assert resolve_spec(str(target), n_ctx=128).path == str(target)
    with pytest.raises(ModelsError, match="model file not found"):
        resolve_path(str(tmp_path / "nope.gguf"), "target")
    cat = Catalog(_where(home), use_cache=False)
    assert resolve_path("tinybig:latest", "target", cat) == cat.find("tinybig:latest").path
    from edgespec.config import ModelSpec

    assert resolve_spec(ModelSpec("small-lms", n_ctx=64), cat).path == str(cat.find("small-lms").path)
    with pytest.raises(UnknownModelError):
        resolve_path("no-such-model", "target", cat)
    with pytest.raises(UnknownModelError, match="close matches: merge"):
        resolve_path("hf:org/repo/merge2.gguf", "target", cat)
    with pytest.raises(ModelsError, match="empty file"):
        resolve_path("empty:latest", "draft", cat)


def test_the_same_file_in_two_places_is_one_model_with_both_names(home, tmp_path):
    lms = home["home"] / ".lmstudio" / "models"
    where = places({"EDGESPEC_MODEL_DIRS": str(lms / "pub")}, home["home"], system=False)
    models = [m for m in Catalog(where, use_cache=False).models() if m.name == "small-lms"]
    assert len(models) == 1 and models[0].names == ["lmstudio:pub/repo/small-lms.gguf", "folder:pub/repo/small-lms.gguf"]


def test_a_measured_curve_ranks_instead_of_the_size_ratio(home, tmp_path, monkeypatch):
    """The cost curve an engine cached for exactly this pair on this machine (calibration.json) replaces the size
    ratio: a draft measured as slow as the target is not expected to pay, so auto takes none."""
    monkeypatch.setenv("EDGESPEC_CACHE_DIR", str(tmp_path / "c"))
    cat = Catalog(_where(home), use_cache=False)
    t, d = cat.find("tinybig:latest"), cat.find("small-lms")
    by_size = catalog_mod.expected_speedup(t, d)
    assert by_size > 1 and catalog_mod.measured_curve(t, d) is None
    key = json.dumps([[str(t.path), t.size, 0, 1, 0, 512], [str(d.path), d.size, 0, 1, 0, 512], [1, 2], "build"])
    slow = {"verify": {str(n): 0.01 * (1 + 0.1 * n) for n in range(1, 10)}, "draft": 0.01, "when": 1.0}
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "calibration.json").write_text(json.dumps({"format": 2, "entries": {key: slow}}))
    assert catalog_mod.measured_curve(t, d) is not None
    assert catalog_mod.expected_speedup(t, d) < 1
    assert [m.name for m, _ in cat.drafts_for(t)][-1] == "small-lms"  # still listed, last
    fast = {**slow, "draft": 0.0005}
    (tmp_path / "c" / "calibration.json").write_text(json.dumps({"format": 2, "entries": {key: fast}}))
    assert catalog_mod.expected_speedup(t, d) > by_size


def test_refresh_sees_models_added_since(home, tmp_path):
    cat = Catalog(_where(home), use_cache=False)
    assert "later" not in {m.name for m in cat.models()}
    write_tiny_model(home["mine"] / "later.gguf", seed=8)
    assert "later" not in {m.name for m in cat.models()}  # as of the first call
    cat.refresh()
    assert cat.find("later").error is None


def test_pair_specs_give_a_target_and_its_best_draft(home, tmp_path):
    cat = Catalog(_where(home), use_cache=False)
    t, d, which = cat.pair_specs("tinybig", n_ctx=256)
    assert t.path == str(cat.find("tinybig:latest").path) and t.n_ctx == 256
    assert which is cat.best_draft("tinybig:latest") and d is not None and d.path == str(which.path)
    t, d, which = cat.pair_specs("merge", draft_kw={"n_ctx": 64})
    assert d is None and which is None


def test_a_file_that_cannot_be_opened_is_one_line(tmp_path, monkeypatch):
    """Tests run as root, which chmod cannot deny: the reader's open is made to fail as it would for another user."""
    import builtins
    import errno

    from edgespec.llama import gguf_check

    (tmp_path / "m").mkdir()
    denied = write_tiny_model(tmp_path / "m" / "denied.gguf", seed=21)
    real_open = builtins.open

    def fake_open(path, *a, **k):
        if str(path) == str(denied):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr(gguf_check, "open", fake_open, raising=False)
    m = Catalog([Place("folder", tmp_path / "m")], use_cache=False).find("denied")
    assert m.error == "cannot read (Permission denied)"
