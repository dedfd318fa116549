"""Look at a GGUF file before llama.cpp sees it.

llama.cpp kills the whole process on some malformed files (F64 or Q8_K weights segfault in matmul, a block count of
0 or a duplicated token trips a GGML_ASSERT), so everything that can be checked from the file itself is checked
here: the path (a regular, readable file), magic, version, the header structure, and then llama.cpp's own limits on
the header values (`edgespec.llama.gguf_rules`). A bad file raises `ModelFileError` with one line that says what is
wrong. Only the header is read (a struct-based reader, well under a second for a 152k-token vocabulary).

Pair compatibility (same tokenizer for draft and target) is also decided here, from metadata alone, before any
weights load.
"""

from __future__ import annotations

import array
import errno
import hashlib
import math
import mmap
import os
import stat
import struct
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from edgespec.errors import ModelFileError
from .gguf_header import GGUFHeader, TensorInfo
from .gguf_rules import GGML_TYPES, RuleError, check, shown

GGUF_MAGIC = b"GGUF"
# llama.cpp's own tolerance for draft/target vocabularies (common/speculative.cpp).
VOCAB_MAX_SIZE_DIFFERENCE = 128
VOCAB_CHECK_START_TOKEN_ID = 5
_MIN_HEADER = 24  # magic, version, tensor count, key/value count
# the special tokens a draft must agree on with its target: the ones speculation emits, stops on or lays out
# (tokenizer.ggml.<key>_token_id)
SPECIAL_ID_KEYS = ("bos", "eos", "eot", "eom", "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep",
                   "prefix", "suffix", "middle")
# the tokenizer arrays whose bytes must be identical for two files to share a tokenizer family (token text is
# compared id by id by check_pair, with llama.cpp's tolerance for padded vocabularies)
FAMILY_ARRAYS = ("tokenizer.ggml.merges",)


@dataclass
class GGUFInfo:
    path: Path
    file_size: int
    version: int
    architecture: str
    name: str | None
    n_params: int
    n_tensors: int
    tensor_types: dict[str, int]  # type name -> count
    file_type: str | None
    context_length: int | None
    tokenizer_model: str | None
    tokenizer_pre: str | None
    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int | None
    add_bos_token: bool | None
    chat_template: str | None
    tokens: list[str] = field(repr=False, default_factory=list)
    # sha256 of each tokenizer.ggml.* array's raw bytes (GGUFHeader.digests) and the special ids speculation
    # touches (SPECIAL_ID_KEYS present in the file): what tokenizer_family hashes
    tokenizer_digests: dict[str, str] = field(repr=False, default_factory=dict)
    special_ids: dict[str, int] = field(repr=False, default_factory=dict)
    token_types: list[int] = field(repr=False, default_factory=list)  # tokenizer.ggml.token_type (empty: not given)

    @property
    def quantization(self) -> str:
        if self.file_type:
            return self.file_type
        if not self.tensor_types:
            return "unknown"
        return max(self.tensor_types.items(), key=lambda kv: kv[1])[0]

    def summary(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "file_size": self.file_size,
            "architecture": self.architecture,
            "name": self.name,
            "parameters": self.n_params,
            "quantization": self.quantization,
            "tensor_types": self.tensor_types,
            "context_length": self.context_length,
            "tokenizer": self.tokenizer_model,
            "tokenizer_pre": self.tokenizer_pre,
            "vocab_size": self.vocab_size,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "add_bos_token": self.add_bos_token,
            "chat_template": self.chat_template is not None,
        }


def _file_type_name(value: Any) -> str | None:
    if value is None:
        return None
    try:
        from gguf import LlamaFileType

        return LlamaFileType(int(value)).name.removeprefix("MOSTLY_")
    except Exception:
        return str(value)


