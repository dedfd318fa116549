"""Look at a GGUF file with the `gguf` reader before llama.cpp sees it.

llama.cpp kills the whole process on some malformed files (F64 weight tensors segfault in matmul, for example),
so everything that can be checked from the file itself is checked here: magic, version, architecture known to
llama.cpp, tensor types llama.cpp computes, tensors that run past the end of the file. A bad file raises
`ModelFileError` with one line that says what is wrong.

Pair compatibility (same tokenizer for draft and target) is also decided here, from metadata alone, before any
weights load.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import IncompatiblePairError, ModelFileError

GGUF_MAGIC = b"GGUF"
# llama.cpp's own tolerance for draft/target vocabularies (common/speculative.cpp).
VOCAB_MAX_SIZE_DIFFERENCE = 128
VOCAB_CHECK_START_TOKEN_ID = 5


def _computable_types() -> frozenset[int]:
    """Tensor types llama.cpp's CPU backend can multiply/get rows of: floats except F64 and the quantized types.
    Integer types and F64 never hold weights that llama.cpp computes with."""
    from gguf import GGMLQuantizationType as T

    banned = {"F64", "I8", "I16", "I32", "I64"}
    return frozenset(t.value for t in T if t.name not in banned)


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
        size = p.stat().st_size
    except FileNotFoundError:
        raise ModelFileError(f"{p}: no such file") from None
    except OSError as e:
        raise ModelFileError(f"{p}: cannot read ({e.strerror})") from None
    if p.is_dir():
        raise ModelFileError(f"{p}: is a directory, not a GGUF file")
    return _inspect_cached(str(p.resolve()), size, p.stat().st_mtime_ns)


@lru_cache(maxsize=16)
def _inspect_cached(path: str, size: int, mtime_ns: int) -> GGUFInfo:
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            head = fh.read(8)
    except OSError as e:
        raise ModelFileError(f"{p}: cannot read ({e.strerror})") from None
    if len(head) < 8 or head[:4] != GGUF_MAGIC:
        raise ModelFileError(f"{p}: not a GGUF file (bad magic {head[:4]!r}, expected b'GGUF')")
    version = int.from_bytes(head[4:8], "little")
    if version not in (2, 3):
        raise ModelFileError(f"{p}: unsupported GGUF version {version} (llama.cpp reads versions 2 and 3)")
    try:
        kv, tensors, data_start = read_gguf_header(p)
    except _Truncated:
        raise ModelFileError(f"{p}: truncated file (the GGUF header runs past the end of the file)") from None
    except (ValueError, UnicodeDecodeError, OverflowError, MemoryError) as e:
        raise ModelFileError(f"{p}: damaged GGUF header ({e})") from None

    import gguf

    arch = kv.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelFileError(f"{p}: GGUF has no general.architecture")
    if arch not in set(gguf.MODEL_ARCH_NAMES.values()):
        raise ModelFileError(f"{p}: architecture '{arch}' is not one llama.cpp knows")
    if not tensors:
        raise ModelFileError(f"{p}: GGUF file holds no tensors")

    computable = _computable_types()
    types: dict[str, int] = {}
    n_params = 0
    for name, dims, ttype, offset in tensors:
        try:
            tname = gguf.GGMLQuantizationType(ttype).name
            block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ttype)]
        except (ValueError, KeyError):
            raise ModelFileError(f"{p}: tensor '{name}' has unknown type id {ttype}") from None
        types[tname] = types.get(tname, 0) + 1
        n = 1
        for d in dims:
            n *= d
        n_params += n
        if ttype not in computable:
            raise ModelFileError(f"{p}: tensor '{name}' has type {tname}, which llama.cpp cannot compute (it would crash)")
        if dims and dims[0] % block:
            raise ModelFileError(f"{p}: tensor '{name}' row of {dims[0]} is not a multiple of the {tname} block ({block})")
        end = data_start + offset + n // block * type_size
        if end > size:
            raise ModelFileError(
                f"{p}: truncated file: tensor '{name}' ends at byte {end:,} but the file has {size:,} bytes"
            )

    tokens = kv.get("tokenizer.ggml.tokens") or []
    ctx = kv.get(f"{arch}.context_length")
    add_bos = kv.get("tokenizer.ggml.add_bos_token")
    return GGUFInfo(
        path=p,
        file_size=size,
        version=version,
        architecture=arch,
        name=kv.get("general.name"),
        n_params=n_params,
        n_tensors=len(tensors),
        tensor_types=types,
        file_type=_file_type_name(kv.get("general.file_type")),
        context_length=int(ctx) if ctx is not None else None,
        tokenizer_model=kv.get("tokenizer.ggml.model"),
        tokenizer_pre=kv.get("tokenizer.ggml.pre"),
        vocab_size=len(tokens),
        bos_token_id=_opt_int(kv.get("tokenizer.ggml.bos_token_id")),
        eos_token_id=_opt_int(kv.get("tokenizer.ggml.eos_token_id")),
        add_bos_token=bool(add_bos) if add_bos is not None else None,
        chat_template=kv.get("tokenizer.chat_template"),
        tokens=list(tokens),
    )


class _Truncated(Exception):
    pass


# GGUF value types (gguf.GGUFValueType): scalar struct formats; 8 = string, 9 = array.
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_MAX_HEADER = 1 << 30  # refuse absurd counts rather than allocate
_KEEP_ARRAYS = {"tokenizer.ggml.tokens"}
_U64 = __import__("struct").Struct("<Q")


def read_gguf_header(path: Path) -> tuple[dict[str, Any], list[tuple[str, list[int], int, int]], int]:
    """Metadata key/values, tensor infos (name, dims, type id, offset) and the data section start.

    A small struct-based reader: gguf.GGUFReader builds one numpy view per array element and takes ~50 s on
    the 151,936-token vocabulary of the default model; this reads the same header in well under a second.
    """
    import mmap
    import struct

    with open(path, "rb") as fh:
        try:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # empty file
            raise _Truncated() from None
    buf = memoryview(mm)
    n_buf = len(buf)
    pos = 8

    def take(fmt: str) -> Any:
        nonlocal pos
        sz = struct.calcsize(fmt)
        if pos + sz > n_buf:
            raise _Truncated()
        (v,) = struct.unpack_from(fmt, buf, pos)
        pos += sz
        return v

    def string() -> str:
        nonlocal pos
        n = take("<Q")
        if n > _MAX_HEADER or pos + n > n_buf:
            raise _Truncated()
        s = bytes(buf[pos : pos + n]).decode("utf-8", "surrogateescape")
        pos += n
        return s

    def value(vtype: int, keep: bool = True) -> Any:
        nonlocal pos
        if vtype in _SCALAR:
            return take(_SCALAR[vtype])
        if vtype == 8:
            return string()
        if vtype == 9:
            etype, count = take("<I"), take("<Q")
            if count > _MAX_HEADER:
                raise ValueError(f"array of {count} elements")
            if etype == 8:
                # tight loop: 151k-entry vocabularies and merge lists; merges are walked past, not decoded
                unpack_q = _U64.unpack_from
                out: list[str] | None = [] if keep else None
                p0 = pos
                for _ in range(count):
                    if p0 + 8 > n_buf:
                        raise _Truncated()
                    (n,) = unpack_q(mm, p0)
                    p0 += 8
                    if out is not None:
                        out.append(mm[p0 : p0 + n].decode("utf-8", "surrogateescape"))
                    p0 += n
                if p0 > n_buf:
                    raise _Truncated()
                pos = p0
                return out
            if etype in _SCALAR:
                fmt = _SCALAR[etype]
                sz = struct.calcsize(fmt)
                if pos + sz * count > n_buf:
                    raise _Truncated()
                # numeric arrays (token types, scores) are only skipped over: nothing here needs them
                _skip(sz * count)
                return None
            return [value(etype) for _ in range(count)]
        raise ValueError(f"unknown metadata value type {vtype}")

    def _skip(n: int) -> None:
        nonlocal pos
        pos += n

    try:
        n_tensors, n_kv = take("<Q"), take("<Q")
        if n_tensors > _MAX_HEADER or n_kv > _MAX_HEADER:
            raise ValueError(f"implausible counts ({n_tensors} tensors, {n_kv} keys)")
        kv: dict[str, Any] = {}
        for _ in range(n_kv):
            key = string()
            kv[key] = value(take("<I"), keep=key in _KEEP_ARRAYS or not key.startswith("tokenizer.ggml."))
        tensors = []
        for _ in range(n_tensors):
            name = string()
            n_dims = take("<I")
            if n_dims > 8:
                raise ValueError(f"tensor '{name}' has {n_dims} dimensions")
            dims = [take("<Q") for _ in range(n_dims)]
            tensors.append((name, dims, take("<I"), take("<Q")))
        align = int(kv.get("general.alignment") or 32)
        data_start = (pos + align - 1) // align * align
        return kv, tensors, data_start
    finally:
        buf.release()  # the mmap cannot close while a view of it is alive
        mm.close()


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


def require_compatible(target: GGUFInfo, draft: GGUFInfo) -> None:
    c = check_pair(target, draft)
    if not c.ok:
        raise IncompatiblePairError(f"draft {draft.path.name} cannot be used with target {target.path.name}: " + "; ".join(c.problems))
