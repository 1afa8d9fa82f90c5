"""Q8_0: 32 weights per block, int8 codes and one f16 scale (block bytes: d:f16, qs[32])."""

from __future__ import annotations

import numpy as np

from .packed import KIND_Q8, Packed


def unpack_q8_0(raw: np.ndarray, rows: int, cols: int) -> Packed:
    blocks = np.asarray(raw).reshape(rows, cols // 32, 34)
    d = np.ascontiguousarray(blocks[:, :, :2]).view(np.float16)[:, :, 0].astype(np.float32)
    q = np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8)  # (rows, nb, 32)
    return Packed(KIND_Q8, rows, cols, q=q, d=d, m=np.zeros_like(d))
