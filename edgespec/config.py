"""Frozen settings shared by every layer: which model to load, how to sample, how to speculate.

Validation happens here, once, so the library, the CLI and the server refuse bad values (out of range, or of the
wrong type: `max_tokens=2.5`, `temperature="0"`) with the same one-line ConfigError.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .errors import ConfigError, EdgespecError


class DrafterKind(str, Enum):
    """How a generation drafts (edgespec.drafting builds each). A str Enum: a kind equals, formats and
    serialises (JSON) as its name, so `kind == "ngram"` and f"{kind}" read as before."""

    MODEL = "model"  # a draft GGUF model
    NGRAM = "ngram"  # prompt lookup
    SUFFIX = "suffix"  # token trees from a suffix index over everything the engine has seen
    MODEL_NGRAM = "model+ngram"  # the lookup when it has a proposal worth verifying, the draft model otherwise
    MODEL_SUFFIX = "model+suffix"  # the same with the suffix index
    NONE = "none"  # plain decoding

    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]  # str's format, not Enum's

    @property
    def needs_draft_model(self) -> bool:
        return self in (DrafterKind.MODEL, DrafterKind.MODEL_NGRAM, DrafterKind.MODEL_SUFFIX)

    @property
    def uses_tree(self) -> bool:
        """A suffix drafter: needs a memory (SuffixIndex) and a target loaded with tree sequences."""
        return self in (DrafterKind.SUFFIX, DrafterKind.MODEL_SUFFIX)

    @property
    def uses_ngram(self) -> bool:
        return self in (DrafterKind.NGRAM, DrafterKind.MODEL_NGRAM)


MAX_CTX = 1 << 20  # a context of a million tokens is far past what a laptop holds; larger numbers are mistakes
MAX_SEED = 2**64 - 1
# JSON from outside (request bodies, schema files, tool-call arguments, schemas an app passes) nests at most this many
# levels (edgespec/untrusted.py); EDGESPEC_MAX_JSON_DEPTH changes it, up to MAX_JSON_DEPTH_CEILING (past that,
# Python's own parser and encoder run out of stack)
MAX_JSON_DEPTH_ENV = "EDGESPEC_MAX_JSON_DEPTH"
DEFAULT_MAX_JSON_DEPTH = 100
MAX_JSON_DEPTH_CEILING = 500
MAX_RPC_SERVERS = 16  # ggml-rpc's GGML_RPC_MAX_SERVERS
MAX_DEVICES = 16  # llama_max_devices(): the length of llama_model_params.tensor_split
_RPC_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252})")  # a host name or an IPv4 address (ggml-rpc has no IPv6)


def check_int(name: str, v: Any, lo: int | None = None, hi: int | None = None) -> int:
    """v as an int in [lo, hi] (either end open when None), else a ConfigError naming `name`."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ConfigError(f"{name} must be an integer, got {v!r}")
    v = int(v)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        where = f"at least {lo}" if hi is None else f"in [{lo}, {hi}]" if lo is not None else f"at most {hi}"
        raise ConfigError(f"{name} must be {where}, got {v}")
    return v


