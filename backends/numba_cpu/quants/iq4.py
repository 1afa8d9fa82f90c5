"""IQ4_NL and IQ4_XS: 4-bit indices into a fixed non-linear table of 16 integers in [-127, 113].

Block bytes: IQ4_NL (32 weights) = d:f16, qs[16];  IQ4_XS (256 weights) = d:f16, scales_h:u16,
scales_l[4], qs[128] — eight sub-blocks of 32; sub-block i has the 6-bit scale ls whose low
4 bits are nibble i % 2 of scales_l[i // 2] and top 2 bits are bits 2i, 2i + 1 of scales_h,
and w = d * (ls - 32) * table[code].  qs pairs elements j and j + 16 of each 32 like Q4_0.

The table values are int8 codes, so each block maps onto KIND_Q8 as q = table[code] with the
block's scale: exact for IQ4_NL (d is the file's f16).  For IQ4_XS the per-32 scale d * (ls - 32)
is exact in f32 but is rounded to f16 (relative error <= 2^-11), the precision the tiled kernels
keep their block scales in; the codes stay exact.
"""

from __future__ import annotations

import numpy as np

from .blocks import block_view, f16_field, low_high_bits, round_f16, row_chunked
from .packed import KIND_Q8, Packed

TABLE = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                 np.int8)


@row_chunked
def unpack_iq4_nl(raw: np.ndarray, rows: int, cols: int) -> Packed:
    b = block_view(raw, rows, cols, 32, 18)
    d = f16_field(b, 0)
    return Packed(KIND_Q8, rows, cols, q=TABLE[low_high_bits(b[:, :, 2:])], d=d,
                  m=np.zeros_like(d))


@row_chunked
def unpack_iq4_xs(raw: np.ndarray, rows: int, cols: int) -> Packed:
    b = block_view(raw, rows, cols, 256, 136)
    n_super = b.shape[1]
    sh = np.ascontiguousarray(b[:, :, 2:4]).view("<u2")  # (rows, ns, 1)
    sl = b[:, :, 4:8]  # (rows, ns, 4): sub-blocks 2k (low nibble) and 2k + 1 (high)
    low = np.stack([sl & np.uint8(15), sl >> np.uint8(4)], axis=-1).reshape(rows, n_super, 8)
    high = (sh >> (2 * np.arange(8, dtype=np.uint16))) & np.uint16(3)
    ls = (low.astype(np.int32) | (high.astype(np.int32) << 4)) - 32  # (rows, ns, 8)
    d = round_f16(f16_field(b, 0)[:, :, None] * ls.astype(np.float32)).reshape(rows, -1)
    qs = b[:, :, 8:].reshape(rows, n_super * 8, 16)
    return Packed(KIND_Q8, rows, cols, q=TABLE[low_high_bits(qs)], d=d, m=np.zeros_like(d))
