"""The models on this machine by name: what discover found, read from each file's header (edgespec's own reader,
headers only), cached by path, size and mtime; the drafts that share each target's tokenizer, ranked by the speedup
they can be expected to give.

    Catalog()                    models(), find(name_or_path), drafts_for(target), best_draft(target), spec(d),
                                 pair_specs(name) (a target and its best draft, as a server loads them), refresh()
    resolve_path(name, role)     what --target/--draft NAME loads: a path as before, a pair or manifest file name as
                                 before (store.resolve_model), else a discovered model's name
    resolve_spec(spec_or_name)   the same for the API: a ModelSpec whose path is a name gets the model's path

The cache (`models.json` in the user cache dir) is advisory: written atomically, rebuilt when unreadable.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import stat
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgespec.config import ModelSpec
from edgespec.errors import EdgespecError, ModelsError, UnknownModelError
from edgespec.fsutil import atomic_write_text, read_json_file
from edgespec.paths import cache_dir

from .discover import SOURCES, Found, Place, places, scan
from .manifest import find_file, load_manifests
from .store import models_dir, resolve_model

FORMAT = 2
_MAX_CACHE = 64 * 1024 * 1024
# Expected acceptance per drafted token, from the parameter ratio r = target/draft (an estimate for ranking only:
# a measured curve replaces the cost side, nothing measures acceptance before a run).
ACCEPT_AT_RATIO_1 = 0.85
ACCEPT_PER_LOG_RATIO = 0.08
MAX_K = 8


@dataclass
class Discovered:
    """A model on this machine. name: short and unique among the discovered models; names: its full names
    (``ollama:qwen2.5-coder:7b``, ``lmstudio:publisher/repo/file.gguf``, ``hf:org/repo/file.gguf``, ...);
    paths: its files (a split model: every part, the first the one to load); tokenizer: its tokenizer family
    (gguf_check.tokenizer_family; "" when unreadable); error: why it cannot be loaded, else None."""

    name: str
    names: list[str]
    source: str
    paths: list[Path]
    size: int = 0
    architecture: str | None = None
    parameters: int = 0
    quantization: str | None = None
    context_length: int | None = None
    tokenizer: str = ""
    tokens: str = ""  # sha256 of the token list's bytes in the file
    vocab_size: int = 0
    label: str | None = None  # general.name
    error: str | None = None
    key: str = field(default="", repr=False)  # path|size|mtime of the first part: the cache's key
    ident: tuple[int, int] = field(default=(0, 0), repr=False)  # (device, inode) of the first part's file

    @property
    def path(self) -> Path:
        return self.paths[0]

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "names": self.names, "source": self.source, "path": str(self.path),
                "parts": len(self.paths), "size": self.size, "architecture": self.architecture,
                "parameters": self.parameters, "quantization": self.quantization,
                "context_length": self.context_length, "tokenizer": self.tokenizer, "vocab_size": self.vocab_size,
                "error": self.error}


class Catalog:
    """The discovered models. `where`: the places to look (default: discover.places() and edgespec's own cache);
    `cache`: the JSON cache file (default: models.json in the user cache dir; None with use_cache=False)."""

    def __init__(self, where: list[Place] | None = None, *, cache: Path | None = None, use_cache: bool = True) -> None:
        self._where = where
        self._cache_path = (cache or cache_dir() / "models.json") if use_cache else None
        self._models: list[Discovered] | None = None
        self._table: dict[str, Any] = {"format": FORMAT, "files": {}, "pairs": {}}
        self._dirty = False
        self._lock = threading.RLock()  # a server asks from several threads

    # ----------------------------------------------------------------------------------------- listing
    def models(self) -> list[Discovered]:
        """Every model found, as of the first call (or the last refresh)."""
        with self._lock:
            if self._models is None:
                where = self._where if self._where is not None else places(own=models_dir())
                self._table = self._read_table()
                models = _merge_same_files([self._describe(f) for f in scan(where)])
                _short_names(models)
                self._models = models
                self._save()
            return self._models

    def refresh(self) -> None:
        """Look again on the next call (a long-running server: models pulled or removed since)."""
        with self._lock:
            self._models = None

    def find(self, name_or_path: str | os.PathLike[str], *, paths: bool = True) -> Discovered:
        """The model a name (short or full) or a path means (paths=False: names only, no file is looked at: what a
        server asks); UnknownModelError with the close matches when none."""
        with self._lock:  # the cache's table is written here too (a path's header), and a server asks from threads
            return self._find(os.fspath(name_or_path), paths)

    def _find(self, text: str, paths: bool) -> Discovered:
        models = self.models()
        exact = {n: m for m in models for n in (m.name, *m.names)}
        if text in exact:
            return exact[text]
        folded = {n.lower(): m for n, m in exact.items()}
        for cand in (text.lower(), text.lower() + ":latest", "ollama:" + text.lower(), "ollama:" + text.lower() + ":latest"):
            if cand in folded:
                return folded[cand]
        p = Path(text).expanduser()
        try:
            real = os.path.realpath(p) if paths and p.is_file() else None
        except OSError:
            real = None
        if real is not None:
            for m in models:
                if not m.error and os.path.realpath(m.path) == real:
                    return m
            d = self._describe(Found("path", [str(p)], [p], base=p.stem))
            d.name = str(p)
            return d
        near = difflib.get_close_matches(text, list(exact), n=10, cutoff=0.5)
        near += [n for n in exact if text and text.lower() in n.lower()]
        close: list[str] = []  # one name per model, its short one
        for n in near:
            if exact[n].name not in close:
                close.append(exact[n].name)
        close = close[:5]
        hint = f"; close matches: {', '.join(close)}" if close else "; `edgespec models list` shows the names"
        raise UnknownModelError(f"no model named '{text[:120]}'{hint}", close)

    # ----------------------------------------------------------------------------------------- pairing
    def drafts_for(self, target: Discovered | str) -> list[tuple[Discovered, float]]:
        """The discovered models that can draft for `target` (same tokenizer family, check_pair passes, fewer
        parameters), each with its expected speedup over the target alone, best first (below 1: slower here)."""
        with self._lock:
            return self._drafts_for(target if isinstance(target, Discovered) else self.find(target))

    def _drafts_for(self, t: Discovered) -> list[tuple[Discovered, float]]:
        if t.error or not t.tokenizer:
            return []
        out = []
        for d in self.models():
            if d is t or d.error or d.tokenizer != t.tokenizer or not (0 < d.parameters < t.parameters):
                continue
            if d.ident == t.ident or not self._compatible(t, d):
                continue
            out.append((d, expected_speedup(t, d)))
        out.sort(key=lambda pair: (-pair[1], pair[0].name))
        with self._lock:
            self._save()
        return out

    def best_draft(self, target: Discovered | str) -> Discovered | None:
        """The first of drafts_for when it is expected to be faster than the target alone, else None."""
        return best_of(self.drafts_for(target))

    def pairs(self) -> list[tuple[Discovered, list[tuple[Discovered, float]]]]:
        """Every usable target with its ranked drafts (targets with none included)."""
        return [(t, self.drafts_for(t)) for t in self.models() if not t.error]

    def _compatible(self, t: Discovered, d: Discovered) -> bool:
        """gguf_check.check_pair on the two files (token text id by id, BOS/EOS), cached by both files' keys; two
        files with the same token digest need no reading."""
        if t.tokens and t.tokens == d.tokens:
            return True
        key = json.dumps([t.key, d.key])
        cached = self._table["pairs"].get(key)
        if isinstance(cached, bool):
            return cached
        from edgespec.llama.gguf_check import check_pair

        try:
            ok = check_pair(_full_info(t.paths), _full_info(d.paths)).ok
        except (EdgespecError, OSError, ValueError, KeyError, TypeError):
            ok = False
        self._table["pairs"][key] = ok
        self._dirty = True
        return ok

    # ----------------------------------------------------------------------------------------- loading
    def spec(self, model: Discovered | str, **kw: Any) -> ModelSpec:
        """The ModelSpec that loads `model` (kw: ModelSpec's other fields); ModelsError when it cannot be loaded."""
        m = model if isinstance(model, Discovered) else self.find(model)
        if m.error:
            raise ModelsError(f"{m.name}: {m.error}")
        return ModelSpec(str(m.path), **kw)

    def pair_specs(self, model: Discovered | str, draft_kw: dict[str, Any] | None = None,
                   **kw: Any) -> tuple[ModelSpec, ModelSpec | None, Discovered | None]:
        """What a server loads for a request naming `model`: the target's ModelSpec (kw), its best draft's
        (draft_kw, default kw) or None, and that draft."""
        m = model if isinstance(model, Discovered) else self.find(model)
        target = self.spec(m, **kw)
        d = self.best_draft(m)
        return target, (self.spec(d, **(kw if draft_kw is None else draft_kw)) if d is not None else None), d

    # ----------------------------------------------------------------------------------------- the cache
    def _describe(self, f: Found) -> Discovered:
        d = Discovered(name=f.base, names=list(f.names), source=f.source, paths=list(f.paths), error=f.error)
        if f.error:
            return d
        try:
            st = [os.stat(p) for p in f.paths]
        except OSError as e:
            d.error = _stat_error(f.paths[0], e)
            return d
        d.size = sum(s.st_size for s in st)
        d.ident = (st[0].st_dev, st[0].st_ino)
        d.key = f"{os.path.abspath(f.paths[0])}|{st[0].st_size}|{st[0].st_mtime_ns}|{len(f.paths)}"
        rec = self._table["files"].get(d.key)
        if not isinstance(rec, dict):
            rec = _read_record(f.paths)
            self._table["files"][d.key] = rec
            self._dirty = True
        _apply_record(d, rec)
        return d

    def _read_table(self) -> dict[str, Any]:
        empty = {"format": FORMAT, "files": {}, "pairs": {}}
        if self._cache_path is None:
            return empty
        try:
            data = read_json_file(self._cache_path, _MAX_CACHE)
        except (OSError, ValueError):
            return empty
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("files"), dict) \
                or not isinstance(data.get("pairs"), dict):
            return empty
        return data

    def _save(self) -> None:
        if not self._dirty or self._cache_path is None:
            return
        live = {m.key for m in self._models or [] if m.key}
        files = {k: v for k, v in self._table["files"].items() if k in live}
        pairs = {k: v for k, v in self._table["pairs"].items() if _pair_live(k, live)}
        try:
            self._cache_path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self._cache_path, json.dumps({"format": FORMAT, "files": files, "pairs": pairs}))
        except OSError:
            return  # advisory: read again next time
        self._dirty = False


