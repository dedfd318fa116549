"""Fake model trees for discovery tests: an Ollama store, LM Studio, Hugging Face and llama.cpp caches and a user
folder in a temporary home, holding tiny GGUFs (support.tiny) and hostile entries (a manifest pointing outside its
blobs, a 0-byte blob, a truncated file, a directory where a blob belongs, a symlink loop, a 2 GB sparse file with a bad header, a
FIFO). Tests run as root, where permissions deny nothing: the FIFO and the directory stand in for unreadable files."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .tiny import MERGES, write_tiny_model, write_truncated_copy

BIG = {"d_model": 64, "d_ff": 128, "n_layers": 4}  # a target: 5x the parameters of a default tiny model


def write_ollama(root: Path, name: str, tag: str, blob_src: Path | None, *, ns: str = "library", digest: str | None = None) -> Path:
    """An Ollama manifest for name:tag whose model layer is blob_src's bytes (stored as blobs/sha256-<hex>)."""
    if digest is None:
        assert blob_src is not None
        data = blob_src.read_bytes()
        hexd = hashlib.sha256(data).hexdigest()
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        (root / "blobs" / f"sha256-{hexd}").write_bytes(data)
        digest = f"sha256:{hexd}"
    m = root / "manifests" / "registry.ollama.ai" / ns / name / tag
    m.parent.mkdir(parents=True, exist_ok=True)
    m.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.license", "digest": "sha256:" + "0" * 64},
        {"mediaType": "application/vnd.ollama.image.model", "digest": digest}]}))
    return m


def write_model_trees(tmp_path: Path) -> dict[str, Path]:
    """A fake home with every kind of tree; the files it made, by role."""
    h = tmp_path / "home"
    src = tmp_path / "src"
    src.mkdir()
    target = write_tiny_model(src / "target.gguf", seed=1, name="tiny-big", **BIG)
    draft = write_tiny_model(src / "draft.gguf", seed=2, name="tiny-small")
    other_merge = write_tiny_model(src / "merge.gguf", seed=3, name="tiny-merge", merges=[*MERGES[:-1], "o n"])
    ollama = h / ".ollama" / "models"
    write_ollama(ollama, "tinybig", "latest", target)
    write_ollama(ollama, "tinysmall", "q8", draft, ns="someone")
    write_ollama(ollama, "escape", "latest", None, digest="sha256:../../../../etc/passwd")
    (ollama / "blobs" / ("sha256-" + "e" * 64)).write_bytes(b"")  # a 0-byte blob
    write_ollama(ollama, "empty", "latest", None, digest="sha256:" + "e" * 64)
    (ollama / "blobs" / ("sha256-" + "d" * 64)).mkdir()  # a directory where the blob file is expected
    write_ollama(ollama, "isdir", "latest", None, digest="sha256:" + "d" * 64)
    fifo_manifest = ollama / "manifests" / "registry.ollama.ai" / "library" / "fifo"
    fifo_manifest.mkdir()
    os.mkfifo(fifo_manifest / "latest")  # never waited on
    lms = h / ".lmstudio" / "models" / "pub" / "repo"
    lms.mkdir(parents=True)
    write_tiny_model(lms / "small-lms.gguf", seed=4, name="tiny-lms", layer_scale=0.3)
    (lms / "mmproj-small.gguf").write_bytes(b"GGUF")  # a vision projector: not listed
    hf = h / ".cache" / "huggingface" / "hub" / "models--org--repo"
    (hf / "blobs").mkdir(parents=True)
    (hf / "refs").mkdir()
    (hf / "refs" / "main").write_text("abc123")
    (hf / "blobs" / "b1").write_bytes(other_merge.read_bytes())
    (hf / "snapshots" / "abc123").mkdir(parents=True)
    (hf / "snapshots" / "abc123" / "merge.gguf").symlink_to("../../blobs/b1")
    fr = h / ".cache" / "huggingface" / "hub" / "models--org--fiforef"
    (fr / "refs").mkdir(parents=True)
    os.mkfifo(fr / "refs" / "main")  # never waited on
    (fr / "snapshots" / "r1").mkdir(parents=True)
    (fr / "snapshots" / "r1" / "f.gguf").write_bytes(b"GGUF")
    lc = h / ".cache" / "llama.cpp"
    lc.mkdir(parents=True)
    write_tiny_model(lc / "org_repo_split.gguf", seed=5, name="tiny-split", split_max_tensors=8)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "loop-a.gguf").symlink_to(mine / "loop-b.gguf")
    (mine / "loop-b.gguf").symlink_to(mine / "loop-a.gguf")
    with open(mine / "sparse.gguf", "wb") as fh:  # 2 GB, a bad header, almost no disk
        fh.write(b"NOTGGUF!")
        fh.truncate(2 * 1024**3)
    os.mkfifo(mine / "fifo.gguf")
    write_truncated_copy(draft, mine / "trunc.gguf", keep_fraction=0.001)  # cut inside the header
    first = write_tiny_model(mine / "fsplit.gguf", seed=6, split_max_tensors=8)
    part2 = first.with_name(first.name.replace("-00001-", "-00002-"))
    part2.unlink()
    os.mkfifo(part2)  # a split part that is a FIFO
    (mine / "linkdir").symlink_to(lc)  # directory symlinks are not followed
    return {"home": h, "mine": mine, "target": target, "draft": draft}


__all__ = ["BIG", "write_ollama", "write_model_trees"]
