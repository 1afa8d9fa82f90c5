"""Q2_K and Q6_K: dequantized at load and requantized into the KIND_Q8 layout.

Both have sub-blocks of 16 with their own scale (Q2_K: and min) inside each 32-wide kernel
block, and no single (d, m) per 32 reproduces two different scales' products exactly in 8 bits
(Q6_K: 6-bit codes times an int8 scale; Q2_K: two different mins).  So these are mapped onto
8-bit blocks of 32 with a scale and an offset: w ≈ d * q + m, q in [-127, 127], m the block's
mid-range and d its half-range / 127, both rounded to f16 first (the avx512 tiles store them
as f16, so the generic and tiled paths read the same values).  The error is at most d / 2 per
weight (plus the f16 rounding of m) — under 0.4 % of the block's range, well below the
2-6-bit source's own step — and memory grows to ~1.125 bytes per weight plus 8 bytes of f32
d/m per block (vs 0.33-0.82 bytes per weight in the file).

Block bytes (256 weights):
  Q2_K (84)  = scales[16] (low nibble: scale, high: min), qs[64], d:f16, dmin:f16;
               w = d * sc * code - dmin * mn, code 2 bits at qs[32 (e // 128) + e % 32]
               >> 2 ((e // 32) % 4).
  Q6_K (210) = ql[128], qh[64], scales[16] int8, d:f16;  w = d * sc * (code - 32), code's low
               nibble at ql[64 (e // 128) + e % 64] >> 4 ((e // 64) % 2), its top 2 bits at
               qh[32 (e // 128) + e % 32] >> 2 ((e // 32) % 4).
The dequantization is computed in f32 with ggml's operation order (d * sc first).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .blocks import f16_field
from .packed import KIND_Q8, Packed

ROW_CHUNK = 2048  # rows dequantized at a time: bounds the f32 temporaries
_SHIFT2 = np.array([0, 2, 4, 6], np.uint8)
_SHIFT4 = np.array([0, 4], np.uint8)


def requantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


def dequantize_q2_k(b: np.ndarray) -> np.ndarray:
    """(rows, ns, 84) blocks -> (rows, ns * 256) f32."""
    rows = b.shape[0]
    s = b[:, :, :16]
    dl = f16_field(b, 80)[:, :, None] * (s & np.uint8(15)).astype(np.float32)  # (rows, ns, 16)
    ml = f16_field(b, 82)[:, :, None] * (s >> np.uint8(4)).astype(np.float32)
    codes = (b[:, :, 16:80].reshape(rows, -1, 2, 1, 32) >> _SHIFT2[:, None]) & np.uint8(3)
    codes = codes.reshape(rows, -1, 16, 16).astype(np.float32)
    return (dl[..., None] * codes - ml[..., None]).reshape(rows, -1)


def dequantize_q6_k(b: np.ndarray) -> np.ndarray:
    """(rows, ns, 210) blocks -> (rows, ns * 256) f32."""
    rows = b.shape[0]
    low = (b[:, :, :128].reshape(rows, -1, 2, 1, 64) >> _SHIFT4[:, None]) & np.uint8(15)
    high = (b[:, :, 128:192].reshape(rows, -1, 2, 1, 32) >> _SHIFT2[:, None]) & np.uint8(3)
    codes = low.reshape(rows, -1, 256) | (high.reshape(rows, -1, 256) << np.uint8(4))
    codes = codes.astype(np.int8) - np.int8(32)
    dl = f16_field(b, 208)[:, :, None] * b[:, :, 192:208].view(np.int8).astype(np.float32)
    return (dl[..., None] * codes.reshape(rows, -1, 16, 16).astype(np.float32)).reshape(rows, -1)


def _unpacker(type_size: int, dequantize: Callable[[np.ndarray], np.ndarray]
              ) -> Callable[[np.ndarray, int, int], Packed]:
    def unpack(raw: np.ndarray, rows: int, cols: int) -> Packed:
        blocks = np.asarray(raw).reshape(rows, cols // 256, type_size)
        nb = cols // 32
        q = np.empty((rows, nb, 32), np.int8)
        d = np.empty((rows, nb), np.float32)
        m = np.empty((rows, nb), np.float32)
        for r in range(0, rows, ROW_CHUNK):
            part = slice(r, r + ROW_CHUNK)
            q[part], d[part], m[part] = requantize(dequantize(blocks[part]))
        return Packed(KIND_Q8, rows, cols, q=q, d=d, m=m)

    return unpack


unpack_q2_k = _unpacker(84, dequantize_q2_k)
unpack_q6_k = _unpacker(210, dequantize_q6_k)