def best_of(ranked: list[tuple[Discovered, float]]) -> Discovered | None:
    """The draft to use from Catalog.drafts_for's ranking: the first, when it is expected to be faster than the target
    alone; else None."""
    return ranked[0][0] if ranked and ranked[0][1] > 1.0 else None


def _pair_live(key: str, live: set[str]) -> bool:
    try:
        t, d = json.loads(key)
    except (ValueError, TypeError):
        return False
    return t in live and d in live


def _stat_error(path: Path, e: OSError) -> str:
    import errno

    if e.errno == errno.ELOOP:
        return "symlink loop (the path cannot be resolved)"
    if e.errno == errno.ENOENT:
        return "broken symlink or missing file"
    return f"cannot read ({e.strerror or e})"


def _read_record(paths: list[Path]) -> dict[str, Any]:
    """What the catalog keeps of a model's header, or {"error": one line}."""
    from edgespec.llama.gguf_check import tokenizer_family

    try:
        info = _full_info(paths)
    except EdgespecError as e:
        return {"error": _strip_path(str(e), paths[0])}
    except OSError as e:
        return {"error": f"cannot read ({e.strerror or e})"}
    except (ValueError, KeyError, TypeError, MemoryError, OverflowError) as e:
        return {"error": f"damaged GGUF header ({type(e).__name__}: {str(e)[:120]})"}
    return {"architecture": info.architecture, "parameters": info.n_params, "quantization": info.quantization,
            "context_length": info.context_length, "tokenizer": tokenizer_family(info),
            "tokens": info.tokenizer_digests.get("tokenizer.ggml.tokens", ""), "vocab_size": info.vocab_size,
            "label": info.name}


