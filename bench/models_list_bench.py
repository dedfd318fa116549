#!/usr/bin/env python3
"""How long `edgespec models list` takes over many model files: cold (no catalog cache) and warm (the cache
written by the run before), as the command a user types (a fresh process each time, imports included) and as
Catalog().models() in-process.

    .venv/bin/python bench/models_list_bench.py                 # 200 files, 5 warm runs
    .venv/bin/python bench/models_list_bench.py --files 500 --runs 3 --real

The files: tiny GGUFs (tests/support/tiny.py, 263-token vocabulary) spread over a fake home's Ollama store (a
manifest and a blob each), LM Studio folder, Hugging Face hub cache (snapshot symlinks to blobs) and llama.cpp cache,
in a temporary folder; --real adds the default pair's two files from the model cache to a user folder (a 151,936-token
vocabulary: the header read that dominates a cold run). Nothing is written outside the temporary folder.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def build(home: Path, n: int) -> None:
    from support.model_trees import write_ollama
    from support.tiny import write_tiny_model

    src = home.parent / "src"
    src.mkdir()
    protos = [write_tiny_model(src / f"p{i}.gguf", seed=i, name=f"proto-{i}", n_layers=1 + i % 3) for i in range(4)]
    blobs = [p.read_bytes() for p in protos]
    hf = home / ".cache" / "huggingface" / "hub"
    for i in range(n):
        data = blobs[i % 4] + b"\0" * i  # distinct bytes (an Ollama blob is named by its digest)
        where = i % 4
        if where == 0:
            f = src / f"o{i}.gguf"
            f.write_bytes(data)
            write_ollama(home / ".ollama" / "models", f"model{i}", "latest", f)
            f.unlink()
        elif where == 1:
            d = home / ".lmstudio" / "models" / f"pub{i % 7}" / f"repo{i}"
            d.mkdir(parents=True)
            (d / f"model{i}-q4_k_m.gguf").write_bytes(data)
        elif where == 2:
            repo = hf / f"models--org--repo{i}"
            (repo / "blobs").mkdir(parents=True)
            (repo / "snapshots" / "rev").mkdir(parents=True)
            h = hashlib.sha256(data).hexdigest()
            (repo / "blobs" / h).write_bytes(data)
            (repo / "snapshots" / "rev" / f"model{i}.gguf").symlink_to(f"../../blobs/{h}")
        else:
            d = home / ".cache" / "llama.cpp"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"org_repo{i}_model{i}.gguf").write_bytes(data)


def timed_cli(env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "edgespec", "models", "list"], env=env, capture_output=True, text=True, timeout=600)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"models list failed: {p.stderr.strip()}")
    return dt, p.stdout


def timed_inprocess(env: dict[str, str]) -> tuple[float, int]:
    code = ("import time; t=time.perf_counter(); from edgespec.models import Catalog; n=len(Catalog().models()); "
            "print(time.perf_counter()-t, n)")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600, check=True)
    seconds, n = p.stdout.split()
    return float(seconds), int(n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--runs", type=int, default=5, help="warm runs (the median is reported)")
    ap.add_argument("--real", action="store_true", help="add the default pair's two files (a real 151,936-token vocabulary)")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        t0 = time.perf_counter()
        build(home, args.files)
        built = time.perf_counter() - t0
        env = {k: v for k, v in os.environ.items() if k not in ("OLLAMA_MODELS", "HF_HOME", "HF_HUB_CACHE", "LLAMA_CACHE")}
        env.update(HOME=str(home), EDGESPEC_CACHE_DIR=str(Path(tmp) / "cache"), EDGESPEC_DATA_DIR=str(Path(tmp) / "data"),
                   PYTHONPATH=str(ROOT), EDGESPEC_MODEL_DIRS="")
        if args.real:
            from edgespec.models import resolve_model

            real = Path(tmp) / "real"
            real.mkdir()
            for role in ("target", "draft"):
                p = resolve_model(None, role)
                (real / p.name).symlink_to(p)
            env["EDGESPEC_MODEL_DIRS"] = str(real)
        cold, _ = timed_cli(env)
        warm = [timed_cli(env)[0] for _ in range(args.runs)]
        (Path(tmp) / "cache" / "models.json").unlink()
        cold_in, n_found = timed_inprocess(env)
        warm_in = [timed_inprocess(env)[0] for _ in range(args.runs)]
        import_only = [timed_import(env) for _ in range(args.runs)]
    result = {"files": args.files + (2 if args.real else 0), "models_found": n_found, "build_s": round(built, 2),
              "cli_cold_s": round(cold, 3), "cli_warm_median_s": round(statistics.median(warm), 3),
              "cli_warm_s": [round(w, 3) for w in warm], "catalog_cold_s": round(cold_in, 3),
              "catalog_warm_median_s": round(statistics.median(warm_in), 3),
              "python_startup_and_import_median_s": round(statistics.median(import_only), 3),
              "machine": f"{os.cpu_count()} CPUs, {sys.platform}", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(json.dumps(result, indent=1))
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=1))


def timed_import(env: dict[str, str]) -> float:
    """A fresh process that imports the CLI and exits: what every command pays before it does anything."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import edgespec.cli"], env=env, check=True, timeout=120)
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
