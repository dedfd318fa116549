"""The only module that imports llama_cpp (the llama-cpp-python bindings): `C`, the ctypes bindings of llama.cpp, for
context.py (models, contexts, decoding), vocab.py (tokenizing) and rpc.py (the RPC backend's libraries beside it). A
library that cannot load (a CUDA build without its runtime on the library path) is one BackendError, not an
ImportError's traceback."""

from __future__ import annotations

import ctypes
from typing import Any

from edgespec.errors import BackendError

try:
    import llama_cpp as C
except (RuntimeError, OSError) as _e:  # llama_cpp raises RuntimeError when libllama (or a library it needs) cannot load
    raise BackendError(
        f"llama.cpp's library could not be loaded ({str(_e).splitlines()[0] if str(_e) else type(_e).__name__}); a CUDA "
        "build needs the CUDA runtime and cuBLAS libraries on the library path: rebuild for this machine with "
        "scripts/setup.sh (docs/setup.md)"
    ) from None


def _address_function(name: str) -> Any:
    """llama.cpp's `name` (one context argument, a pointer result) as a second ctypes function that returns the pointer
    as an int (None for NULL): no pointer object and no ctypes.cast per call (the binding's own keeps its types)."""
    f = C.llama_cpp._lib[name]  # the loaded libllama; indexing makes a new function object
    f.argtypes, f.restype = [ctypes.c_void_p], ctypes.c_void_p
    return f


logits_address = _address_function("llama_get_logits")

__all__ = ["C", "logits_address"]
