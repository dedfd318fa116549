"""Which op first makes a position's logits depend on the batch it is decoded in (docs/determinism.md).

For each setting, one position is decoded alone (a 1-token batch) and as row 0 of a batch of N tokens (a verify
batch: the same token followed by N-1 more, or, with --other-seq, followed by N-1 tokens of another sequence); every
op's output (llama.cpp's eval callback, cb_eval) for that row is compared, and the first op whose values differ is
named, with the largest logit difference. Each setting runs in its own subprocess (llama.cpp aborts on some misuse).

    PYTHONPATH=$PWD python bench/determinism_probe.py [--model PATH] [--batches 2,9,17] [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import ctypes
import json
import os
import subprocess
import sys
from typing import Any

import numpy as np

DEFAULT_MODEL = os.path.expanduser("~/.cache/edgespec/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
PROMPT = [9707, 11, 1879, 0, 358, 1079, 264, 2038, 9471, 13, 5209, 3270, 264, 729, 429, 4675, 279, 1372, 315, 78456]


class Tensor(ctypes.Structure):  # struct ggml_tensor (ggml.h) up to its name
    _fields_ = [
        ("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
    ]


def _values(t: Tensor) -> tuple[list[int], np.ndarray] | None:
    """An F32 op output's shape (ggml order) and a copy of its values (numpy order); None for other types."""
    if t.type != 0 or not t.data:
        return None
    ne = [int(x) for x in t.ne]
    nb = [int(x) for x in t.nb]
    total = sum((ne[k] - 1) * nb[k] for k in range(4)) + 4
    base = (ctypes.c_char * total).from_address(t.data)
    return ne, np.array(np.ndarray(shape=ne[::-1], dtype=np.float32, buffer=memoryview(base), strides=nb[::-1]), copy=True)


def _row0(alone: tuple[list[int], np.ndarray], batch: tuple[list[int], np.ndarray], n: int) -> np.ndarray | None:
    """Batch row 0 of an op output, laid out as the lone decode's (the one dimension that is 1 alone and n in the
    batch, the others equal; the whole output where the shapes are equal); None when no dimension fits (an op over
    the whole cache)."""
    (ne_a, _), (ne_b, b) = alone, batch
    if ne_a == ne_b:  # past the output rows' selection (one row in both)
        return b
    for d in range(4):
        if ne_a[d] == 1 and ne_b[d] == n and all(ne_a[k] == ne_b[k] for k in range(4) if k != d):
            return np.take(b, [0], axis=3 - d)
    return None


