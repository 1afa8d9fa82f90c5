"""Q4_0 and Q4_1: 32 weights per block, 4-bit codes, one f16 scale (Q4_1: and an f16 min).

Block bytes: Q4_0 = d:f16, qs[16];  Q4_1 = d:f16, m:f16, qs[16].  Byte j of qs holds element j
in its low nibble and element j + 16 in its high nibble; w = d * (code - 8) (Q4_0) or
w = d * code + m (Q4_1).  The kernels keep the nibbles packed (memory stays ≈ file size) and
split the scales into their own arrays.
"""

from __future__ import annotations

import numpy as np

from .packed import KIND_Q4, Packed


def _split(raw: np.ndarray, rows: int, cols: int, header: int) -> tuple[np.ndarray, np.ndarray]:
    nb = cols // 32
    blocks = np.asarray(raw).reshape(rows, nb, header + 16)
    scales = np.ascontiguousarray(blocks[:, :, :header]).view(np.float16).astype(np.float32)
    nib = np.ascontiguousarray(blocks[:, :, header:])  # (rows, nb, 16)
    return nib, scales  # scales: (rows, nb, header // 2)


def unpack_q4_0(raw: np.ndarray, rows: int, cols: int) -> Packed:
    nib, s = _split(raw, rows, cols, 2)
    d = np.ascontiguousarray(s[:, :, 0])
    return Packed(KIND_Q4, rows, cols, nib=nib, d=d, m=np.zeros_like(d), zero=8)


def unpack_q4_1(raw: np.ndarray, rows: int, cols: int) -> Packed:
    nib, s = _split(raw, rows, cols, 4)
    return Packed(KIND_Q4, rows, cols, nib=nib, d=np.ascontiguousarray(s[:, :, 0]),
                  m=np.ascontiguousarray(s[:, :, 1]), zero=0)