def inspect_gguf(path: str | os.PathLike[str]) -> GGUFInfo:
    """Validate `path` and return its metadata. Raises ModelFileError with a one-line reason."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        if p.is_symlink():
            raise ModelFileError(f"{p}: broken symlink (its target {os.readlink(p)} does not exist)") from None
        raise ModelFileError(f"{p}: no such file") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ModelFileError(f"{p}: symlink loop (the path cannot be resolved)") from None
        raise ModelFileError(f"{p}: cannot read ({e.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise ModelFileError(f"{p}: is a directory, not a GGUF file")
    if not stat.S_ISREG(st.st_mode):
        raise ModelFileError(f"{p}: is a {_file_kind(st.st_mode)}, not a regular file")
    return _inspect_cached(str(p.resolve()), st.st_size, st.st_mtime_ns)


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device")):
        if test(mode):
            return kind
    return "special file"


@lru_cache(maxsize=16)
def _inspect_cached(path: str, size: int, mtime_ns: int) -> GGUFInfo:
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            head = fh.read(_MIN_HEADER)
    except OSError as e:
        raise ModelFileError(f"{p}: cannot read ({e.strerror})") from None
    if not head:
        raise ModelFileError(f"{p}: empty file (0 bytes), not a GGUF model")
    if head[:4] != GGUF_MAGIC[: len(head)]:
        raise ModelFileError(f"{p}: not a GGUF file (bad magic {head[:4]!r}, expected b'GGUF')")
    if len(head) < _MIN_HEADER:
        raise ModelFileError(f"{p}: truncated file ({len(head)} bytes; a GGUF header needs at least {_MIN_HEADER})")
    version = int.from_bytes(head[4:8], "little")
    if version not in (2, 3):
        hint = " (a big-endian file? llama.cpp reads little-endian GGUF)" if version and not version & 0xFFFF else ""
        raise ModelFileError(f"{p}: unsupported GGUF version {version}{hint}; llama.cpp reads versions 2 and 3")
    try:
        h = read_header(p)
    except _Truncated:
        raise ModelFileError(f"{p}: truncated file (the GGUF header runs past the end of the file)") from None
    except (ValueError, UnicodeDecodeError, OverflowError, MemoryError) as e:
        raise ModelFileError(f"{p}: damaged GGUF header ({e})") from None
    try:
        check(h)
    except RuleError as e:
        raise ModelFileError(f"{p}: {e}") from None
    return header_info(p, h)


def header_info(p: Path, h: GGUFHeader) -> GGUFInfo:
    """The GGUFInfo of a header read by read_header (and checked by the caller: a split model's first part is
    read whole but cannot pass the rules alone, its tensors being spread over the parts)."""
    kv = h.kv
    arch = kv["general.architecture"]
    types: dict[str, int] = {}
    for t in h.tensors:
        name = GGML_TYPES[t.ttype].name
        types[name] = types.get(name, 0) + 1
    tokens = kv["tokenizer.ggml.tokens"]
    ctx = kv.get(f"{arch}.context_length")
    add_bos = kv.get("tokenizer.ggml.add_bos_token")
    return GGUFInfo(
        path=p,
        file_size=h.file_size,
        version=h.version,
        architecture=arch,
        name=_text(kv.get("general.name")),
        n_params=sum(math.prod(t.dims) for t in h.tensors),
        n_tensors=len(h.tensors),
        tensor_types=types,
        file_type=_file_type_name(kv.get("general.file_type")),
        context_length=int(ctx) if ctx is not None else None,
        tokenizer_model=kv.get("tokenizer.ggml.model"),
        tokenizer_pre=kv.get("tokenizer.ggml.pre"),
        vocab_size=len(tokens),
        bos_token_id=_opt_int(kv.get("tokenizer.ggml.bos_token_id")),
        eos_token_id=_opt_int(kv.get("tokenizer.ggml.eos_token_id")),
        add_bos_token=bool(add_bos) if add_bos is not None else None,
        chat_template=_text(kv.get("tokenizer.chat_template")),
        tokens=list(tokens),
        tokenizer_digests=dict(h.digests),
        special_ids={k: int(kv[f"tokenizer.ggml.{k}_token_id"]) for k in SPECIAL_ID_KEYS
                     if isinstance(kv.get(f"tokenizer.ggml.{k}_token_id"), int)},
        token_types=list(kv.get("tokenizer.ggml.token_type") or ()),
    )


class _Truncated(Exception):
    pass


# GGUF value types (gguf_type): scalar struct formats; 8 = string, 9 = array.
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_UINT32, _INT32, _STRING, _ARRAY = 4, 5, 8, 9
_MAX_COUNT = 1 << 30  # refuse absurd counts rather than allocate
_MAX_STRING = 1 << 30  # GGUF_MAX_STRING_LENGTH (ggml/src/gguf.cpp)
_MAX_DIMS = 4  # GGML_MAX_DIMS
_KEEP_NUMBERS = 4096  # per-layer hyperparameter arrays are decoded, per-token arrays are not
_DEFAULT_ALIGNMENT = 32
_U64 = struct.Struct("<Q")


def read_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Parse the GGUF header of `path` (magic and version are the caller's to check).

    A small struct-based reader: gguf.GGUFReader builds one numpy view per array element and takes ~50 s on
    the 151,936-token vocabulary of the default model; this reads the same header in well under a second.
    Raises _Truncated when the header runs past the end of the file, ValueError when it is malformed.
    """
    with open(path, "rb") as fh:
        try:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # empty file
            raise _Truncated() from None
    r = _Reader(mm)
    try:
        version, n_tensors, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
        if n_tensors > _MAX_COUNT or n_kv > _MAX_COUNT:
            raise ValueError(f"implausible counts ({n_tensors:,} tensors, {n_kv:,} keys)")
        kv, kv_types, lengths = _read_metadata(r, n_kv)
        tensors = [_read_tensor_info(r) for _ in range(n_tensors)]
        align = kv.get("general.alignment")
        if kv_types.get("general.alignment") != (_UINT32, None) or not align or align & (align - 1):
            align = _DEFAULT_ALIGNMENT  # an invalid value is reported by gguf_rules
        data_start = (r.pos + align - 1) // align * align
        digests = {k: hashlib.sha256(r.buf[a:b]).hexdigest() for k, (a, b) in r.spans.items()}
        return GGUFHeader(version, kv, kv_types, lengths, tensors, align, data_start, r.n_buf, digests)
    finally:
        r.buf.release()  # the mmap cannot close while a view of it is alive
        mm.close()