def run_setting(model: str, setting: dict[str, Any], batches: list[int]) -> dict[str, Any]:
    """In this process: load, then for each batch size decode the position alone and in the batch; the first op
    that differs and the logits' largest difference."""
    from llama_cpp import llama_cpp as C

    log_cb = C.llama_log_callback(lambda *a: None)  # kept alive: llama.cpp holds the pointer
    C.llama_log_set(log_cb, ctypes.c_void_p(0))
    C.llama_backend_init()
    mp = C.llama_model_default_params()
    mp.use_extra_bufts = bool(setting.get("repack", True))
    m = C.llama_model_load_from_file(model.encode(), mp)
    captured: list[tuple[str, tuple[list[int], np.ndarray]]] = []
    state = {"n": 1, "on": False}

    @C.ggml_backend_sched_eval_callback
    def cb(tp: int, ask: bool, _ud: int) -> bool:
        if ask:
            return True
        if state["on"]:
            t = Tensor.from_address(tp)
            try:
                got = _values(t)
            except Exception:  # a layout this reader does not know: skipped (an exception here would cancel the decode)
                got = None
            if got is not None:
                captured.append((t.name.decode(), got))
        return True

    cp = C.llama_context_default_params()
    if setting.get("no_tiled"):
        os.environ["GGML_CPU_TILED_MM"] = "0"  # read once, at the first K-quant product of the process
    cp.n_ctx = 2048
    cp.n_batch = 1024
    cp.n_ubatch = int(setting.get("ubatch", 1024))
    cp.n_seq_max = 2
    cp.kv_unified = True
    cp.n_threads = cp.n_threads_batch = int(setting.get("threads", 2))
    cp.flash_attn_type = 1 if setting.get("flash") else 0
    if setting.get("kv") == "q8_0":
        cp.type_k = cp.type_v = 8
    if setting.get("ops"):
        cp.cb_eval = cb
    ctx = C.llama_init_from_model(m, cp)
    mem = C.llama_get_memory(ctx)
    nv = C.llama_vocab_n_tokens(C.llama_model_get_vocab(m))
    bat = C.llama_batch_init(1024, 0, 2)

    def decode(entries: list[tuple[int, int, int]], n_tok: int) -> np.ndarray:
        for i, (tok, pos, seq) in enumerate(entries):
            bat.token[i], bat.pos[i], bat.n_seq_id[i], bat.seq_id[i][0] = tok, pos, 1, seq
            bat.logits[i] = 1 if i == 0 else 0
        bat.n_tokens = len(entries)
        captured.clear()
        state["n"] = min(n_tok, int(cp.n_ubatch))  # row 0 is in the first micro-batch
        state["on"] = True
        assert C.llama_decode(ctx, bat) == 0
        state["on"] = False
        return np.ctypeslib.as_array(C.llama_get_logits_ith(ctx, 0), shape=(nv,)).copy()

    prompt = PROMPT * (int(setting.get("long", 0)) // len(PROMPT) + 1)  # long: a cache past 512 cells
    P = len(prompt)
    state["on"] = False
    for i, tok in enumerate(prompt):  # prompt in one batch, seq 0 and seq 1 (the other sequence: a shorter prompt)
        bat.token[i], bat.pos[i], bat.n_seq_id[i], bat.seq_id[i][0], bat.logits[i] = tok, i, 1, 0, 0
    bat.n_tokens = P
    assert C.llama_decode(ctx, bat) == 0
    C.llama_memory_seq_cp(mem, 0, 1, 0, 10)
    tok = 1479
    alone = decode([(tok, P, 0)], 1)
    ops_alone = list(captured)
    out: dict[str, Any] = {"setting": setting, "batches": {}, "alone_sha": hashlib.sha256(alone.tobytes()).hexdigest()[:10]}
    for n in batches:
        C.llama_memory_seq_rm(mem, 0, P, -1)
        C.llama_memory_seq_rm(mem, 1, 10, -1)
        if setting.get("other_seq"):
            entries = [(tok, P, 0)] + [(400 + j, 10 + j, 1) for j in range(n - 1)]
        else:
            entries = [(tok, P, 0)] + [(400 + j, P + 1 + j, 0) for j in range(n - 1)]
        got = decode(entries, n)
        first = None
        if setting.get("ops"):
            for (na, va), (nb_, vb) in zip(ops_alone, captured):
                # kq: raw scores over every cache cell, empty cells included (stale values), masked afterwards
                b = _row0(va, vb, n) if na == nb_ and not na.startswith("kq-") else None
                a = va[1]
                if b is None or a.shape != b.shape:
                    continue
                if os.environ.get("PROBE_DEBUG"):
                    print(na, a.shape, float(np.max(np.abs(a - b))), file=sys.stderr)
                if not np.array_equal(a, b):
                    first = f"{na} (by {float(np.max(np.abs(a - b))):.3g})"
                    break
        out["batches"][n] = {"max_logit_diff": float(np.max(np.abs(alone - got))), "argmax_same": int(alone.argmax()) == int(got.argmax()),
                             "first_op": first}
        C.llama_memory_seq_rm(mem, 0, P, -1)
        again = decode([(tok, P, 0)], 1)  # alone again: run-to-run
        out["batches"][n]["alone_repeat_identical"] = bool(np.array_equal(again, alone))
    C.llama_batch_free(bat)
    C.llama_free(ctx)
    C.llama_model_free(m)
    return out


DET = {"repack": False, "no_tiled": True, "flash": True, "kv": "q8_0"}  # deterministic mode's settings
SETTINGS: list[dict[str, Any]] = [
    {"name": "default (repack on, flash attention off, f16 KV, 2 threads)", "ops": True},
    {"name": "1 thread", "threads": 1, "ops": True},
    {"name": "n_ubatch 8", "ubatch": 8, "ops": True},
    {"name": "other rows in another sequence (unified cache)", "other_seq": True, "ops": True},
    {"name": "flash attention on", "flash": True, "ops": True},
    {"name": "repack off", "repack": False, "ops": True},
    {"name": "repack off, tiled K-quant product off", "repack": False, "no_tiled": True, "ops": True},
    {"name": "repack off, tiled off, flash on", "repack": False, "no_tiled": True, "flash": True, "ops": True},
    {"name": "repack off, tiled off, flash on, cache past 512 cells", "repack": False, "no_tiled": True, "flash": True, "long": 700,
     "ops": True},
    {"name": "KV q8_0, flash on (repack, tiled on)", "kv": "q8_0", "flash": True, "ops": True},
    {"name": "deterministic mode: repack off, tiled off, flash on, KV q8_0, cache past 512 cells", **DET, "long": 700, "ops": True},
    {"name": "deterministic mode, 1 thread", **DET, "long": 700, "threads": 1, "ops": True},
    {"name": "deterministic mode, other rows in another sequence", **DET, "long": 700, "other_seq": True, "ops": True},
    {"name": "deterministic mode, n_ubatch 8", **DET, "long": 700, "ubatch": 8, "ops": True},
    {"name": "deterministic mode, no eval callback (fused graph)", **DET, "long": 700},
    {"name": "default, no eval callback (fused graph)"},
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--batches", default="2,9,17")
    ap.add_argument("--only", default="", help="comma-separated setting indexes")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    batches = [int(x) for x in a.batches.split(",")]
    if a.child:
        print(json.dumps(run_setting(a.model, json.loads(a.child), batches)))
        return
    picks = [SETTINGS[int(i)] for i in a.only.split(",")] if a.only else SETTINGS
    print(f"| setting | {' | '.join(f'batch {n}: max logit diff, first op that differs' for n in batches)} | alone: logits hash |")
    print("|---|" + "---|" * (len(batches) + 1))
    for s in picks:
        r = subprocess.run([sys.executable, __file__, "--model", a.model, "--batches", a.batches, "--child", json.dumps(s)],
                           capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            print(f"| {s['name']} | failed: {r.stderr.strip().splitlines()[-1:] } |", flush=True)
            continue
        res = json.loads(r.stdout.strip().splitlines()[-1])
        cells = []
        for n in batches:
            b = res["batches"][str(n)]
            cells.append(f"{b['max_logit_diff']:.3g}{'' if b['argmax_same'] else ' (argmax differs)'}"
                         + (f", {b['first_op']}" if s.get("ops") else "") + ("" if b["alone_repeat_identical"] else ", alone not repeatable"))
        print(f"| {s['name']} | {' | '.join(cells)} | {res['alone_sha']} |", flush=True)


if __name__ == "__main__":
    main()