def _strip_path(message: str, path: Path) -> str:
    for p in (str(path), os.path.realpath(path)):
        if message.startswith(p + ": "):
            return message[len(p) + 2:]
    return message


def _full_info(paths: list[Path]) -> Any:
    """gguf_check's GGUFInfo of a model: inspect_gguf (every check) for one file; for a split model the first
    part's header with the parameters of every part (the rules need every tensor, spread over the parts)."""
    from edgespec.errors import ModelFileError
    from edgespec.llama.gguf_check import header_info, inspect_gguf, read_header

    if len(paths) == 1:
        return inspect_gguf(paths[0])
    try:
        inspect_gguf(paths[0])  # the checks on the path itself (a FIFO is never opened); the rules fail on a part
    except ModelFileError as e:
        if "tensor" not in str(e):
            raise
    for p in paths[1:]:
        if not stat.S_ISREG(os.stat(p).st_mode):  # a FIFO is never opened
            raise ModelFileError(f"{p}: split part is not a regular file")
    try:
        headers = [read_header(p) for p in paths]
        first = header_info(paths[0], headers[0])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelFileError(f"{paths[0]}: split model header cannot be read ({type(e).__name__})") from None
    except Exception as e:  # noqa: BLE001 - the reader's own truncation signal
        raise ModelFileError(f"{paths[0]}: a split part is truncated ({type(e).__name__})") from None
    first.n_params = sum(math.prod(t.dims) for h in headers for t in h.tensors)
    first.file_size = sum(h.file_size for h in headers)
    return first


