"""What the model routes list of the pool's models (/v1/models, /api/tags, /api/ps, /api/show of a model not
loaded), `CatalogSource` (every discovered model, with its best draft: what `edgespec serve` uses) and `FolderSource`, the
simplest model source (pool.ModelSource): GGUF files served by their names, drafts given."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from edgespec import errors
from edgespec.config import ModelSpec

from .api_errors import APIError
from .core import ServerState, model_stem
from .pool import NEVER, Held, LoadPlan, ModelEntry, ModelPool, UnknownModelError, close_matches, iso, param_size


class FolderSource:
    """GGUF files served by name: each file named by its stem (`tiny-target.gguf` -> "tiny-target"; "tiny-target:latest"
    reaches it too), from folders (their *.gguf, not recursive) and single files. drafts: a model's name -> the path
    of its draft model (models without one load with the model-free drafters). n_ctx, n_threads, n_gpu_layers: each
    model's ModelSpec's. A file
    whose header cannot be read is still listed (its load fails with the reader's error); headers are read once per
    path, size and mtime."""

    def __init__(self, paths: Iterable[str | os.PathLike[str]], *, drafts: Mapping[str, str | os.PathLike[str]] | None = None,
                 n_ctx: int = 4096, n_threads: int | None = None, n_gpu_layers: int = 0) -> None:
        self.paths = [Path(p) for p in paths]
        self.drafts = {k: str(v) for k, v in (drafts or {}).items()}
        self.n_ctx, self.n_threads, self.n_gpu_layers = n_ctx, n_threads, n_gpu_layers
        self._meta: dict[tuple[str, int, int], dict[str, Any]] = {}  # headers read, by path, size and mtime

    def _files(self) -> dict[str, Path]:
        found: dict[str, Path] = {}
        for p in self.paths:
            files = sorted(p.glob("*.gguf")) if p.is_dir() else [p]
            for f in files:
                found.setdefault(model_stem(str(f)), f)
        return found

    def entries(self) -> list[ModelEntry]:
        from edgespec.llama.gguf_check import inspect_gguf

        out = []
        for name, f in self._files().items():
            try:
                st = f.stat()
            except OSError:
                continue
            key = (str(f), st.st_size, st.st_mtime_ns)
            meta = self._meta.get(key)
            if meta is None:
                try:
                    info = inspect_gguf(str(f))
                    meta = {"family": info.architecture, "parameter_size": param_size(info.n_params),
                            "quantization": info.quantization, "context_length": info.context_length}
                except Exception:  # noqa: BLE001 - listed as it is; its load says what is wrong
                    meta = {}
                self._meta[key] = meta
            draft = self.drafts.get(name)
            out.append(ModelEntry(name=name, aliases=(name + ":latest",), size=st.st_size, modified=st.st_mtime,
                                  draft=model_stem(draft) if draft else None, **meta))
        return out

    def plan(self, name: str) -> LoadPlan:
        files = self._files()
        key = name[: -len(":latest")] if name.endswith(":latest") else name
        if key not in files:
            raise UnknownModelError(name, close_matches(name, files))
        draft = self.drafts.get(key)

        def spec(p: str) -> ModelSpec:
            return ModelSpec(p, n_ctx=self.n_ctx, n_threads=self.n_threads, n_gpu_layers=self.n_gpu_layers)

        return LoadPlan(key, spec(str(files[key])), spec(draft) if draft else None)


REFRESH_S = 10.0  # an unknown name makes the catalog look on disk again, at most this often


class CatalogSource:
    """Every model discovery finds (edgespec.models.Catalog: edgespec's cache, Ollama, LM Studio, the Hugging Face and
    llama.cpp caches, the user's folders; docs/models.md) served by its names, each loaded with its best draft
    (Catalog.best_draft: same tokenizer, checked; expected to pay on this machine) or none. Only discovered models are
    served: a request cannot name a file path (the server never opens one for it); a name it does not know makes the
catalog look on disk again (models pulled since), at most every REFRESH_S. n_ctx, n_threads, n_gpu_layers: each model's ModelSpec's."""

    def __init__(self, catalog: Any, *, n_ctx: int = 4096, n_threads: int | None = None, n_gpu_layers: int = 0) -> None:
        self.catalog = catalog
        self.n_ctx, self.n_threads, self.n_gpu_layers = n_ctx, n_threads, n_gpu_layers
        self._looked = time.monotonic()  # when the catalog last looked on disk

    def entries(self) -> list[ModelEntry]:
        out = []
        for m in self.catalog.models():
            if m.error:
                continue  # `edgespec models list` says why; a request naming it is a 404 with the close matches
            try:
                modified = m.path.stat().st_mtime
            except OSError:
                continue
            draft = self.catalog.best_draft(m)
            digest = m.path.name[len("sha256-"):] if m.source == "ollama" and m.path.name.startswith("sha256-") else ""
            out.append(ModelEntry(name=m.name, aliases=tuple(n for n in m.names if n != m.name), size=m.size,
                                  family=m.architecture or "", parameter_size=param_size(m.parameters) if m.parameters else "",
                                  quantization=m.quantization or "", modified=modified, digest=digest,
                                  context_length=m.context_length, draft=draft.name if draft is not None else None))
        return out

    def plan(self, name: str) -> LoadPlan:
        try:
            found = self.catalog.find(name, paths=False)  # names only: a request never makes the server open a path
        except errors.UnknownModelError:
            if time.monotonic() - self._looked < REFRESH_S:
                raise
            self._looked = time.monotonic()  # pulled since the server started? look again (at most every REFRESH_S)
            self.catalog.refresh()
            found = self.catalog.find(name, paths=False)
        kw = {"n_ctx": self.n_ctx, "n_threads": self.n_threads, "n_gpu_layers": self.n_gpu_layers}
        target, draft, _ = self.catalog.pair_specs(found, **kw)
        return LoadPlan(found.name, target, draft)


def _entries(state: ServerState) -> list[ModelEntry]:
    pool: ModelPool | None = state.pool
    if pool is None:
        return []
    try:
        return pool.entries()
    except Exception as e:  # noqa: BLE001 - a source that cannot list: the pinned model still answers
        raise APIError(500, f"the model list could not be read: {type(e).__name__}: {e}", code="model_list_failed") from None


def openai_cards(state: ServerState) -> list[dict[str, Any]]:
    """/v1/models' cards of the pool's models (the pinned one's comes first, from routes_openai.model_card)."""
    pool: ModelPool = state.pool
    out = []
    for e in _entries(state):
        held = pool.get(e.name)
        meta = {"size": e.size, "family": e.family, "parameter_size": e.parameter_size, "quantization": e.quantization,
                "n_ctx_train": e.context_length, "aliases": list(e.aliases), "draft": e.draft, "loaded": held is not None}
        out.append({"id": e.name, "object": "model", "created": int(e.modified), "owned_by": "edgespec", "meta": meta})
    return out


def ollama_name(name: str) -> str:
    return name if ":" in name else name + ":latest"


def ollama_details(e: ModelEntry) -> dict[str, Any]:
    return {"parent_model": "", "format": "gguf", "family": e.family, "families": [e.family] if e.family else None,
            "parameter_size": e.parameter_size, "quantization_level": e.quantization}


def ollama_tags(state: ServerState) -> list[dict[str, Any]]:
    """/api/tags' entries for the pool's models."""
    return [{"name": ollama_name(e.name), "model": ollama_name(e.name), "modified_at": iso(e.modified), "size": e.size,
             "digest": e.digest, "details": ollama_details(e)} for e in _entries(state)]


def ollama_ps(state: ServerState) -> list[dict[str, Any]]:
    """/api/ps' entries for the models the pool holds, with when each unloads."""
    pool: ModelPool | None = state.pool
    if pool is None:
        return []
    entries = {e.name: e for e in _entries(state)}
    out = []
    for h in pool.loaded():
        e = entries.get(h.name) or ModelEntry(h.name, size=h.engine.target.info.file_size)
        expires = h.expires()
        out.append({"name": ollama_name(h.name), "model": ollama_name(h.name), "size": e.size, "digest": e.digest,
                    "details": ollama_details(e), "expires_at": NEVER if expires is None else iso(expires), "size_vram": 0,
                    "context_length": h.engine.target.n_ctx, "draft": h.draft})
    return out


def entry(state: ServerState, name: str) -> ModelEntry | None:
    """The pool's entry named `name` (or by one of its aliases)."""
    for e in _entries(state):
        if name == e.name or name in e.aliases or name == ollama_name(e.name):
            return e
    return None


__all__ = ["FolderSource", "CatalogSource", "openai_cards", "ollama_tags", "ollama_ps", "ollama_name",
           "ollama_details", "entry", "Held", "LoadPlan", "UnknownModelError", "close_matches"]
