"""Where GGUF models already live on this machine: Ollama, LM Studio, the Hugging Face hub cache, llama.cpp's cache,
folders the user adds, and edgespec's own cache. Read-only: nothing here writes, copies or moves anything in those
trees; directory symlinks are not followed (file symlinks are, to their file); a broken entry becomes a `Found` with
its `error`, never an exception.

    places(env, home)  the folders to look in, by source (env: os.environ, home: the user's home)
    scan(places)       every model found there, one `Found` each (a split model once, by its first part)
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping

from edgespec.fsutil import read_json_file, read_regular_bytes
from edgespec.paths import data_dir

SOURCES = ("edgespec", "ollama", "lmstudio", "hf", "llamacpp", "folder")
MODEL_DIRS_ENV = "EDGESPEC_MODEL_DIRS"
SETTINGS_FILE = "settings.json"  # in edgespec's data dir: {"model_dirs": [...]}
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY = "registry.ollama.ai"
_MAX_MANIFEST = 1 << 20  # an Ollama manifest is a few hundred bytes
_MAX_SETTINGS = 1 << 20
_SHA256 = re.compile(r"sha256[:-]([0-9a-f]{64})")
_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$", re.IGNORECASE)
_MAX_DEPTH = 8  # folders deeper than this under a root are not walked (publisher/repo/file is 3)


@dataclass(frozen=True)
class Place:
    source: str  # one of SOURCES
    root: Path


@dataclass
class Found:
    """One model found on disk. names: its full names, the first the one shown (e.g. "ollama:qwen2.5-coder:7b");
    paths: the files to load, the first the one llama.cpp opens (a split model: every part, in order); error: why
    it cannot be used (a manifest pointing outside its blobs, a missing split part, a symlink loop), else None."""

    source: str
    names: list[str]
    paths: list[Path]
    error: str | None = None
    base: str = ""  # what its short name is made from (file stem, or Ollama's name:tag)
    aliases: list[str] = field(default_factory=list)


def _env_path(env: Mapping[str, str], key: str) -> Path | None:
    value = env.get(key)
    return Path(value).expanduser() if value else None


def user_dirs(env: Mapping[str, str]) -> list[Path]:
    """The folders the user added: $EDGESPEC_MODEL_DIRS (os.pathsep-separated), then the "model_dirs" setting."""
    out = [Path(p).expanduser() for p in env.get(MODEL_DIRS_ENV, "").split(os.pathsep) if p.strip()]
    return out + [Path(p).expanduser() for p in read_setting_dirs()]


def settings_path() -> Path:
    return data_dir() / SETTINGS_FILE


def read_settings() -> dict:
    """edgespec's settings file, {} when there is none or it cannot be read as a JSON object."""
    try:
        data = read_json_file(settings_path(), _MAX_SETTINGS)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_setting_dirs() -> list[str]:
    dirs = read_settings().get("model_dirs")
    return [d for d in dirs if isinstance(d, str) and d] if isinstance(dirs, list) else []


def _lmstudio_folder(home: Path) -> Path | None:
    """LM Studio's configured models folder (settings.json "downloadsFolder"), if it says one."""
    for settings in (home / ".lmstudio" / "settings.json", home / ".cache" / "lm-studio" / "settings.json"):
        try:
            data = read_json_file(settings, _MAX_SETTINGS)
        except (OSError, ValueError):
            continue
        folder = data.get("downloadsFolder") if isinstance(data, dict) else None
        if isinstance(folder, str) and folder:
            return Path(folder).expanduser()
    return None


