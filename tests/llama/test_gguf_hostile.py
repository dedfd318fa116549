"""Hostile GGUF files: edgespec must refuse, with one clear line, every file that would kill llama.cpp.

- Regression cases (`hostile_files.HOSTILE`): each file crashed llama.cpp with a signal before gguf_rules checked
  for it; `inspect_gguf` now raises ModelFileError naming the problem. A slow test replays them through an
  unguarded llama.cpp in subprocesses, to show that each rule still guards a real crash.
- Path oddities: short files, symlink loops, FIFOs, devices, unreadable files.
- Fuzz: a few hundred seeded mutations of tiny models. Every file `inspect_gguf` accepts is loaded, decoded
  and tokenized by llama.cpp in a subprocess, which must never die of a signal.
"""

from __future__ import annotations

import copy
import ctypes
import os
import random
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from edgespec.llama import gguf_rules
from edgespec.errors import ModelFileError
from edgespec.llama.gguf_check import inspect_gguf

from support import ROOT
from support.hostile_files import (ARR, F32, HOSTILE, I32, U8, U32, VALID_CHARSMAP, Tensor, base_docs, mutate, serialize, spm_doc,
                           t5_doc, tiny_doc, write_doc)


# What `inspect_gguf` says about each HOSTILE file.
EXPECTED = {
    "q8_k_weights": r"'blk.0.attn_q.weight' has type Q8_K, which llama.cpp cannot compute",
    "q8_1_weights": r"'blk.0.ffn_up.weight' has type Q8_1, which llama.cpp cannot compute",
    "i32_weights": r"'output.weight' has type I32, which llama.cpp cannot compute",
    "q8_k_embedding": r"'token_embd.weight' has type Q8_K, which llama.cpp cannot compute",
    "i16_embedding": r"'token_embd.weight' has type I16, which llama.cpp cannot compute",
    "f16_norm": r"'blk.0.attn_norm.weight' is a vector of type F16; .* only in F32",
    "q4_0_norm": r"'output_norm.weight' is a vector of type Q4_0; .* only in F32",
    "block_count_0": r"llama.block_count is 0; llama.cpp takes 1 to 512 layers",
    "block_count_513": r"llama.block_count is 513; llama.cpp takes 1 to 512 layers",
    "nextn_over_block_count": r"nextn_predict_layers 3 exceeds block_count 2",
    "experts_none_used": r"expert_\* settings are inconsistent: 4 experts but none used",
    "experts_used_without_experts": r"expert_\* settings are inconsistent: 2 experts used per token out of 0",
    "expert_groups_uneven": r"expert_\* settings are inconsistent: 4 experts in 3 groups",
    "rope_scaling_unknown": r"rope.scaling.type 'bogus' is not one of none, linear, yarn, longrope",
    "rms_eps_nan": r"layer_norm_rms_epsilon is nan; llama.cpp needs a number >= 0",
    "rms_eps_negative": r"layer_norm_rms_epsilon is -1e-05; llama.cpp needs a number >= 0",
    "gqa_uneven": r"layer 0 has 4 attention heads and 3 key/value heads",
    "gqa_more_kv_heads": r"layer 0 has 2 attention heads and 4 key/value heads",
    "gqa_uneven_explicit_heads": r"layer 0 has 6 attention heads and 4 key/value heads",
    "kv_heads_zero_in_layer": r"layer 1 has 4 attention heads and 0 key/value heads",
    "kv_heads_vary_by_layer": r"llama.attention.head_count_kv varies by layer \(\[2, 4\]\), but llama sizes every",
    "qwen2_kv_heads_vary_by_layer": r"qwen2.attention.head_count_kv varies by layer \(\[2, 1\]\)",
    "bert_byte_token": r"token 97 has type BYTE, which the bert tokenizer cannot render",
    "odd_head_size": r"rope.dimension_count is 9; llama.cpp rotates an even number of dimensions",
    "odd_key_length": r"rope.dimension_count is 7; llama.cpp rotates an even number of dimensions",
    "qwen2_partial_rotary": r"qwen2.rope.dimension_count is 4 but qwen2 rotates whole heads of 8",
    "empty_ffn": r"'blk.0.ffn_gate.weight' has an empty dimension",
    "moe_arch_without_experts": r"smallthinker is a mixture-of-experts architecture but .*expert_count is missing",
    "mrope_without_sections": r"paddleocr.rope.dimension_sections \[0, 0, 0, 0\] has no positive section",
    "t5_encoder_decoder": r"architecture 't5' is an encoder-decoder model; llama.cpp aborts when it decodes without",
    "t5encoder_without_relative_bias": r"t5encoder model has no tensor 'enc.blk.0.attn_rel_b.weight' \(llama.cpp would crash",
    "nvfp4_tied_output_with_scale": r"tensor 'output.scale' scales an output layer the file does not have",
    "ugm_charsmap_out_of_bounds": r"tokenizer.ggml.precompiled_charsmap leads out of its table",
    "duplicate_token": r"tokens 5 and 97 have the same text 'a'",
    "token_with_nul": r"tokens 5 and 97 have the same text 'a'",
    "empty_token_collides": r"tokens 5 and 6 have the same text '\[EMPTY_5\]'",
    "spm_without_byte_tokens": r"SPM vocabulary has no byte token <0x00>",
    "no_tokenizer": r"has no tokenizer \(tokenizer.ggml.model = 'none'\)",
    "rwkv_without_unknown_token": r"rwkv tokenizer needs a valid tokenizer.ggml.unknown_token_id",
    "bpe_adds_missing_bos": r"the gpt2 tokenizer adds a BOS token but the file has no valid BOS token id",
    "bpe_adds_missing_eos": r"the gpt2 tokenizer adds an EOS token but the file has no valid EOS token id",
    "wpm_without_separator": r"the bert tokenizer adds a separator token but the file has no valid separator token id",
    "gemma4_without_bos": r"the gemma4 tokenizer adds a BOS token but the file has no valid BOS token id",
}