def _apply_record(d: Discovered, rec: dict[str, Any]) -> None:
    if rec.get("error"):
        d.error = str(rec["error"])
        return
    d.architecture = rec.get("architecture")
    d.parameters = int(rec.get("parameters") or 0)
    d.quantization = rec.get("quantization")
    d.context_length = rec.get("context_length")
    d.tokenizer = str(rec.get("tokenizer") or "")
    d.tokens = str(rec.get("tokens") or "")
    d.vocab_size = int(rec.get("vocab_size") or 0)
    d.label = rec.get("label")


def _merge_same_files(models: list[Discovered]) -> list[Discovered]:
    """One entry per file: a model seen in two places (a folder added that is LM Studio's) keeps the first's
    source and gets the other's names."""
    seen: dict[tuple[int, int], Discovered] = {}
    out = []
    for m in models:
        first = seen.get(m.ident) if m.key else None
        if first is not None:
            first.names += [n for n in m.names if n not in first.names]
            continue
        if m.key:
            seen[m.ident] = m
        out.append(m)
    return out


def _short_names(models: list[Discovered]) -> None:
    """Each model's short name: its base (file stem, Ollama's name:tag) when no other model has it, else
    source:base when that is unique, else its first full name."""
    count: dict[str, int] = {}
    for m in models:
        count[m.name.lower()] = count.get(m.name.lower(), 0) + 1
    tagged: dict[str, int] = {}
    for m in models:
        if count[m.name.lower()] > 1:
            t = f"{m.source}:{m.name}".lower()
            tagged[t] = tagged.get(t, 0) + 1
    for m in models:
        if count[m.name.lower()] > 1:
            t = f"{m.source}:{m.name}"
            m.name = t if tagged[t.lower()] == 1 and t not in m.names else m.names[0]


# --------------------------------------------------------------------------------------------- ranking
def expected_speedup(target: Discovered, draft: Discovered, curve: tuple[dict[int, float], float] | None = None) -> float:
    """Tokens per second with `draft` over the target alone, at the best draft length k (1..MAX_K): expected
    accepted tokens per cycle (1 - a^(k+1)) / (1 - a) over the cycle's cost in target tokens (k draft tokens and
    one verify of k+1). The acceptance a is an estimate from the parameter ratio; the costs are the cached measured
    curve when one exists for this pair on this machine (drafting/calibration), else the size ratio."""
    curve = curve if curve is not None else measured_curve(target, draft)
    ratio = max(target.parameters / max(draft.parameters, 1), 1.0)
    a = min(0.95, max(0.3, ACCEPT_AT_RATIO_1 - ACCEPT_PER_LOG_RATIO * math.log(ratio)))
    best = 0.0
    for k in range(1, MAX_K + 1):
        tokens = (1 - a ** (k + 1)) / (1 - a)
        if curve is not None:
            verify, draft_s = curve
            n = min((s for s in verify if s >= k + 1), default=max(verify))
            cost = (k * draft_s + verify[n] * max(1.0, (k + 1) / n)) / verify[1]
        else:
            cost = 1 + k * (draft.size / max(target.size, 1))
        best = max(best, tokens / cost)
    return round(best, 3)