def places(env: Mapping[str, str] | None = None, home: Path | None = None, *, system: bool = True,
           own: Path | None = None) -> list[Place]:
    """The folders to look in, in the order their names win a short name: edgespec's cache (`own`), Ollama
    ($OLLAMA_MODELS, else ~/.ollama/models and, with `system`, the Linux service's /usr/share/ollama/.ollama/models),
    LM Studio (its configured folder, ~/.lmstudio/models, ~/.cache/lm-studio/models), the Hugging Face hub cache
    ($HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub), llama.cpp's cache ($LLAMA_CACHE, ~/.cache/llama.cpp),
    the user's folders. Folders that do not exist are left out."""
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    out: list[Place] = []
    if own is not None:
        out.append(Place("edgespec", own))
    ollama = _env_path(env, "OLLAMA_MODELS")
    roots = [ollama] if ollama else [home / ".ollama" / "models"] + ([Path("/usr/share/ollama/.ollama/models")] if system else [])
    out += [Place("ollama", r) for r in roots]
    lms = _lmstudio_folder(home)
    out += [Place("lmstudio", r) for r in ([lms] if lms else []) + [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]]
    hf = _env_path(env, "HF_HUB_CACHE") or ((_env_path(env, "HF_HOME") or home / ".cache" / "huggingface") / "hub")
    out.append(Place("hf", hf))
    out.append(Place("llamacpp", _env_path(env, "LLAMA_CACHE") or home / ".cache" / "llama.cpp"))
    out += [Place("folder", d) for d in user_dirs(env)]
    seen: set[str] = set()
    kept = []
    for p in out:
        try:
            if not p.root.is_dir():
                continue
            real = os.path.realpath(p.root)
        except OSError:
            continue
        if real not in seen:
            seen.add(real)
            kept.append(p)
    return kept


def scan(where: list[Place]) -> list[Found]:
    """Every model in `where`, in the order of the places (files sorted by path within each)."""
    out: list[Found] = []
    for place in where:
        if place.source == "ollama":
            out += _scan_ollama(place.root)
        elif place.source == "hf":
            out += _scan_hf(place.root)
        else:
            out += _scan_folder(place.source, place.root)
    return out


# --------------------------------------------------------------------------------------------- Ollama
def _scan_ollama(root: Path) -> list[Found]:
    manifests, blobs = root / "manifests", root / "blobs"
    out = []
    for path, parts in _walk_files(manifests):
        if len(parts) != 4:  # host/namespace/name/tag
            continue
        host, ns, name, tag = parts
        short = f"{name}:{tag}" if (host, ns) == (OLLAMA_REGISTRY, "library") else (
            f"{ns}/{name}:{tag}" if host == OLLAMA_REGISTRY else f"{host}/{ns}/{name}:{tag}")
        found = Found("ollama", [f"ollama:{short}"], [path], base=short)
        found.error, blob = _ollama_blob(path, blobs)
        if blob is not None:
            found.paths = [blob]
        out.append(found)
    return out


def _ollama_blob(manifest: Path, blobs: Path) -> tuple[str | None, Path | None]:
    """The model layer's blob of an Ollama manifest, or why there is none."""
    try:
        data = read_json_file(manifest, _MAX_MANIFEST)
    except OSError as e:
        return f"manifest cannot be read ({e.strerror or e})", None
    except ValueError:
        return "manifest is not valid JSON", None
    layers = data.get("layers") if isinstance(data, dict) else None
    model = [la for la in layers if isinstance(la, dict) and la.get("mediaType") == OLLAMA_MODEL_LAYER] if isinstance(layers, list) else []
    if not model:
        return "manifest has no model layer (not a GGUF model, or an adapter only)", None
    digest = model[0].get("digest")
    m = _SHA256.fullmatch(digest) if isinstance(digest, str) else None
    if m is None:
        shown = digest[:80] if isinstance(digest, str) else type(digest).__name__
        return f"manifest's model digest {shown!r} is not a sha256 digest: refused (it could point outside {blobs})", None
    blob = blobs / f"sha256-{m.group(1)}"
    if not os.path.lexists(blob):
        return f"its blob {blob} is missing", None
    return None, blob


# --------------------------------------------------------------------------------------------- Hugging Face
def _scan_hf(root: Path) -> list[Found]:
    out = []
    try:
        repos = sorted(e for e in os.listdir(root) if e.startswith("models--"))
    except OSError:
        return []
    for entry in repos:
        repo_dir = root / entry
        org_repo = entry.removeprefix("models--").replace("--", "/")
        main = _read_ref(repo_dir / "refs" / "main")
        snaps = repo_dir / "snapshots"
        try:
            revs = sorted(os.listdir(snaps), key=lambda r: (r != main, r))  # refs/main's revision first
        except OSError:
            continue
        seen: set[str] = set()
        for rev in revs:
            for path, parts in _walk_files(snaps / rev, ".gguf"):
                rel = "/".join(parts)
                if rel in seen:
                    continue  # the same file in an older revision
                seen.add(rel)
                out.append(Found("hf", [f"hf:{org_repo}/{rel}"], [path], base=Path(parts[-1]).stem))
    return [f for f in _group_splits(out) if f.paths[0].name.lower().endswith(".gguf") and not _is_projector(f.paths[0])]


