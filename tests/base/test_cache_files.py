"""Files that are not what they should be where the cache expects one (issue 20, item 3): a FIFO, a folder, a device,
a symlink loop, 100,000-deep JSON, a 5,000-digit or infinite number. Never a hang (a FIFO is never opened for a
blocking read: the risky cases run in a child process with a timeout), never a traceback; a cache is dropped and
rebuilt with one warning, a user file refused with one line."""

from __future__ import annotations

import json
import os
import warnings

import pytest

from edgespec.errors import ModelsError
from edgespec.fsutil import MAX_JSON_NUMBER_DIGITS, clear_odd_file, loads_json, read_regular_bytes

from support.odd_files import BAD_JSON, ODD, make_odd
from support.shared import run_child

IN_PROCESS = ODD[1:]  # a FIFO only in a child process: a regression there would hang, not fail


# --------------------------------------------------------------------------------------------- fsutil
@pytest.mark.parametrize("kind", IN_PROCESS)
def test_read_regular_bytes_refuses_what_is_not_a_file_without_waiting(tmp_path, kind):
    p = make_odd(tmp_path / "x", kind)
    with pytest.raises(OSError):
        read_regular_bytes(p, 1 << 20)


def test_read_regular_bytes_limits(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"x" * 100)
    assert read_regular_bytes(p, 100) == b"x" * 100
    with pytest.raises(OSError, match="larger than 99 bytes"):
        read_regular_bytes(p, 99)
    with pytest.raises(OSError, match="NUL"):
        read_regular_bytes(str(tmp_path / "a\x00b"), 10)


@pytest.mark.parametrize("name", list(BAD_JSON))
def test_loads_json_refuses_with_a_value_error(name):
    with pytest.raises(ValueError):
        loads_json(BAD_JSON[name])


def test_loads_json_accepts_ordinary_json():
    assert loads_json('{"a": [1, -2.5e3, "x", null, true], "b": ' + "9" * MAX_JSON_NUMBER_DIGITS + "}")["a"] == [1, -2500.0, "x", None, True]


@pytest.mark.parametrize("kind", IN_PROCESS)
def test_clear_odd_file_removes_what_is_not_a_file(tmp_path, kind):
    p = make_odd(tmp_path / "x", kind)
    assert clear_odd_file(p) and not os.path.lexists(p)
    p.write_text("ok")
    assert not clear_odd_file(p) and p.read_text() == "ok"  # a regular file stays
    assert not clear_odd_file(tmp_path / "missing")
    full = tmp_path / "full"
    (full / "inside").mkdir(parents=True)
    assert not clear_odd_file(full) and (full / "inside").is_dir()  # a folder with contents is never removed


# --------------------------------------------------------------------------------------------- the caches, in a child
def test_every_cache_file_that_is_not_a_file_is_dropped_in_a_child_process(tmp_path):
    """Each cache reader on each odd kind: no hang (timeout), no traceback, an empty result or a one-line error."""
    p = run_child(f"""
        import os, warnings
        from pathlib import Path
        from edgespec.drafting import calibration as cal
        from edgespec.drafting.suffix_index import SuffixIndex
        from edgespec.models import manifest, store
        from edgespec.models.locks import try_lock
        from edgespec.errors import ModelsError
        from support.odd_files import make_odd, ODD, BAD_JSON
        from edgespec.fsutil import read_json_file, read_regular_bytes, clear_odd_file
        warnings.simplefilter("ignore")
        base = Path({str(tmp_path)!r})
        fifo = make_odd(base / "plain.fifo", "a FIFO")
        for reader in (lambda: read_regular_bytes(fifo, 10), lambda: read_json_file(fifo, 10)):
            try:
                reader()
                raise SystemExit("a FIFO was read")
            except OSError as e:
                assert "not a regular file" in str(e)
        assert clear_odd_file(fifo) and not fifo.exists()
        for i, kind in enumerate(ODD + tuple(BAD_JSON)):
            d = base / f"case{{i}}"
            def put(path):
                if kind in BAD_JSON:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    data = BAD_JSON[kind]
                    path.write_bytes(data if isinstance(data, bytes) else data.encode())
                else:
                    make_odd(path, kind)
                return path
            assert cal._read_table(put(d / "calibration.json")) == {{}}, kind
            assert len(SuffixIndex.load(put(d / "memory.idx"), vocab="v")._docs) == 0, kind
            try:
                manifest._parse_manifest(put(d / "m" / "pair.json"))
                raise SystemExit(f"manifest {{kind}} accepted")
            except ModelsError as e:
                assert "\\n" not in str(e), kind
            model = d / "model.gguf"
            model.write_bytes(b"x" * 10)
            put(d / "model.gguf.verified")
            mf = store.ModelFile(role="target", file="model.gguf", size=10, sha256="0" * 64, parts=())
            assert store._check(model, mf) == store.NO_RECORD, kind
            assert store.write_record(model, "0" * 64) and store._check(model, mf) is None, kind  # rebuilt
            if kind in ODD:
                with try_lock(put(d / ".locks" / "model.gguf.lock")) as got:
                    assert got, kind
                assert (d / ".locks" / "model.gguf.lock").is_file(), kind
        print("ALL HELD")
    """, support=True)
    assert p.returncode == 0 and "ALL HELD" in p.stdout, (p.returncode, p.stdout[-1000:], p.stderr[-3000:])
    assert "Traceback" not in p.stderr


