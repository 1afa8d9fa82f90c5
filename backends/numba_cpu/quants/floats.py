"""F32, F16 and BF16 weights: used as float32 (F16 and BF16 are widened exactly at load; Numba has
no f16 arithmetic)."""

from __future__ import annotations

import numpy as np

from .packed import KIND_F32, Packed


def unpack_f32(raw: np.ndarray, rows: int, cols: int) -> Packed:
    w = np.ascontiguousarray(np.asarray(raw).view(np.float32).reshape(rows, cols))
    return Packed(KIND_F32, rows, cols, w=w)


def unpack_f16(raw: np.ndarray, rows: int, cols: int) -> Packed:
    w = np.asarray(raw).view(np.float16).reshape(rows, cols).astype(np.float32)
    return Packed(KIND_F32, rows, cols, w=w)


def unpack_bf16(raw: np.ndarray, rows: int, cols: int) -> Packed:
    """bf16 is the top half of an f32: shift the bits back into place."""
    bits = np.asarray(raw).view(np.uint16).reshape(rows, cols)
    w = (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return Packed(KIND_F32, rows, cols, w=w)