def _read_ref(path: Path) -> str | None:
    try:
        return read_regular_bytes(path, 200).decode("utf-8", "replace").strip() or None  # a FIFO is never waited on
    except OSError:
        return None


# --------------------------------------------------------------------------------------------- plain folders
def _scan_folder(source: str, root: Path) -> list[Found]:
    """*.gguf files anywhere under root (LM Studio's publisher/repo/file, llama.cpp's flat cache, user folders)."""
    prefix = {"lmstudio": "lmstudio:", "llamacpp": "llamacpp:", "edgespec": "edgespec:"}.get(source, "folder:")
    out = []
    for path, parts in _walk_files(root, ".gguf"):
        if _is_projector(path):
            continue
        rel = "/".join(parts)
        if source == "folder":
            rel = f"{root.name}/{rel}"
        out.append(Found(source, [prefix + rel], [path], base=Path(parts[-1]).stem))
    return _group_splits(out)


def _is_projector(path: Path) -> bool:
    """A vision projector (mmproj-*.gguf) is not a language model: not listed."""
    return "mmproj" in path.name.lower()


def _group_splits(found: list[Found]) -> list[Found]:
    """-00001-of-0000N files as one model (its first part, every part in its paths); the others dropped."""
    groups: dict[tuple[str, str, int], dict[int, Found]] = {}
    out: list[Found] = []
    for f in found:
        m = _SPLIT.match(f.paths[0].name)
        if m is None:
            out.append(f)
            continue
        key = (str(f.paths[0].parent), m.group("stem"), int(m.group("n")))
        groups.setdefault(key, {})[int(m.group("i"))] = f
        if int(m.group("i")) == 1:
            f.base = m.group("stem")
            out.append(f)
    for (_, stem, n), parts in groups.items():
        first = parts.get(1)
        if first is None:
            continue  # no first part: nothing llama.cpp could open
        first.paths = [parts[i].paths[0] for i in sorted(parts)]
        missing = [i for i in range(1, n + 1) if i not in parts]
        if missing:
            first.error = f"split model {stem}: part(s) {', '.join(map(str, missing))} of {n} missing"
    return out


def _walk_files(root: Path, suffix: str | None = None) -> Iterator[tuple[Path, list[str]]]:
    """(path, parts relative to root) of every non-directory entry under root (whose name ends with `suffix`, any
    case), sorted; directory symlinks are not followed, entries whose names start with '.' are skipped."""
    try:
        top = os.scandir(root)
    except OSError:
        return
    stack: list[tuple[Path, list[str], list[os.DirEntry]]] = []
    with top:
        stack.append((root, [], sorted(top, key=lambda e: e.name, reverse=True)))
    while stack:
        folder, parts, entries = stack[-1]
        if not entries:
            stack.pop()
            continue
        e = entries.pop()
        if e.name.startswith("."):
            continue
        try:
            is_dir = e.is_dir(follow_symlinks=False)
        except OSError:
            is_dir = False
        if is_dir:
            if len(parts) + 1 >= _MAX_DEPTH:
                continue
            try:
                with os.scandir(e.path) as it:
                    stack.append((Path(e.path), parts + [e.name], sorted(it, key=lambda x: x.name, reverse=True)))
            except OSError:
                continue
        elif suffix is not None and not e.name.lower().endswith(suffix):
            continue
        elif e.is_symlink() and _is_dir_link(e.path):
            continue  # symlinks are followed into files only
        else:
            yield Path(e.path), parts + [e.name]


def _is_dir_link(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:
        return False  # broken or a loop: listed, with its error


def save_setting_dirs(dirs: list[str]) -> Path:
    """Write the "model_dirs" setting (atomically), keeping the file's other settings."""
    from edgespec.fsutil import atomic_write_text

    data = read_settings()
    data["model_dirs"] = dirs
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(data, indent=1) + "\n")
    return path


__all__ = ["SOURCES", "MODEL_DIRS_ENV", "Place", "Found", "places", "scan", "user_dirs", "read_setting_dirs",
           "save_setting_dirs", "settings_path"]