PER_FILE_TIMEOUT_S = 60
# Loads, decodes and tokenizes each path read from stdin, one "START"/"RESULT" pair of lines per file; SIGALRM ends
# a file that hangs. With argv[1] == "raw" the header checks are skipped: llama.cpp gets the file as it is.
RUNNER = r"""
import signal, sys, types
from edgespec.llama.backend import Model
from edgespec.config import ModelSpec
from edgespec.errors import EdgespecError
raw = sys.argv[1] == "raw"
for line in sys.stdin:
    path = line.rstrip("\n")
    print("START", path, flush=True)
    signal.alarm(int(sys.argv[2]))
    try:
        info = types.SimpleNamespace(name="hostile", architecture="?") if raw else None
        m = Model(ModelSpec(path, n_ctx=64, n_batch=16, n_threads=1), info=info)
        m.decode([0], 0)
        toks = m.tokenize("Hello, world! \u00e9\n<|im_end|>", add_special=True)
        m.detokenize(toks, special=True)
        if toks:
            m.decode(toks[:8], 1)
        m.close()
        print("RESULT ok", flush=True)
    except EdgespecError as e:
        print("RESULT refused", type(e).__name__, str(e).replace("\n", " "), flush=True)
"""


def run_in_subprocesses(paths: list[Path], *, raw: bool = False, workers: int = 2) -> dict[Path, str]:
    """Status of each path after a llama.cpp load: "ok", "refused ...", "signal SIGxxx", "exit N" or "timeout".

    Each worker is one Python process (one llama.cpp thread) that loads its files in turn; when one kills it, that
    file is marked and a fresh process carries on with the rest."""
    env = dict(os.environ, GGML_NO_BACKTRACE="1", EDGESPEC_VERBOSE="0")
    root = ROOT

    def worker(chunk: list[Path]) -> dict[Path, str]:
        results: dict[Path, str] = {}
        pending = list(chunk)
        while pending:
            cmd = [sys.executable, "-c", RUNNER, "raw" if raw else "checked", str(PER_FILE_TIMEOUT_S)]
            stdin = "".join(f"{p}\n" for p in pending)
            r = subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env, cwd=root)
            out = r.stdout
            if r.returncode == -signal.SIGALRM:
                ended = "timeout"
            else:
                ended = "signal " + signal.Signals(-r.returncode).name if r.returncode < 0 else f"exit {r.returncode}"
            current = last = None
            for line in out.splitlines():
                if line.startswith("START "):
                    current = Path(line[6:])
                elif line.startswith("RESULT ") and current is not None:
                    results[current], last, current = line[7:], current, None
            if current is None and ended != "exit 0":  # died between files (or at exit): blame the neighbour
                current = next((p for p in pending if p not in results), last)
                ended += " (between files)"
            if current is not None:
                results[current] = ended
            if all(p not in results for p in pending):  # no progress (cannot happen, but never loop forever)
                results.update((p, ended) for p in pending)
            pending = [p for p in pending if p not in results]
        return results

    chunks = [paths[i::workers] for i in range(workers)]
    merged: dict[Path, str] = {}
    with ThreadPoolExecutor(workers) as ex:
        for part in ex.map(worker, chunks):
            merged.update(part)
    return merged


