"""llama.cpp's own quantizer on raw rows, through ctypes into the libggml-base that
llama-cpp-python ships: the bit-for-bit reference for every block format."""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

import numpy as np


@cache
def _lib() -> ctypes.CDLL | None:
    try:
        import llama_cpp
    except ImportError:
        return None
    libdir = Path(llama_cpp.__file__).parent / "lib"
    for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
        if (libdir / name).exists():
            lib = ctypes.CDLL(str(libdir / name))
            lib.ggml_quantize_chunk.restype = ctypes.c_size_t
            lib.ggml_quantize_chunk.argtypes = [
                ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
            lib.ggml_row_size.restype = ctypes.c_size_t
            lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
            return lib
    return None


def available() -> bool:
    return _lib() is not None


def ggml_quantize(x: np.ndarray, ggml_type: int) -> np.ndarray:
    """Quantize float32 rows (rows, n) with ggml_quantize_chunk; uint8 (rows, row_bytes)."""
    lib = _lib()
    assert lib is not None
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, n = x.shape
    rb = lib.ggml_row_size(ggml_type, n)
    out = np.zeros((rows, rb), dtype=np.uint8)
    lib.ggml_quantize_chunk(ggml_type, x.ctypes.data, out.ctypes.data, 0, rows, n, None)
    return out