class _Reader:
    """A cursor (`pos`) over a mapped GGUF file, from just after the magic: each read checks the end of the file
    (_Truncated) and the format's limits (ValueError)."""

    def __init__(self, mm: mmap.mmap) -> None:
        self.mm = mm
        self.buf = memoryview(mm)
        self.n_buf = len(self.buf)
        self.pos = 4
        self.spans: dict[str, tuple[int, int]] = {}  # tokenizer.ggml.* arrays: where their bytes are

    def take(self, fmt: str) -> Any:
        sz = struct.calcsize(fmt)
        if self.pos + sz > self.n_buf:
            raise _Truncated()
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += sz
        return v

    def string(self) -> str:
        n = self.take("<Q")
        if n > _MAX_STRING:
            raise ValueError(f"string of {n:,} bytes")
        if self.pos + n > self.n_buf:
            raise _Truncated()
        s = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", "surrogateescape")
        self.pos += n
        return s

    def array(self, key: str, etype: int, count: int) -> Any:
        if count > _MAX_COUNT:
            raise ValueError(f"array {shown(key)} of {count:,} elements")
        start = self.pos
        if etype == _STRING:
            # merges are walked past, not decoded
            out = self._strings(count, keep=key == "tokenizer.ggml.tokens" or not key.startswith("tokenizer.ggml."))
        elif etype not in _SCALAR:
            raise ValueError(f"array {shown(key)} has element type {etype}")
        else:
            out = self._numbers(key, etype, count)
        if key.startswith("tokenizer.ggml."):
            self.spans[key] = (start, self.pos)
        return out

    def _strings(self, count: int, keep: bool) -> list[str] | None:
        # tight loop: 151k-entry vocabularies and merge lists
        mm, n_buf = self.mm, self.n_buf
        unpack_q = _U64.unpack_from
        out: list[str] | None = [] if keep else None
        p0 = self.pos
        for _ in range(count):
            if p0 + 8 > n_buf:
                raise _Truncated()
            (n,) = unpack_q(mm, p0)
            p0 += 8
            if p0 + n > n_buf:
                raise _Truncated()
            if out is not None:
                out.append(mm[p0 : p0 + n].decode("utf-8", "surrogateescape"))
            p0 += n
        self.pos = p0
        return out

    def _numbers(self, key: str, etype: int, count: int) -> Any:
        mm, pos = self.mm, self.pos
        fmt = _SCALAR[etype]
        size = struct.calcsize(fmt) * count
        if pos + size > self.n_buf:
            raise _Truncated()
        if key == "tokenizer.ggml.precompiled_charsmap" and size == count:  # UINT8/INT8 bytes
            values: Any = mm[pos : pos + size]
        elif key == "tokenizer.ggml.token_type" and etype == _INT32:
            values = array.array("i", mm[pos : pos + size])
            if sys.byteorder == "big":
                values.byteswap()
        elif count <= _KEEP_NUMBERS:
            values = list(struct.unpack_from(f"<{count}{fmt[1]}", self.buf, pos))
        else:
            values = None
        self.pos = pos + size
        return values


