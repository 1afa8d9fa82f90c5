"""Q5_0 and Q5_1: 32 weights per block, 5-bit codes with an f16 scale (Q5_1: and an f16 min).

Block bytes: Q5_0 = d:f16, qh:u32, qs[16];  Q5_1 = d:f16, m:f16, qh:u32, qs[16].  Bit j of qh
is element j's fifth bit; qs pairs elements j and j + 16 like Q4_0.  w = d * (code - 16)
(Q5_0) or d * code + m (Q5_1).  Both map exactly onto KIND_Q5 (packed.py): qs is its nib and
qh its fifth bits as they are, the file's f16 scales widened exactly — no requantization, and
memory stays at the file's 5.5 / 6 bits a weight.
"""

from __future__ import annotations

import numpy as np

from .blocks import block_view, f16_field
from .packed import KIND_Q5, Packed


def _bits(blocks: np.ndarray, at: int) -> tuple[np.ndarray, np.ndarray]:
    """(nib, qh): qs (rows, nb, 16) and qh (rows, nb, 4) from qh at byte `at`, qs after it."""
    qh = np.ascontiguousarray(blocks[:, :, at : at + 4])
    return np.ascontiguousarray(blocks[:, :, at + 4 :]), qh


def unpack_q5_0(raw: np.ndarray, rows: int, cols: int) -> Packed:
    b = block_view(raw, rows, cols, 32, 22)
    nib, qh = _bits(b, 2)
    d = f16_field(b, 0)
    return Packed(KIND_Q5, rows, cols, nib=nib, qh=qh, d=d, m=np.zeros_like(d), zero=16)


def unpack_q5_1(raw: np.ndarray, rows: int, cols: int) -> Packed:
    b = block_view(raw, rows, cols, 32, 24)
    nib, qh = _bits(b, 4)
    return Packed(KIND_Q5, rows, cols, nib=nib, qh=qh, d=f16_field(b, 0), m=f16_field(b, 2),
                  zero=0)