# ---------------------------------------------------------------- regression cases
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_file_is_refused(tmp_path: Path, name: str) -> None:
    path = write_doc(HOSTILE[name](), tmp_path / f"{name}.gguf")
    with pytest.raises(ModelFileError, match=EXPECTED[name]) as e:
        inspect_gguf(path)
    message = str(e.value)
    assert message.startswith(f"{path}: ") and "\n" not in message


def test_every_hostile_case_has_an_expected_message() -> None:
    assert sorted(HOSTILE) == sorted(EXPECTED)


@pytest.mark.slow
def test_hostile_files_really_crash_unguarded_llama_cpp(tmp_path: Path) -> None:
    """Without the header checks each HOSTILE file kills llama.cpp; if one stops doing so, llama.cpp has been
    fixed and the rule that refuses it can be reconsidered."""
    paths = [write_doc(HOSTILE[name](), tmp_path / f"{name}.gguf") for name in sorted(HOSTILE)]
    results = run_in_subprocesses(paths, raw=True)
    survivors = {p.stem: status for p, status in results.items() if not status.startswith("signal")}
    assert not survivors, f"no longer crash llama.cpp: {survivors}"


def test_valid_variants_stay_accepted(tmp_path: Path) -> None:
    """Close relatives of the hostile files that llama.cpp handles: they must not be refused."""
    ok = {
        "spm_with_byte_tokens": spm_doc(),
        "qwen2": tiny_doc().rename_arch("qwen2"),
        "explicit_head_size": tiny_doc().hp("attention.key_length", 8).hp("attention.value_length", 8),
        "per_layer_heads": tiny_doc().hp("attention.head_count", (I32, [4, 4]), ARR)
        .hp("attention.head_count_kv", (U32, [2, 2]), ARR),
        "special_ids_out_of_range": tiny_doc().set("tokenizer.ggml.eot_token_id", 99999),
        "yarn": tiny_doc().hp("rope.scaling.type", "yarn").hp("rope.scaling.factor", 4.0, F32),
        "q4_k_weights": tiny_doc(d_model=256, d_ff=256).retype("blk.0.ffn_up.weight", 12),
        "bf16_weights": tiny_doc().retype("blk.1.attn_v.weight", 30),
        "t5encoder": t5_doc("t5encoder"),
        "t5_tokenizer_with_charsmap": tiny_doc().set("tokenizer.ggml.model", "t5")
        .set("tokenizer.ggml.precompiled_charsmap", (U8, VALID_CHARSMAP), ARR),
        "nvfp4_weight_scale": tiny_doc(d_model=256, d_ff=256).retype("blk.0.ffn_up.weight", 40)
        .add(Tensor("blk.0.ffn_up.scale", [1], 0)),
    }
    for name, doc in ok.items():
        inspect_gguf(write_doc(doc, tmp_path / f"{name}.gguf"))


