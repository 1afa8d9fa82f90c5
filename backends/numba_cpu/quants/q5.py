"""Q5_0 and Q5_1: 32 weights per block, 5-bit codes with an f16 scale (Q5_1: and an f16 min).

Block bytes: Q5_0 = d:f16, qh:u32, qs[16];  Q5_1 = d:f16, m:f16, qh:u32, qs[16].  Bit j of qh
is element j's fifth bit; qs pairs elements j and j + 16 like Q4_0.  w = d * (code - 16)
(Q5_0) or d * code + m (Q5_1).  A 5-bit code fits an int8 and the file's scales are already
f16, so both map exactly onto KIND_Q8 (q = code - 16 or code): no requantization error, at the
cost of 8 bits per code in memory.
"""

from __future__ import annotations

import numpy as np

from .blocks import block_view, f16_field, low_high_bits, row_chunked
from .packed import KIND_Q8, Packed

_BIT = np.arange(32, dtype=np.uint32)


def _codes(blocks: np.ndarray, at: int) -> np.ndarray:
    """5-bit codes (rows, nb, 32) uint8 from qh at byte `at` and qs right after it."""
    qh = np.ascontiguousarray(blocks[:, :, at : at + 4]).view("<u4")  # (rows, nb, 1)
    high = ((qh >> _BIT) & np.uint32(1)).astype(np.uint8) << np.uint8(4)
    return low_high_bits(blocks[:, :, at + 4 :]) | high


@row_chunked
def unpack_q5_0(raw: np.ndarray, rows: int, cols: int) -> Packed:
    b = block_view(raw, rows, cols, 32, 22)
    q = (_codes(b, 2).astype(np.int8) - np.int8(16))
    d = f16_field(b, 0)
    return Packed(KIND_Q8, rows, cols, q=q, d=d, m=np.zeros_like(d))


@row_chunked
def unpack_q5_1(raw: np.ndarray, rows: int, cols: int) -> Packed:
    b = block_view(raw, rows, cols, 32, 24)
    return Packed(KIND_Q8, rows, cols, q=_codes(b, 4).view(np.int8), d=f16_field(b, 0),
                  m=f16_field(b, 2))