def measured_curve(target: Discovered, draft: Discovered) -> tuple[dict[int, float], float] | None:
    """The verify curve ({n: seconds}) and draft seconds per token that the engine measured and cached for exactly
    these two files on this machine (calibration.json in the user cache dir, drafting/calibration's table, read
    here as data: this wing does not import drafting), if any."""
    try:
        entries = read_json_file(cache_dir() / "calibration.json", 16 * 1024 * 1024).get("entries", {})
        want = [[os.path.abspath(m.path), os.stat(m.path).st_size] for m in (target, draft)]
    except (OSError, ValueError, AttributeError):
        return None
    for key, entry in entries.items() if isinstance(entries, dict) else ():
        try:
            t, d = json.loads(key)[:2]
            if d is None or [t[0], t[1]] != want[0] or [d[0], d[1]] != want[1]:
                continue
            verify = {int(n): float(v) for n, v in entry["verify"].items()}
            draft_s = float(entry["draft"])
        except (ValueError, TypeError, IndexError, KeyError, AttributeError):
            continue
        if 1 in verify and all(0 < v < 60 for v in verify.values()) and 0 < draft_s < 60:
            return verify, draft_s
    return None


# --------------------------------------------------------------------------------------------- names everywhere
def is_catalog_name(name: str) -> bool:
    """Not a path the old rules resolve: not an existing file, a known pair or a manifest file name."""
    if Path(name).expanduser().is_file():
        return False
    pairs = load_manifests()
    return name not in pairs and find_file(name, pairs) is None


def resolve_path(name: str | os.PathLike[str] | None, role: str, catalog: Catalog | None = None) -> Path:
    """What a --target/--draft value loads: None, a path, a pair name or a manifest file name as
    store.resolve_model always did; any other name, the discovered model it names (UnknownModelError with close
    matches when none does; ModelsError when that model cannot be loaded)."""
    if name is None:
        return resolve_model(None, role)
    text = os.fspath(name)
    try:
        if not is_catalog_name(text):
            return resolve_model(text, role)
    except OSError:
        return resolve_model(text, role)
    try:
        m = (catalog or Catalog()).find(text)
    except UnknownModelError as e:
        named = text.split(":", 1)[0] in SOURCES  # a full name's source prefix
        if not named and (os.sep in text or "/" in text or text.lower().endswith(".gguf")):
            return resolve_model(text, role)  # a missing file: the message it always had
        raise _with_pairs(text, e.close_matches) from None
    if m.error:
        raise ModelsError(f"{m.name}: {m.error}")
    return m.path


def _with_pairs(text: str, found: list[str]) -> UnknownModelError:
    """An unknown name's error, its close matches from the discovered models (`found`) and the known pairs."""
    close = (difflib.get_close_matches(text, list(load_manifests()), n=3, cutoff=0.5) + found)[:5]
    hint = f"close matches: {', '.join(close)}" if close else "`edgespec models list` shows the names"
    return UnknownModelError(f"no model named '{text[:120]}' (not a file, a pair or a model found on this machine); {hint}", close)


def resolve_spec(model: ModelSpec | str | os.PathLike[str], catalog: Catalog | None = None, **kw: Any) -> ModelSpec:
    """A ModelSpec for Engine.load from a spec whose path may be a name, or from a name or path (kw: ModelSpec's
    other fields)."""
    if isinstance(model, ModelSpec):
        return replace(model, path=str(resolve_path(model.path, "target", catalog)))
    return ModelSpec(str(resolve_path(model, "target", catalog)), **kw)


__all__ = ["Catalog", "Discovered", "expected_speedup", "measured_curve", "resolve_path", "resolve_spec",
           "is_catalog_name"]