def test_type_table_matches_ggml() -> None:
    """gguf_rules.GGML_TYPES (block and byte sizes) agrees with the ggml library llama-cpp-python ships."""
    import llama_cpp

    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_type_size.restype = ctypes.c_size_t
    lib.ggml_blck_size.restype = ctypes.c_int64
    lib.ggml_type_name.restype = ctypes.c_char_p
    for tid in range(43):  # GGML_TYPE_COUNT
        t = gguf_rules.GGML_TYPES.get(tid)
        if t is None:
            assert lib.ggml_blck_size(tid) == 0, f"type {tid} ({lib.ggml_type_name(tid)}) is missing from the table"
        else:
            assert (lib.ggml_type_name(tid).decode().upper(), lib.ggml_blck_size(tid), lib.ggml_type_size(tid)) == (
                t.name, t.block, t.size)


# ---------------------------------------------------------------- path oddities
def test_short_and_empty_files(tmp_path: Path) -> None:
    (tmp_path / "four.gguf").write_bytes(b"GGUF")
    (tmp_path / "three.gguf").write_bytes(b"GGU")
    (tmp_path / "empty.gguf").write_bytes(b"")
    (tmp_path / "head.gguf").write_bytes(serialize(tiny_doc())[:40])
    with pytest.raises(ModelFileError, match=r"four.gguf: truncated file \(4 bytes; a GGUF header needs at least 24\)"):
        inspect_gguf(tmp_path / "four.gguf")
    with pytest.raises(ModelFileError, match="three.gguf: truncated file"):
        inspect_gguf(tmp_path / "three.gguf")
    with pytest.raises(ModelFileError, match=r"empty.gguf: empty file \(0 bytes\)"):
        inspect_gguf(tmp_path / "empty.gguf")
    with pytest.raises(ModelFileError, match="head.gguf: truncated file"):
        inspect_gguf(tmp_path / "head.gguf")


def test_garbage_names_are_shown_short_and_on_one_line(tmp_path: Path) -> None:
    """A damaged header can make a key or tensor "name" of kilobytes of garbage: the message shows it escaped and cut."""
    import struct

    key = ("bad\nkey\x08\udc88" + "x" * 5000).encode("utf-8", "surrogateescape")
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<I", 999)
    (tmp_path / "garbage.gguf").write_bytes(body + bytes(64))
    with pytest.raises(ModelFileError) as e:
        inspect_gguf(tmp_path / "garbage.gguf")
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 200 and msg.isprintable(), msg
    assert msg.endswith("damaged GGUF header (key 'bad\\nkey\\x08\\udc88" + "x" * 30 + "...' has unknown value type 999)"), msg


def test_symlinks(tmp_path: Path) -> None:
    (tmp_path / "a.gguf").symlink_to(tmp_path / "b.gguf")
    (tmp_path / "b.gguf").symlink_to(tmp_path / "a.gguf")
    (tmp_path / "dangling.gguf").symlink_to(tmp_path / "nowhere.gguf")
    good = write_doc(tiny_doc(), tmp_path / "good.gguf")
    (tmp_path / "link.gguf").symlink_to(good)
    with pytest.raises(ModelFileError, match=r"a.gguf: symlink loop \(the path cannot be resolved\)"):
        inspect_gguf(tmp_path / "a.gguf")
    with pytest.raises(ModelFileError, match=r"dangling.gguf: broken symlink \(its target .*nowhere.gguf does not"):
        inspect_gguf(tmp_path / "dangling.gguf")
    assert inspect_gguf(tmp_path / "link.gguf").architecture == "llama"


