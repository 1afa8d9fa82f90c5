"""Q5_0, Q4_K and Q6_K: dequantized at load (gguf.quants) and requantized into the KIND_Q8 layout.

The kernels have no 5-bit, 6-bit or 256-element super-block paths, so these types are mapped
onto 8-bit blocks of 32 with a scale and an offset: w ≈ d * q + m, q in [-127, 127],
m the block's mid-range and d its half-range / 127, both rounded to f16 first (the avx512 tiles
store them as f16, so the generic and tiled paths read the same values).  The error is at most
d / 2 per weight — under 0.4 % of the block's range, well below the 4-6-bit source's own step —
and memory grows to ~1.125 bytes per weight plus 8 bytes of f32 d/m per block (vs 0.56-0.82
bytes per weight in the file).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .packed import KIND_Q8, Packed

ROW_CHUNK = 4096  # rows dequantized at a time: bounds the f32 temporaries


def _requant(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, cols) f32 -> q (rows, nb, 32) int8, d, m (rows, nb) f32 holding f16 values."""
    rows, cols = w.shape
    b = w.reshape(rows, cols // 32, 32)
    lo, hi = b.min(axis=2), b.max(axis=2)
    m = ((hi + lo) * np.float32(0.5)).astype(np.float16).astype(np.float32)
    half = np.maximum(hi - m, m - lo)
    d = (half / np.float32(127)).astype(np.float16).astype(np.float32)
    # f16 rounding of d may shrink it: nudge up one f16 step where the extremes would clip
    short = d * np.float32(127) < half
    d[short] = np.nextafter(d[short].astype(np.float16), np.float16(np.inf)).astype(np.float32)
    safe = np.where(d > 0, d, np.float32(1))
    q = np.clip(np.rint((b - m[:, :, None]) / safe[:, :, None]), -127, 127).astype(np.int8)
    return q, d, m


def _unpacker(qtype: int) -> Callable[[np.ndarray, int, int], Packed]:
    def unpack(raw: np.ndarray, rows: int, cols: int) -> Packed:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        blocks = np.asarray(raw).reshape(rows, -1)
        nb = cols // 32
        q = np.empty((rows, nb, 32), np.int8)
        d = np.empty((rows, nb), np.float32)
        m = np.empty((rows, nb), np.float32)
        for r in range(0, rows, ROW_CHUNK):
            w = dequantize(blocks[r : r + ROW_CHUNK], GGMLQuantizationType(qtype))
            q[r : r + ROW_CHUNK], d[r : r + ROW_CHUNK], m[r : r + ROW_CHUNK] = _requant(
                np.asarray(w, np.float32).reshape(-1, cols))
        return Packed(KIND_Q8, rows, cols, q=q, d=d, m=m)

    return unpack


unpack_q5_0 = _unpacker(6)
unpack_q4_k = _unpacker(12)
unpack_q6_k = _unpacker(14)