def _real(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
        raise ConfigError(f"{name} must be a finite number, got {v!r}")
    return float(v)


@dataclass(frozen=True)
class ModelSpec:
    """How to load one GGUF model.

    n_gpu_layers: layers offloaded to the GPU (-1 = all, 0 = CPU only). Ignored by CPU-only builds.
    n_threads: CPU threads, fixed (None = chosen while running from measured decode speed among all cores this
        process may use, one fewer and half of them: the count follows the machine's load; see threads.py).
    n_ctx: context window in tokens (prompt + output).
    n_batch: largest number of tokens per llama_decode call (prefill is split into chunks of this size; a
        cancel request is seen between chunks).
    rpc: llama.cpp RPC servers ("host:port", `edgespec rpc-server` on each host; a list, or one comma-separated
        string) whose devices hold the model's layers, split by their free memory (with this machine's GPU, if
        any, after them). With rpc, n_gpu_layers 0 (the default) or -1 puts every layer there; N > 0 puts N there
        and keeps the rest on this machine's CPU. The protocol has no authentication: trusted networks only.
    tensor_split: the share of the offloaded layers each device gets, in device order (the RPC servers' devices in
        the order given, then this machine's GPUs), as llama.cpp's --tensor-split: (3, 1) puts three quarters on
        the first; a share of 0 leaves a device out. Empty: llama.cpp's default, by each device's free memory.
    deterministic: every decode of a position gives bit-identical logits whatever else is in the batch (the batch
        size, other slots' rows, the thread count): batch-invariant kernels only, flash attention, a q8_0 KV cache,
        one cache stream per sequence (no token trees); checked at load (docs/determinism.md).
    """

    path: str
    n_gpu_layers: int = 0
    n_threads: int | None = None
    n_ctx: int = 4096
    n_batch: int = 512
    rpc: tuple[str, ...] = ()
    tensor_split: tuple[float, ...] = ()
    deterministic: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.path, (str, os.PathLike)):
            raise ConfigError(f"a model path must be a string or path, got {type(self.path).__name__}")
        object.__setattr__(self, "path", os.fspath(self.path))
        check_int("n_ctx", self.n_ctx, 8, MAX_CTX)
        check_int("n_batch", self.n_batch, 1, MAX_CTX)
        if self.n_threads is not None:
            check_int("n_threads", self.n_threads, 1, 1024)
        check_int("n_gpu_layers", self.n_gpu_layers, -1, 100_000)
        object.__setattr__(self, "rpc", check_rpc_endpoints(self.rpc))
        object.__setattr__(self, "tensor_split", check_tensor_split(self.tensor_split))
        if not isinstance(self.deterministic, bool):
            raise ConfigError(f"deterministic must be True or False, got {self.deterministic!r}")


def split_rpc_endpoint(endpoint: str) -> tuple[str, int]:
    """"host:port" as (host, port), else a ConfigError (ggml-rpc parses it the same way: host up to the colon)."""
    host, sep, port = endpoint.strip().rpartition(":")
    if host.startswith("[") or host.count(":"):
        raise ConfigError(f"an RPC server must be given by a host name or IPv4 address, got {endpoint[:80]!r}: llama.cpp's RPC "
                          "backend connects over IPv4 only (no IPv6)")
    if not sep or not _RPC_HOST.fullmatch(host) or not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise ConfigError(f"an RPC server must be given as host:port (a host name or IPv4 address, a port in [1, 65535]), got {endpoint[:80]!r}")
    return host, int(port)


def check_rpc_endpoints(rpc: Any) -> tuple[str, ...]:
    """RPC servers as a tuple of "host:port": a comma-separated string or a list/tuple of them; a ConfigError for a
    bad one, a repeated one or more than MAX_RPC_SERVERS."""
    if rpc is None:
        return ()
    if isinstance(rpc, str):
        rpc = [p for p in rpc.split(",") if p.strip()]
    if not isinstance(rpc, (list, tuple)) or not all(isinstance(e, str) for e in rpc):
        raise ConfigError("rpc must be a list of \"host:port\" strings (or one comma-separated string)")
    out = tuple("%s:%d" % split_rpc_endpoint(e) for e in rpc)
    if len(set(out)) != len(out):
        raise ConfigError(f"an RPC server is listed twice: {', '.join(out)}")
    if len(out) > MAX_RPC_SERVERS:
        raise ConfigError(f"at most {MAX_RPC_SERVERS} RPC servers, got {len(out)}")
    return out


