"""llama.cpp's own C++ tools, built from the same sources edgespec runs on, run and read: what bench/llamacpp_compare.py,
bench/plain_speed.py and scripts/make_gpu_bundle.sh compare against or carry.

* `build` compiles `llama-speculative-simple`, `llama-lookup` and `llama-bench` from the llama.cpp vendored in the
  llama-cpp-python sdist (`fetch_sources`: downloaded with pip and unpacked once), with GGML_NATIVE=OFF and the CPU
  flags scripts/setup.sh would pick (`detect_cmake_args`: scripts/cmake_args.sh of this checkout, or
  EDGESPEC_CMAKE_ARGS). Sources and binaries live in the cache folder given (~/.cache/edgespec/llamacpp/ by the
  scripts; never in the repository); a second build with the same version and flags reuses the first
  (`build_dir`).
* `run_tool` runs one of the speculative tools and reads the summary it prints at the end (`parse_tool_output`);
  `llama_bench` runs llama-bench's token generation at a context depth and reads its JSON.

Importing this module loads nothing of llama.cpp (it runs llama.cpp's programs, not its library). Progress goes to
stderr as "[compare] ..." lines.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

# the checkout this package runs from: scripts/cmake_args.sh holds the CPU flags setup.sh builds with
CMAKE_ARGS_SH = Path(__file__).resolve().parents[2] / "scripts" / "cmake_args.sh"
TARGETS = ("llama-speculative-simple", "llama-lookup", "llama-bench")


def log(msg: str) -> None:
    print(f"[compare] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------- build
def detect_cmake_args() -> str:
    """The flags scripts/setup.sh builds with (scripts/cmake_args.sh; EDGESPEC_CMAKE_ARGS replaces them entirely)."""
    env = os.environ.get("EDGESPEC_CMAKE_ARGS")
    if env is not None:
        return env
    out = subprocess.run(["bash", str(CMAKE_ARGS_SH)], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def run_logged(cmd: list[str], **kw: Any) -> None:
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, **kw)


def fetch_sources(cache: Path, version: str) -> Path:
    """vendor/llama.cpp of the llama-cpp-python sdist, downloaded and unpacked once."""
    src = cache / "src" / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if (src / "CMakeLists.txt").is_file():
        return src
    sdist_dir = cache / "sdist"
    tarballs = sorted(sdist_dir.glob(f"llama_cpp_python-{version}.tar.gz"))
    if not tarballs:
        sdist_dir.mkdir(parents=True, exist_ok=True)
        run_logged([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    f"llama-cpp-python=={version}", "-d", str(sdist_dir)])
        tarballs = sorted(sdist_dir.glob(f"llama_cpp_python-{version}.tar.gz"))
        if not tarballs:
            raise SystemExit(f"pip download left no llama_cpp_python-{version}.tar.gz in {sdist_dir}")
    log(f"unpacking {tarballs[0]}")
    (cache / "src").mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarballs[0]) as tf:
        tf.extractall(cache / "src", filter="data") if sys.version_info >= (3, 12) else tf.extractall(cache / "src")
    if not (src / "CMakeLists.txt").is_file():
        raise SystemExit(f"no vendor/llama.cpp in the sdist (looked for {src})")
    return src


def build_dir(cache: Path, version: str, flags: str) -> Path:
    """Where build() keeps the tools of this llama-cpp-python version built with these CMake flags."""
    return cache / f"build-{version}-{hashlib.sha256(f'{version}|{flags}'.encode()).hexdigest()[:12]}"


def build(cache: Path, version: str, jobs: int) -> Path:
    """Build the three tools (once per version and flag set); return the folder holding the binaries."""
    flags = detect_cmake_args()
    bdir = build_dir(cache, version, flags)
    bin_dir = bdir / "bin"
    if all((bin_dir / t).is_file() for t in TARGETS):
        log(f"reusing llama.cpp tools in {bin_dir}")
        return bin_dir
    src = fetch_sources(cache, version)
    log(f"llama.cpp {version} CMake flags: {flags or '<defaults>'}")
    configure = [
        "cmake", "-S", str(src), "-B", str(bdir), "-DCMAKE_BUILD_TYPE=Release",
        "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
        "-DLLAMA_BUILD_APP=OFF", "-DBUILD_SHARED_LIBS=OFF", *flags.split(),
    ]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    run_logged(configure, stdout=subprocess.DEVNULL)
    t0 = time.time()
    run_logged(["cmake", "--build", str(bdir), "--config", "Release", "-j", str(jobs), "--target", *TARGETS],
               stdout=subprocess.DEVNULL)
    log(f"built in {time.time() - t0:.0f}s")
    missing = [t for t in TARGETS if not (bin_dir / t).is_file()]
    if missing:
        raise SystemExit(f"build finished but {', '.join(missing)} not in {bin_dir}")
    (bdir / "CMAKE_FLAGS").write_text(flags + "\n")
    return bin_dir


# --------------------------------------------------------------------------------------------- running the tools
_DECODED = re.compile(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds, speed:\s+([\d.]+|inf|nan)\s+t/s")
_ENCODED = re.compile(r"encoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds")
_FIELD = re.compile(r"^.*?\b(n_drafted|n_accept|n_predict)\s*=\s*(\d+)\s*$", re.M)


def parse_tool_output(text: str) -> dict[str, Any]:
    """The summary llama-speculative-simple and llama-lookup print at the end (this llama.cpp version):
        encoded  520 tokens in    1.234 seconds, speed:  421.4 t/s
        decoded  129 tokens in    9.876 seconds, speed:   13.1 t/s
        n_drafted = 120 / n_accept = 100 (plus other lines)"""
    m = _DECODED.search(text)
    if not m:
        raise ValueError("no 'decoded N tokens in T seconds' line in the output")
    out: dict[str, Any] = {"tokens": int(m.group(1)), "seconds": float(m.group(2))}
    e = _ENCODED.search(text)
    if e:
        out["prompt_tokens"], out["prompt_seconds"] = int(e.group(1)), float(e.group(2))
    for key, val in _FIELD.findall(text):
        out[key] = int(val)
    return out


def run_tool(cmd: list[str], timeout: float) -> dict[str, Any]:
    """One run of a speculative tool: its parsed summary and the process's wall seconds, or {"error": why}."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f}s"}
    wall = time.perf_counter() - t0
    text = p.stdout + "\n" + p.stderr
    if p.returncode != 0:
        tail = " | ".join(ln for ln in p.stderr.strip().splitlines()[-3:])
        return {"error": f"exit {p.returncode}: {tail}"}
    try:
        out = parse_tool_output(text)
    except ValueError as e:
        return {"error": str(e), "tail": p.stderr[-500:]}
    out["process_wall"] = round(wall, 3)
    return out


def llama_bench(bin_dir: Path, target: Path, n: int, threads: int, reps: int, depth: int = 0) -> dict[str, Any]:
    """llama-bench's token generation of n tokens after `depth` cached tokens: tokens/s and their spread, or {"error": why}."""
    cmd = [str(bin_dir / "llama-bench"), "-m", str(target), "-p", "0", "-n", str(n), "-t", str(threads),
           "-r", str(reps), "-d", str(depth), "-o", "json"]
    log("$ " + " ".join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=600)
    if p.returncode != 0:
        return {"error": f"exit {p.returncode}: {p.stderr.strip().splitlines()[-1:]}"}
    try:
        rows = json.loads(p.stdout)
        row = next(r for r in rows if int(r.get("n_gen", 0)) == n)
        return {"tokens_per_second": float(row["avg_ts"]), "stddev": float(row["stddev_ts"]), "reps": reps}
    except (ValueError, StopIteration, KeyError) as e:
        return {"error": f"cannot parse llama-bench json: {e}"}
