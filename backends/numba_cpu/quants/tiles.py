"""The AVX-512 weight layout: tiles of 16 interleaved rows, so one 512-bit register holds one
value for each of 16 output rows and vpdpbusd (four u8 x s8 products per 32-bit lane) sums
straight into 16 per-row accumulators — no horizontal sums.

Per tile t (rows 16t .. 16t+15) and block b of 32 columns:

- KIND_Q4: w[t, b] is 256 bytes = 4 groups of 64 bytes; in group k, byte 4r + j holds row r's
  element 4k + j in its low nibble and element 16 + 4k + j in its high nibble (ggml's own pairing
  of j and j + 16, so the file's bytes only move, never change).
- KIND_Q5: w[t, b] is 320 bytes: the 256 bytes of KIND_Q4 (the low four bits of each code),
  then a 64-byte plane of fifth bits placed like a group: byte 4r + j holds in bit k the fifth
  bit of the element whose nibble the kernel's group k reads at that byte — row r's element
  4k + j, for k = 0..3 the low nibbles of group k, for k = 4..7 the high nibbles of group k - 4
  (16 + 4(k - 4) + j = 4k + j).  So group k's codes are its nibbles | ((plane >> k) & 1) << 4,
  a shift, an and and an or per group (kernels/matmul_tiles.py).
- KIND_Q8: w[t, b] is 512 bytes = 8 groups; in group k, byte 4r + j is row r's element 4k + j
  plus 128 as an unsigned byte (vpdpbusd wants its weight operand unsigned; the kernel subtracts
  128 times the activation block sum, exactly as Q4_0 subtracts 8 times it).
- d[t, b], m[t, b]: the 16 rows' block scales and mins as f16 bits (the file's own f16 values,
  widened exactly in the kernel), m empty when every min is zero.

Every 64 bytes of a block (a group or the plane) hold rows 0..7 in bytes 0..31 and rows 8..15 in
bytes 32..63, which is how the 8-lane paths read a tile as two parts.  Bytes per weight equal
the file's (Q5_0: 5 bits of code a weight and an f16 scale per 32, as in the file), so memory
stays at the GGUF size.  Rows are padded to a multiple of 16 with zero scales.
"""

from __future__ import annotations

import numpy as np

from .packed import KIND_Q4, KIND_Q5, KIND_Q8, Packed

TILE_ROWS = 16
_TILE_BYTES = {KIND_Q4: 256, KIND_Q5: 320, KIND_Q8: 512}
_BIT = np.arange(8, dtype=np.uint8)


def tile_bytes(kind: int) -> int:
    return _TILE_BYTES[kind]


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


def _plane(qh: np.ndarray) -> np.ndarray:
    """KIND_Q5 fifth bits (rows, nb, 4) -> plane bytes (rows, nb, 4): byte j, bit k = the bit of
    element 4k + j."""
    bits = np.unpackbits(qh, axis=2, bitorder="little")  # (rows, nb, 32), element order
    by_j = bits.reshape(*bits.shape[:2], 8, 4).transpose(0, 1, 3, 2)  # (rows, nb, j, k)
    return np.packbits(by_j, axis=3, bitorder="little")[..., 0]


def to_tiles(p: Packed) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A KIND_Q4, KIND_Q5 or KIND_Q8 matrix -> (w (tiles, nb, bytes) u8, d, m (tiles, nb, 16)
    u16)."""
    if p.kind == KIND_Q4:
        w = _interleave(_pad_rows(p.nib), 4)
    elif p.kind == KIND_Q5:
        w = np.concatenate([_interleave(_pad_rows(p.nib), 4),
                            _interleave(_pad_rows(_plane(p.qh)), 1)], axis=2)
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
    nibbles = b[:, :, :16]
    codes = b if kind == KIND_Q8 else np.concatenate([nibbles & 15, nibbles >> 4], axis=2)
    if kind == KIND_Q5:  # plane byte j, bit k -> element 4k + j
        high = (b[:, :, 16:, None] >> _BIT) & 1  # (rows_p, nb, j, k)
        codes = codes + 16 * high.transpose(0, 1, 3, 2).reshape(codes.shape)
    dd = d.view(np.float16).astype(np.float32).transpose(0, 2, 1).reshape(-1, nb)
    mm = (m.view(np.float16).astype(np.float32).transpose(0, 2, 1).reshape(-1, nb)
          if m.size else np.zeros_like(dd))
    out = dd[:, :, None] * (codes - zero) + mm[:, :, None]
    return out.reshape(tiles * TILE_ROWS, nb * 32)[:rows].astype(np.float32)
