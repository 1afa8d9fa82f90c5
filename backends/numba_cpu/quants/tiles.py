"""The AVX-512 weight layout: tiles of 16 interleaved rows, so one 512-bit register holds one
value for each of 16 output rows and vpdpbusd (four u8 x s8 products per 32-bit lane) sums
straight into 16 per-row accumulators — no horizontal sums.

Per tile t (rows 16t .. 16t+15) and block b of 32 columns:

- KIND_Q4: w[t, b] is 256 bytes = 4 groups of 64 bytes; in group k, byte 4r + j holds row r's
  element 4k + j in its low nibble and element 16 + 4k + j in its high nibble (ggml's own pairing
  of j and j + 16, so the file's bytes only move, never change).
- KIND_Q8: w[t, b] is 512 bytes = 8 groups; in group k, byte 4r + j is row r's element 4k + j
  plus 128 as an unsigned byte (vpdpbusd wants its weight operand unsigned; the kernel subtracts
  128 times the activation block sum, exactly as Q4_0 subtracts 8 times it).
- d[t, b], m[t, b]: the 16 rows' block scales and mins as f16 bits (the file's own f16 values,
  widened exactly in the kernel), m empty when every min is zero.

Bytes per weight equal the file's, so memory stays at the GGUF size.  Rows are padded to a
multiple of 16 with zero scales.
"""

from __future__ import annotations

import numpy as np

from .packed import KIND_Q4, KIND_Q8, Packed

TILE_ROWS = 16


def tile_bytes(kind: int) -> int:
    return 256 if kind == KIND_Q4 else 512


def _interleave(codes: np.ndarray, groups: int) -> np.ndarray:
    """(rows_p, nb, 4 groups) bytes -> (tiles, nb, groups * 64) in the order described above."""
    rows_p, nb, _ = codes.shape
    tiles = rows_p // TILE_ROWS
    c = codes.reshape(tiles, TILE_ROWS, nb, groups, 4).transpose(0, 2, 3, 1, 4)
    return c.reshape(tiles, nb, groups * 64)


def _pad_rows(a: np.ndarray) -> np.ndarray:
    extra = -a.shape[0] % TILE_ROWS
    if extra == 0:
        return a
    return np.concatenate([a, np.zeros((extra, *a.shape[1:]), a.dtype)])


def _scales(s: np.ndarray) -> np.ndarray:
    """(rows, nb) f32 holding f16 values -> (tiles, nb, 16) f16 bits."""
    bits = _pad_rows(s.astype(np.float16).view(np.uint16))
    tiles, nb = bits.shape[0] // TILE_ROWS, bits.shape[1]
    return bits.reshape(tiles, TILE_ROWS, nb).transpose(0, 2, 1)


def to_tiles(p: Packed) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A KIND_Q4 or KIND_Q8 matrix -> (w (tiles, nb, bytes) u8, d, m (tiles, nb, 16) u16)."""
    if p.kind == KIND_Q4:
        w = _interleave(_pad_rows(p.nib), 4)
    elif p.kind == KIND_Q8:
        w = _interleave(_pad_rows(p.q.view(np.uint8) ^ np.uint8(0x80)), 8)
    else:
        raise ValueError(f"kind {p.kind} has no tile layout")
    return w, _scales(p.d), _scales(p.m)


def tile_dequantize(kind: int, zero: int, w: np.ndarray, d: np.ndarray, m: np.ndarray,
                    rows: int) -> np.ndarray:
    """Inverse of to_tiles, (rows, nb * 32) float32 — for tests."""
    tiles, nb, nbytes = w.shape
    groups = nbytes // 64
    b = w.reshape(tiles, nb, groups, TILE_ROWS, 4).transpose(0, 3, 1, 2, 4)
    b = b.reshape(tiles * TILE_ROWS, nb, groups * 4).astype(np.int32)  # (rows_p, nb, 4 groups)
    codes = np.concatenate([b & 15, b >> 4], axis=2) if kind == KIND_Q4 else b
    dd = d.view(np.float16).astype(np.float32).transpose(0, 2, 1).reshape(-1, nb)
    mm = (m.view(np.float16).astype(np.float32).transpose(0, 2, 1).reshape(-1, nb)
          if m.size else np.zeros_like(dd))
    out = dd[:, :, None] * (codes - zero) + mm[:, :, None]
    return out.reshape(tiles * TILE_ROWS, nb * 32)[:rows].astype(np.float32)