def test_special_files(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    # in a subprocess: a reader that opened the FIFO would block forever
    code = "import sys\nfrom edgespec.llama.gguf_check import inspect_gguf\ntry:\n inspect_gguf(sys.argv[1])\n" \
           "except Exception as e:\n print(e)"
    r = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=30)
    assert r.stdout.strip() == f"{fifo}: is a FIFO, not a regular file"
    with pytest.raises(ModelFileError, match="/dev/null: is a character device, not a regular file"):
        inspect_gguf("/dev/null")
    with pytest.raises(ModelFileError, match="is a directory"):
        inspect_gguf(tmp_path)
    plain = write_doc(b"GGUF", tmp_path / "plain")
    with pytest.raises(ModelFileError, match=r"plain/model.gguf: cannot read \(Not a directory\)"):
        inspect_gguf(plain / "model.gguf")


def test_unreadable_file() -> None:
    """Root reads any file, so as root the check runs in a forked child that drops to the 'nobody' user."""
    folder = Path(tempfile.mkdtemp(prefix="edgespec-perm-"))
    try:
        folder.chmod(0o755)
        path = write_doc(tiny_doc(), folder / "secret.gguf")
        path.chmod(0)
        if os.geteuid() != 0:
            with pytest.raises(ModelFileError, match=r"secret.gguf: cannot read \(Permission denied\)"):
                inspect_gguf(path)
            return
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: whatever happens, it exits here and never runs on inside pytest
            message = "the child failed"
            try:
                os.setgid(65534)
                os.setuid(65534)
                inspect_gguf(path)
                message = "accepted"
            except ModelFileError as e:
                message = str(e)
            except OSError:
                message = "SKIP"
            finally:
                os.write(write_end, message.encode())
                os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end) as fh:
            message = fh.read()
        os.waitpid(pid, 0)
        if message == "SKIP":
            pytest.skip("cannot switch to the nobody user here")
        assert message == f"{path}: cannot read (Permission denied)"
    finally:
        for p in folder.iterdir():
            p.unlink()
        folder.rmdir()


# ---------------------------------------------------------------- real files stay accepted, quickly
@pytest.mark.real
def test_real_pair_is_accepted(real_pair: tuple[Path, Path]) -> None:
    from edgespec.llama.gguf_check import _inspect_cached

    for path in real_pair:
        _inspect_cached.cache_clear()
        info = inspect_gguf(path)
        assert info.architecture == "qwen2" and info.vocab_size == 151936


# ---------------------------------------------------------------- fuzz
FUZZ_FILES = 600


def test_fuzz_accepted_files_never_crash_llama_cpp(tmp_path: Path) -> None:
    bases = base_docs()
    accepted: list[Path] = []
    for seed in range(FUZZ_FILES):
        rng = random.Random(seed)
        doc = copy.deepcopy(bases[seed % len(bases)])
        doc.seed = seed
        path = write_doc(mutate(doc, rng), tmp_path / f"fuzz{seed:04d}.gguf")
        try:
            inspect_gguf(path)  # anything but ModelFileError escaping is a bug
        except ModelFileError:
            path.unlink()
            continue
        accepted.append(path)
    results = run_in_subprocesses(accepted)
    status = Counter(s.split(" ")[0] for s in results.values())
    print(f"\nfuzz: {FUZZ_FILES} files, {len(accepted)} accepted; llama.cpp: {dict(status)}")
    crashed = {p.name: s for p, s in results.items() if s.startswith(("signal", "timeout"))}
    assert not crashed, f"accepted files crashed llama.cpp: {crashed}"
    assert len(accepted) >= FUZZ_FILES // 10  # the mutations must leave enough loadable files to mean something
    # the refusals left are mostly files renamed to architectures whose own tensors and keys they lack
    assert status["ok"] >= 0.8 * len(accepted), "too many accepted files that llama.cpp refuses"
