"""Tiny real GGUF models for tests and demos: llama architecture, byte-level GPT-2 tokenizer, F32 weights.

A test fixture, not part of the package: the tests import it (`from support.tiny import ...`, pytest puts tests/ on
their path), and so do the checkout's tools that need a model in seconds (scripts/check_wheel.sh and
scripts/gpu_check.sh write one to run an install on, bench/bench_server.py --tiny, bench/hostile_sweep.py,
docs/examples/desktop_app.py), with tests/ put on their path. It needs numpy and gguf only (no edgespec), so an
installed wheel can be checked with it.

llama.cpp loads one in milliseconds, so exactness can be tested through the real backend. The output layer is
built so that nearly all probability mass sits on a small "hot" set of tokens: dimension 0 of every token
embedding is a large constant that survives the (small) layers and the final RMS norm, and the output rows use it
as a bias (+bias for hot tokens, -bias for the rest). The next-token distribution is then spread over a handful
of tokens and still depends on the context through the remaining dimensions, which makes exact enumeration of the
target's distribution over the next 2-3 tokens cheap and chi-square cells well filled.

Also writes deliberately broken files (F64 weights, truncated files) for validation tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2.5-Coder's fill-in-the-middle tokens (llama.cpp recognises them by their text); only in models written with fim=True
FIM_TOKENS = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n"]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tiny_vocab(extra_tokens: int = 0, fim: bool = False) -> list[str]:
    """256 byte tokens (id = byte value), merged tokens, special tokens, the FIM tokens (fim), then `extra_tokens`
    fillers."""
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    tokens += [m.replace(" ", "") for m in MERGES]
    tokens += SPECIAL_TOKENS
    tokens += FIM_TOKENS if fim else []
    tokens += [f"<|extra_{i}|>" for i in range(extra_tokens)]
    return tokens


def token_id(text: str) -> int:
    """Id of a single-byte token in the tiny vocabulary."""
    (b,) = text.encode()
    return b


DEFAULT_HOT = tuple(token_id(c) for c in "abcdefgh ")


def write_tiny_model(
    path: str | Path,
    *,
    seed: int = 0,
    hot_tokens: Sequence[int] = DEFAULT_HOT,
    d_model: int = 32,
    n_layers: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    d_ff: int = 64,
    n_ctx_train: int = 2048,
    bias: float = 2.0,
    hot_scale: float = 1.0,
    layer_scale: float = 0.5,
    extra_tokens: int = 0,
    token_overrides: dict[int, str] | None = None,
    weight_dtype: type = np.float32,
    architecture: str = "llama",
    chat_template: str | None = CHATML_TEMPLATE,
    name: str = "edgespec-tiny",
    fim: bool = False,
    vocab: Sequence[str] | None = None,
    merges: Sequence[str] | None = None,
    split_max_tensors: int = 0,
    quant: str | None = None,
) -> Path:
    """Write a tiny llama-architecture GGUF model and return its path.

    Models written with the same `extra_tokens`/`token_overrides` share a tokenizer; `seed` changes the weights
    (a different seed gives a plausible but different "draft"). fim=True adds Qwen2.5-Coder's FIM control tokens
    (a different tokenizer from the default one: see write_tiny_fim_pair). `weight_dtype=np.float64` writes F64 matrices,
    which llama.cpp cannot compute (a validation test case). `merges` other than MERGES: another tokenizer with the
    same tokens. split_max_tensors > 0 writes a split model, <stem>-0000i-of-0000N.gguf (the first part's path is
    returned). `vocab`: a token list of the caller's (a foreign tokenizer: see write_tiny_foreign_draft).
    quant="q4_1" stores the layers' and the output's matrices as Q4_1 (llama.cpp's one CPU kernel for every batch
    size: the deterministic mode's tests).
    """
    import gguf

    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens = tiny_vocab(extra_tokens, fim) if vocab is None else list(vocab)
    for i, text in (token_overrides or {}).items():
        tokens[i] = text
    n_vocab = len(tokens)
    toktypes = [gguf.TokenType.NORMAL] * n_vocab
    if vocab is None:
        eos = 256 + len(MERGES)
        for i in range(eos, eos + len(SPECIAL_TOKENS) + (len(FIM_TOKENS) if fim else 0)):
            toktypes[i] = gguf.TokenType.CONTROL
    else:  # a vocabulary of the caller's: "<|...|>" and "<...>" tokens are control tokens, BOS the first, EOS <|im_end|>
        control = [i for i, t in enumerate(tokens) if len(t) > 2 and t.startswith("<") and t.endswith(">")]
        for i in control:
            toktypes[i] = gguf.TokenType.CONTROL
        eos = control[0]
    head_dim = d_model // n_head

    w = gguf.GGUFWriter(str(path), architecture, split_max_tensors=split_max_tensors)
    w.add_name(name)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(d_model)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(d_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(toktypes)
    w.add_token_merges(list(MERGES if merges is None else merges))
    w.add_bos_token_id(eos)
    w.add_eos_token_id(eos + 2 if vocab is None else tokens.index("<|im_end|>"))  # <|im_end|> ends an answer, as in chat models
    w.add_add_bos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    def mat(rows: int, cols: int, scale: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)).astype(weight_dtype)

    def put(name: str, m: np.ndarray) -> None:
        if quant is None or m.dtype != np.float32:
            w.add_tensor(name, m)
            return
        kind = {"q4_1": gguf.GGMLQuantizationType.Q4_1}[quant]
        w.add_tensor(name, gguf.quants.quantize(m, kind), raw_dtype=kind)

    emb = rng.standard_normal((n_vocab, d_model)).astype(np.float32)
    emb[:, 0] = 8.0
    out = (rng.standard_normal((n_vocab, d_model)) * 0.1).astype(np.float32)
    out[:, 0] = -bias
    hot = np.asarray(list(hot_tokens), dtype=np.int64)
    out[hot, 1:] = rng.standard_normal((len(hot), d_model - 1)) * hot_scale
    out[hot, 0] = bias
    w.add_tensor("token_embd.weight", emb)
    w.add_tensor("output_norm.weight", np.ones(d_model, dtype=np.float32))
    put("output.weight", out.astype(weight_dtype))
    s = layer_scale
    for i in range(n_layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(d_model, dtype=np.float32))
        put(f"blk.{i}.attn_q.weight", mat(d_model, d_model, 2.0))
        put(f"blk.{i}.attn_k.weight", mat(n_head_kv * head_dim, d_model, 2.0))
        put(f"blk.{i}.attn_v.weight", mat(n_head_kv * head_dim, d_model, s))
        put(f"blk.{i}.attn_output.weight", mat(d_model, d_model, s))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(d_model, dtype=np.float32))
        put(f"blk.{i}.ffn_gate.weight", mat(d_ff, d_model, 1.0))
        put(f"blk.{i}.ffn_up.weight", mat(d_ff, d_model, 1.0))
        put(f"blk.{i}.ffn_down.weight", mat(d_model, d_ff, s))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if split_max_tensors:
        return sorted(path.parent.glob(f"{path.stem}-00001-of-*.gguf"))[0]
    return path


def write_truncated_copy(src: str | Path, dst: str | Path, keep_fraction: float = 0.6) -> Path:
    data = Path(src).read_bytes()
    dst = Path(dst)
    dst.write_bytes(data[: int(len(data) * keep_fraction)])
    return dst


def write_tiny_fim_pair(directory: str | Path) -> dict[str, Path]:
    """A target and a draft that know fill-in-the-middle (their vocabulary has FIM tokens; the weights are as
    random as the standard set's, so the middle they write is not meaningful code)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    return {
        "target": write_tiny_model(d / "tiny-fim-target.gguf", seed=1, name="tiny-fim-target", fim=True),
        "draft": write_tiny_model(d / "tiny-fim-draft.gguf", seed=2, layer_scale=0.4, name="tiny-fim-draft", fim=True),
    }


def write_tiny_set(directory: str | Path) -> dict[str, Path]:
    """The standard set used by tests and `edgespec demo`: a target, a compatible draft, a bad draft, a draft
    equal to the target, mismatched-vocabulary models (one of another script), and broken files."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    files = {
        "target": write_tiny_model(d / "tiny-target.gguf", seed=1, name="tiny-target"),
        "draft": write_tiny_model(d / "tiny-draft.gguf", seed=2, layer_scale=0.4, name="tiny-draft"),
        "bad_draft": write_tiny_model(
            d / "tiny-bad-draft.gguf", seed=3, hot_tokens=tuple(token_id(c) for c in "stuvwxyz"), name="tiny-bad"
        ),
        "mismatch_text": write_tiny_model(
            d / "tiny-mismatch-text.gguf", seed=4, token_overrides={100: "zz", 101: "yy"}, name="tiny-mismatch"
        ),
        "mismatch_size": write_tiny_model(d / "tiny-mismatch-size.gguf", seed=5, extra_tokens=300, name="tiny-big"),
        "f64": write_tiny_model(d / "tiny-f64.gguf", seed=6, weight_dtype=np.float64, name="tiny-f64"),
    }
    files["other_script"] = write_tiny_other_script(d / "tiny-other-script.gguf")  # shares no ordinary token
    files["truncated"] = write_truncated_copy(files["target"], d / "tiny-truncated.gguf")
    text = d / "not-a-model.gguf"
    text.write_text("this is a text file, not a GGUF model\n")
    files["text"] = text
    return files


# A tokenizer of another family for cross-vocabulary drafting: the byte tokens in reverse order (other ids), other
# merges (" a", "bc", "abc": text splits differently than with MERGES) and other control tokens (<|im_end|> shared).
FOREIGN_MERGES = ["Ġ a", "b c", "a bc"]
FOREIGN_SPECIAL = ["<s>", "</s>", "<|im_end|>", "<unused0>"]


def foreign_vocab() -> list[str]:
    b2u = bytes_to_unicode()
    return [m.replace(" ", "") for m in FOREIGN_MERGES] + FOREIGN_SPECIAL + [b2u[b] for b in range(255, -1, -1)]


def write_tiny_foreign_draft(path: str | Path, *, seed: int = 2, layer_scale: float = 0.4, **kw: object) -> Path:
    """A draft whose tokenizer differs from the standard one (foreign_vocab): its hot tokens are the target's hot
    characters at their ids here."""
    vocab = foreign_vocab()
    b2u = bytes_to_unicode()
    hot = tuple(vocab.index(b2u[ord(c)]) for c in "abcdefgh ")
    return write_tiny_model(
        path, seed=seed, layer_scale=layer_scale, vocab=vocab, merges=FOREIGN_MERGES, hot_tokens=hot,
        name="tiny-foreign-draft", **kw,  # type: ignore[arg-type]
    )


def write_tiny_other_script(path: str | Path, **kw: object) -> Path:
    """A model of another script: its ordinary tokens are Cyrillic, none of them a token of the standard vocabulary
    (only its header is read: a pair with it is refused before any weights load)."""
    letters = [chr(0x430 + i) for i in range(32)]
    vocab = letters + [a + b for a in letters[:8] for b in letters[:8]] + ["<s>", "<|im_end|>"]
    return write_tiny_model(path, vocab=vocab, merges=[letters[0] + " " + letters[1]], hot_tokens=(0, 1, 2), name="tiny-other-script", **kw)  # type: ignore[arg-type]