def check_tensor_split(split: Any) -> tuple[float, ...]:
    """Shares per device as a tuple of floats: a comma-separated string ("3,1") or a sequence of numbers, each finite
    and >= 0, at least one > 0, at most MAX_DEVICES; () for None or empty. A ConfigError otherwise."""
    if split is None:
        return ()
    if isinstance(split, str):
        parts = [p.strip() for p in split.split(",")] if split.strip() else []
        try:
            split = [float(p) for p in parts]
        except ValueError:
            raise ConfigError(f"tensor_split must be numbers separated by commas (e.g. 3,1), got {split[:80]!r}") from None
    if not isinstance(split, (list, tuple)):
        raise ConfigError(f"tensor_split must be a sequence of numbers, got {type(split).__name__}")
    out = tuple(_real("a tensor_split share", v) for v in split)
    if not out:
        return ()
    if len(out) > MAX_DEVICES:
        raise ConfigError(f"tensor_split has {len(out)} shares; llama.cpp splits over at most {MAX_DEVICES} devices")
    if any(v < 0 for v in out) or not any(v > 0 for v in out):
        raise ConfigError(f"tensor_split shares must be >= 0 with at least one > 0, got {','.join(f'{v:g}' for v in out)}")
    return out


# the penalties' bound: far past any useful value, and small enough that penalised float32 logits stay finite
MAX_PENALTY = 1e6


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. The same settings define the target distribution p on the plain path and
    in speculative verification, so both sample from the same distribution. Each filter is off unless set: what is
    used when no sampling is given at all is DEFAULT_SAMPLING (llama.cpp's defaults: temperature 0.8, top_k 40,
    top_p 0.95, min_p 0.05); `dataclasses.replace(DEFAULT_SAMPLING, temperature=0.6)` changes one of them.

    temperature: 0 = greedy (argmax; ties go to the lowest token id).
    top_k: keep the k most likely tokens (0 = off).
    top_p: keep the smallest set of most likely tokens whose mass reaches top_p (1.0 = off).
    min_p: drop tokens whose probability is below min_p times the most likely token's (0 = off).
    repeat_penalty: llama.cpp-style: logits of tokens in the last `repeat_last_n` tokens are divided by it when
        positive, multiplied when negative (1.0 = off).
    presence_penalty / frequency_penalty: OpenAI-style, subtracted from the logits of tokens seen in the window
        (once / per occurrence) (0 = off).
    seed: None = a fresh random seed each generation; else an integer in [0, 2**64). The same seed on the same
        engine (same calibration) reproduces the output.
    infill: apply llama.cpp's `infill` sampler last (after min_p), as the editor plugins' chain
        ["top_k", "top_p", "infill"] asks: among the surviving tokens, those whose text extends another's are
        merged, unlikely ones dropped, and the completion ends where no text token is likely enough
        (infill.infill_filter). Needs the model's vocabulary (the engine passes it); not with a constraint.
    """

    temperature: float = 0.8
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_last_n: int = 64
    seed: int | None = None
    infill: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.infill, bool):
            raise ConfigError("infill must be True or False")
        if not (0.0 <= _real("temperature", self.temperature)):
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not (abs(_real(name, getattr(self, name))) <= MAX_PENALTY):
                raise ConfigError(f"{name} must be in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}], got {getattr(self, name)}")
        check_int("top_k", self.top_k, 0)
        if not (0.0 < _real("top_p", self.top_p) <= 1.0):
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if not (0.0 <= _real("min_p", self.min_p) < 1.0):
            raise ConfigError(f"min_p must be in [0, 1), got {self.min_p}")
        if not (1.0 / MAX_PENALTY <= _real("repeat_penalty", self.repeat_penalty) <= MAX_PENALTY):
            raise ConfigError(f"repeat_penalty must be in [{1 / MAX_PENALTY:g}, {MAX_PENALTY:g}], got {self.repeat_penalty}")
        check_int("repeat_last_n", self.repeat_last_n, 0)
        if self.seed is not None:
            check_int("seed", self.seed, 0, MAX_SEED)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def uses_history(self) -> bool:
        """True when the distribution depends on earlier tokens (a penalty is on)."""
        return self.repeat_last_n > 0 and (
            self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        )


# The default sampling of the library (Engine.stream/generate, ChatSession without `sampling`) and of the CLI (its
# --temperature/--top-k/--top-p/--min-p defaults): llama.cpp's own defaults (common_params_sampling, llama-cli,
# llama-server, llama-cpp-python's Llama.__call__), because what people compare edgespec with on a laptop are those
# tools, and the same prompt should then sample from the same distribution. A SamplingParams built by hand is exactly
# what it says (each filter off unless set); the server fixes its own defaults where the OpenAI API does
# (temperature 1.0, top_p 1.0, no top_k/min_p: docs/server.md).
DEFAULT_SAMPLING = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
# The server's defaults for a key a request leaves out: the OpenAI API fixes temperature 1.0 and top_p 1.0 and has no
# top_k or min_p, and llama-server's /completion follows it here (schema reads these; /props reports them).
API_SAMPLING = SamplingParams(temperature=1.0)


@dataclass(frozen=True)
class SpecConfig:
    """How to speculate.

    draft_max: the most tokens a draft model drafts per cycle (the controller may draft fewer, or none);
        0 = never speculate.
    draft_min: the fewest tokens drafted when speculating at all.
    adaptive: let the controller pick the draft length each cycle from measured costs and acceptance;
        False = always draft `draft_max` (the classic fixed-K loop, n-gram lookups included).
    draft_temperature: None = the draft samples with the same settings as the target; otherwise its own
        temperature (other settings shared). Exactness never depends on this: q is always reported.
    ngram_n_max, ngram_n_min: the longest and shortest context suffix the n-gram lookup matches.
    ngram_draft_max: the most tokens an n-gram lookup drafts per cycle (adaptive mode; a lookup is free, so it
        may draft longer than the draft model when text is being copied).
    tree_nodes, tree_width: the largest token tree the suffix-index drafter ("suffix", "model+suffix") may verify
        in one decode, and the most candidates per node (width 1 = chains only). The tree actually verified is
        chosen from the measured costs each cycle and is often a short chain on a CPU.
    draft_siblings: the most alternative candidates a draft model's chain may carry per cycle (draft-model trees:
        where the draft is unsure of a token, its next-best candidates there, up to tree_width - 1 per position, are
        verified beside it as leaves in the same decode); 0 = chains only. Added only where the measured verify curve
        makes the extra rows pay (a GPU-like curve, rarely a CPU's); each one is a root-to-leaf path, so the target
        is loaded with draft_siblings + 1 llama.cpp sequences for the draft-model kinds.
    """

    draft_max: int = 8
    draft_min: int = 1
    adaptive: bool = True
    draft_temperature: float | None = None
    ngram_n_max: int = 4
    ngram_n_min: int = 2
    ngram_draft_max: int = 16
    tree_nodes: int = 8
    tree_width: int = 3
    draft_siblings: int = 4

    def __post_init__(self) -> None:
        check_int("draft_max", self.draft_max, 0, 64)
        check_int("ngram_draft_max", self.ngram_draft_max, 1, 64)
        check_int("draft_min", self.draft_min, 1)
        if self.draft_max and self.draft_min > self.draft_max:
            raise ConfigError(f"draft_min must be in [1, draft_max], got {self.draft_min}")
        if not isinstance(self.adaptive, bool):
            raise ConfigError("adaptive must be True or False")
        if self.draft_temperature is not None and not (_real("draft_temperature", self.draft_temperature) >= 0):
            raise ConfigError(f"draft_temperature must be >= 0, got {self.draft_temperature}")
        check_int("ngram_n_min", self.ngram_n_min, 1, 64)
        check_int("tree_nodes", self.tree_nodes, 1, 64)
        check_int("tree_width", self.tree_width, 1, 8)
        check_int("draft_siblings", self.draft_siblings, 0, 63)
        check_int("ngram_n_max", self.ngram_n_max, self.ngram_n_min, 64)


def check_tree_fits(model: ModelSpec, tree_nodes: int) -> None:
    """Refuse (ConfigError) a target whose batch cannot hold the token trees speculation verifies (the suffix
    drafters' trees; a draft model's chain with its siblings, draft_siblings + 1 paths).

    A tree of up to `tree_nodes` drafted nodes is verified in one llama_decode of tree_nodes + 1 tokens (the root is
    the context's last token), with one llama.cpp sequence per root-to-leaf path beside the main one (n_seq_max =
    tree_nodes + 1). llama.cpp asserts (a SIGABRT that kills the process: `n_outputs_max`) when a micro-batch
    (n_batch, at most n_ctx) is smaller than n_seq_max, and a tree larger than the batch cannot be decoded at all;
    each value is valid on its own, so the combination is checked here.
    """
    need = tree_nodes + 1
    batch = min(model.n_batch, model.n_ctx)
    if batch < need:
        which = f"n_batch={model.n_batch}" if model.n_batch <= model.n_ctx else f"n_ctx={model.n_ctx}"
        raise ConfigError(
            f"speculation verifies token trees of up to {tree_nodes} nodes ({need} tokens and {need} sequences in "
            f"one decode): the target's n_batch and n_ctx must be at least {need}, got {which} "
            f"(raise it, or lower SpecConfig.tree_nodes, or draft_siblings for a draft model)"
        )


# llama.cpp's limit on a context's sequences (LLAMA_MAX_SEQ in src/llama-cparams.h); past it llama_init_from_model fails
MAX_SEQUENCES = 256
MAX_PARALLEL = 64


def check_slots_fit(model: ModelSpec, parallel: int, tree_paths: int = 0) -> None:
    """Refuse (ConfigError) `parallel` slots that one context cannot hold: each slot takes 1 + tree_paths llama.cpp
    sequences; llama.cpp allows at most MAX_SEQUENCES of them, and asserts (a SIGABRT) when a micro-batch (n_batch, at
    most n_ctx) is smaller than the number of sequences."""
    check_int("parallel", parallel, 1, MAX_PARALLEL)
    n_seq = parallel * (1 + tree_paths)
    batch = min(model.n_batch, model.n_ctx)
    if n_seq > MAX_SEQUENCES or n_seq > batch:
        per = f"1 + {tree_paths} tree paths" if tree_paths else "1"
        raise ConfigError(
            f"parallel={parallel} slots of {per} sequences each need {n_seq} llama.cpp sequences: at most "
            f"{min(MAX_SEQUENCES, batch)} fit (llama.cpp's limit of {MAX_SEQUENCES} and the batch of {batch} tokens); "
            f"lower parallel{', tree_nodes or draft_siblings' if tree_paths else ''}"
        )


def max_json_depth() -> int:
    """The JSON nesting limit: EDGESPEC_MAX_JSON_DEPTH (an integer in [1, MAX_JSON_DEPTH_CEILING]) or
    DEFAULT_MAX_JSON_DEPTH; a ConfigError for any other value of the variable."""
    raw = os.environ.get(MAX_JSON_DEPTH_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_JSON_DEPTH
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_JSON_DEPTH_CEILING:
        raise ConfigError(f"{MAX_JSON_DEPTH_ENV} must be an integer in [1, {MAX_JSON_DEPTH_CEILING}], got {raw[:40]!r}")
    return n


def check_stop(stop: Any) -> tuple[str, ...]:
    """Stop strings as a tuple: None, a string, or a list/tuple of strings (empty ones dropped)."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,) if stop else ()
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise ConfigError("stop must be a string or a list of strings")
    return tuple(s for s in stop if s)


__all__ = ["EdgespecError", "ConfigError", "ModelSpec", "SamplingParams", "DEFAULT_SAMPLING", "API_SAMPLING", "SpecConfig", "check_int", "check_stop",
           "check_tree_fits", "check_slots_fit", "MAX_PARALLEL", "max_json_depth", "DEFAULT_MAX_JSON_DEPTH", "MAX_JSON_DEPTH_ENV",
           "check_rpc_endpoints", "split_rpc_endpoint", "check_tensor_split", "MAX_DEVICES"]
