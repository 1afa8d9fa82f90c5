"""Q3_K, Q4_K and Q5_K: 256-weight super-blocks mapped onto the kernels' blocks of 32.

Q4_K (144 bytes) = d:f16, dmin:f16, scales[12], qs[128];  Q5_K (176) adds qh[32] before qs.
Eight sub-blocks of 32, each with a 6-bit scale sc and min mn (packed in `scales`):
w = d * sc * code - dmin * mn.  qs holds sub-blocks 2c and 2c + 1 in the low and high nibbles
of bytes 32c .. 32c + 31; Q5_K's fifth bit of element e is bit e // 32 of qh[e % 32].
Each sub-block becomes one kernel block with the same codes (Q4_K -> KIND_Q4 with zero 0, so
memory stays at 4.5 bits a weight; Q5_K -> KIND_Q8), d_blk = d * sc and m_blk = -dmin * mn.
Those products are exact in f32 but are rounded to f16 (relative error <= 2^-11), the precision
the tiled kernels keep block scales in; the codes themselves are exact.

Q3_K (110 bytes) = hmask[32], qs[64], scales[12], d:f16.  Sixteen sub-blocks of 16 with signed
6-bit scales s in [-32, 31] and 3-bit codes c in [-4, 3]: w = d * s * c.  The product s * c lies
in [-124, 128], so -(s * c) is an int8 and the block maps exactly onto KIND_Q8 with q = -s * c,
d_blk = -d (both sub-blocks of a kernel block share the super-block's d).  No rounding at all.
"""

from __future__ import annotations

import numpy as np

from .blocks import block_view, f16_field, pack_nibbles, round_f16, row_chunked
from .packed import KIND_Q4, KIND_Q8, Packed

_SHIFT4 = np.array([0, 4], np.uint8)
_SHIFT2 = np.array([0, 2, 4, 6], np.uint8)
_BIT8 = np.arange(8, dtype=np.uint8)


def scale_min_k4(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows, ns, 12) packed bytes -> 6-bit scales and mins, each (rows, ns, 8) uint8.
    Sub-blocks 0-3 use the low 6 bits of bytes 0-3 / 4-7; sub-blocks 4-7 take 4 bits from
    bytes 8-11 and their top 2 bits from the top of bytes 0-3 / 4-7."""
    a, b, c = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([a & 63, (c & 15) | ((a >> 6) << 4)], axis=-1)
    mn = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=-1)
    return sc, mn


def _sub_scales(b: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Per sub-block d * sc and -dmin * mn, f16-rounded: (rows, ns * 8) each."""
    sc, mn = scale_min_k4(b[:, :, 4:16])
    d = f16_field(b, 0)[:, :, None] * sc.astype(np.float32)
    m = -(f16_field(b, 2)[:, :, None] * mn.astype(np.float32))
    return round_f16(d).reshape(rows, -1), round_f16(m).reshape(rows, -1)


def _low_codes(qs: np.ndarray, rows: int) -> np.ndarray:
    """Q4_K/Q5_K qs (rows, ns, 128) -> 4-bit codes (rows, ns * 8, 32) in element order."""
    q = qs.reshape(rows, -1, 4, 1, 32) >> _SHIFT4[:, None]  # (rows, ns, 4, 2, 32)
    return (q & np.uint8(15)).reshape(rows, -1, 32)


@row_chunked
def unpack_q4_k(raw: np.ndarray, rows: int, cols: int) -> Packed:
    b = block_view(raw, rows, cols, 256, 144)
    d, m = _sub_scales(b, rows)
    nib = pack_nibbles(_low_codes(b[:, :, 16:], rows))
    return Packed(KIND_Q4, rows, cols, nib=nib, d=d, m=m, zero=0)


@row_chunked
def unpack_q5_k(raw: np.ndarray, rows: int, cols: int) -> Packed:
    b = block_view(raw, rows, cols, 256, 176)
    d, m = _sub_scales(b, rows)
    qh = b[:, :, 16:48].reshape(rows, -1, 1, 32) >> _BIT8[:, None]  # (rows, ns, 8, 32)
    high = (qh & np.uint8(1)).reshape(rows, -1, 32) << np.uint8(4)
    q = (_low_codes(b[:, :, 48:], rows) | high).view(np.int8)
    return Packed(KIND_Q8, rows, cols, q=q, d=d, m=m)


@row_chunked
def unpack_q3_k(raw: np.ndarray, rows: int, cols: int) -> Packed:
    b = block_view(raw, rows, cols, 256, 110)
    hmask, qs, s = b[:, :, 0:32], b[:, :, 32:96], b[:, :, 96:108]
    # 6-bit scales: low nibbles from bytes 0-7 (sub-blocks 0-7 low, 8-15 high nibble),
    # top 2 bits from bytes 8-11 (sub-block 4k + j in bits 2k..2k+1 of byte 8 + j)
    low = (s[..., :8, None] >> _SHIFT4).transpose(0, 1, 3, 2).reshape(rows, -1, 16) & 15
    high = (s[..., 8:, None] >> _SHIFT2).transpose(0, 1, 3, 2).reshape(rows, -1, 16) & 3
    sc = (low | (high << 4)).astype(np.int16) - 32  # (rows, ns, 16)
    # element e of a super-block: 2 bits at (qs[32 (e // 128) + e % 32] >> 2 ((e // 32) % 4)),
    # minus 4 unless bit e // 32 of hmask[e % 32] is set
    lo = (qs.reshape(rows, -1, 2, 1, 32) >> _SHIFT2[:, None]) & np.uint8(3)
    hi = (hmask.reshape(rows, -1, 1, 32) >> _BIT8[:, None]) & np.uint8(1)
    c = lo.reshape(rows, -1, 256).astype(np.int16) - ((1 - hi.reshape(rows, -1, 256)) * 4)
    q = -(c.reshape(rows, -1, 16, 16) * sc[..., None])  # in [-128, 124]
    d = -f16_field(b, 108)
    d = np.repeat(d, 8, axis=1)  # (rows, ns * 8)
    return Packed(KIND_Q8, rows, cols, q=q.astype(np.int8).reshape(rows, -1, 32), d=d,
                  m=np.zeros_like(d))