def test_the_calibration_cache_is_rebuilt_with_one_warning(tmp_path, monkeypatch):
    from edgespec.drafting import calibration as cal

    monkeypatch.setenv("EDGESPEC_CACHE_DIR", str(tmp_path))
    path = cal.cache_path()
    make_odd(path, "a directory")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert cal._read_table(path) == {}
    assert len(seen) == 1 and "ignoring the calibration cache" in str(seen[0].message) and "\n" not in str(seen[0].message)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    key = json.dumps([[str(model)], None])  # entries whose model file is gone are pruned
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal.store(key, cal.Calibration({1: 0.01, 2: 0.015}, 0.0, "measured"))
    assert path.is_file() and key in json.loads(path.read_text())["entries"]  # rebuilt in place of the folder
    bad = {"verify": {"1": 0.01}, "draft": 0, "when": 1e9, "used": "x"}
    path.write_text(json.dumps({"format": cal.FORMAT, "entries": {key: bad}}))
    cal.store(json.dumps([[str(model)], 1]), cal.Calibration({1: 0.01}, 0.0, "measured"))  # a malformed "used": dropped
    assert list(json.loads(path.read_text())["entries"]) == [json.dumps([[str(model)], 1])]


def test_the_suffix_memory_in_the_cache_is_rebuilt_and_a_user_path_refused(tiny, tmp_path, monkeypatch):
    from edgespec import Engine, ModelSpec
    from edgespec.runtime.engine import vocab_fingerprint
    from edgespec.errors import ConfigError
    from edgespec.drafting.suffix_index import default_path

    monkeypatch.setenv("EDGESPEC_CACHE_DIR", str(tmp_path / "cache"))
    spec = ModelSpec(str(tiny["target"]), n_ctx=256, n_threads=1)
    fifo = make_odd(tmp_path / "mine.fifo", "a FIFO")
    with pytest.raises(ConfigError, match="not a regular file"):
        Engine.load(spec, drafter="suffix", memory=fifo, calibrate_costs=False)
    eng = Engine.load(spec, drafter="suffix", memory=False, calibrate_costs=False)
    where = default_path(vocab_fingerprint(eng.target))
    eng.close()
    make_odd(where, "a symlink loop")  # (a FIFO there: the child-process test above)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        eng = Engine.load(spec, drafter="suffix", memory=True, calibrate_costs=False)
    assert len(seen) == 1 and "ignoring the suffix index" in str(seen[0].message)
    eng.remember("abcabc abcabc abcabc")
    eng.close()
    assert where.is_file()  # rebuilt at close


def test_a_manifest_that_is_not_a_file_is_one_line(tmp_path):
    from edgespec.models.manifest import _parse_manifest

    for kind in ("a directory", "a symlink loop", "a device"):
        p = make_odd(tmp_path / kind.replace(" ", "-") / "pair.json", kind)
        with pytest.raises(ModelsError) as e:
            _parse_manifest(p)
        assert "\n" not in str(e.value)


def test_a_lock_that_cannot_be_made_is_a_models_error(tmp_path):
    from edgespec.models.locks import lock

    p = tmp_path / ".locks" / "m.gguf.lock"
    (p / "inside").mkdir(parents=True)
    with pytest.raises(ModelsError, match="cannot use the lock"):
        with lock(p):
            pass