def _read_metadata(r: _Reader, n_kv: int) -> tuple[dict[str, Any], dict[str, tuple[int, int | None]], dict[str, int]]:
    """The n_kv key/value pairs: (values, key -> (value type, element type of an array), array lengths)."""
    kv: dict[str, Any] = {}
    kv_types: dict[str, tuple[int, int | None]] = {}
    lengths: dict[str, int] = {}
    for _ in range(n_kv):
        key = r.string()
        if not key:
            raise ValueError("empty metadata key")
        if key in kv:
            raise ValueError(f"duplicate metadata key {shown(key)}")
        vtype = r.take("<I")
        if vtype == _ARRAY:
            etype, count = r.take("<I"), r.take("<Q")
            kv_types[key], lengths[key] = (vtype, etype), count
            kv[key] = r.array(key, etype, count)
        elif vtype == _STRING:
            kv_types[key], kv[key] = (vtype, None), r.string()
        elif vtype in _SCALAR:
            kv_types[key], kv[key] = (vtype, None), r.take(_SCALAR[vtype])
        else:
            raise ValueError(f"key {shown(key)} has unknown value type {vtype}")
    return kv, kv_types, lengths


def _read_tensor_info(r: _Reader) -> TensorInfo:
    """One tensor's name, shape, type and data offset."""
    name = r.string()
    n_dims = r.take("<I")
    if n_dims > _MAX_DIMS:
        raise ValueError(f"tensor {shown(name)} has {n_dims} dimensions (at most {_MAX_DIMS})")
    dims = [r.take("<Q") for _ in range(n_dims)]
    if any(d >= 1 << 63 for d in dims) or math.prod(dims) >= 1 << 63:
        raise ValueError(f"tensor {shown(name)} has an impossible shape {dims}")
    return TensorInfo(name, dims, r.take("<I"), r.take("<Q"))


def _text(v: Any) -> str | None:
    """A free-text metadata value (gguf_rules does not check these keys' types)."""
    return v if isinstance(v, str) else None


def _opt_int(v: Any) -> int | None:
    return int(v) if v is not None else None


@dataclass(frozen=True)
class Compatibility:
    ok: bool
    problems: tuple[str, ...]

    def verdict(self) -> str:
        return "compatible" if self.ok else "incompatible: " + "; ".join(self.problems)


def check_pair(target: GGUFInfo, draft: GGUFInfo) -> Compatibility:
    """Can `draft` propose tokens for `target`? Same rules as llama.cpp's speculative example, plus BOS/EOS and
    add-BOS behaviour: same tokenizer model, vocabulary sizes within 128, identical token text for every shared id
    (from id 5 on, as llama.cpp does), same BOS/EOS ids and add-BOS flag."""
    problems: list[str] = []
    if target.tokenizer_model != draft.tokenizer_model:
        problems.append(f"tokenizer model differs (target {target.tokenizer_model}, draft {draft.tokenizer_model})")
    diff = abs(target.vocab_size - draft.vocab_size)
    if diff > VOCAB_MAX_SIZE_DIFFERENCE:
        problems.append(
            f"vocabulary sizes differ by {diff} (target {target.vocab_size}, draft {draft.vocab_size}; "
            f"at most {VOCAB_MAX_SIZE_DIFFERENCE} allowed)"
        )
    n = min(target.vocab_size, draft.vocab_size)
    mismatched = [i for i in range(VOCAB_CHECK_START_TOKEN_ID, n) if target.tokens[i] != draft.tokens[i]]
    if mismatched:
        i = mismatched[0]
        problems.append(
            f"{len(mismatched)} token(s) have different text, first id {i} "
            f"(target {target.tokens[i]!r}, draft {draft.tokens[i]!r})"
        )
    for what in ("bos_token_id", "eos_token_id", "add_bos_token"):
        a, b = getattr(target, what), getattr(draft, what)
        if a != b:
            problems.append(f"{what} differs (target {a}, draft {b})")
    return Compatibility(not problems, tuple(problems))


def tokenizer_family(info: GGUFInfo) -> str:
    """A short hash of what two files must share exactly to pair: tokenizer model and pre-tokenizer, the merges
    (every one of them), the add-BOS flag and the special ids in SPECIAL_ID_KEYS. Token text is check_pair's
    (a padded vocabulary still pairs); same family and check_pair ok: the draft can serve the target."""
    parts = [f"model={info.tokenizer_model}", f"pre={info.tokenizer_pre}", f"add_bos={info.add_bos_token}"]
    parts += [f"{k}={info.tokenizer_digests.get(k)}" for k in FAMILY_ARRAYS]
    parts += [f"{k}={v}" for k, v in sorted(info.special_ids.items())]
    return hashlib.sha256("\n".join(parts).encode("utf-8", "surrogateescape")).hexdigest()[:16]
