"""Activation quantization: each row to int8 codes in blocks of 32 (ggml's q8_0 / q8_1).

Per block: d = max|x| / 127 (stored rounded to f16, as ggml does), code = rint(x * 127 / max|x|),
and the
block's code sum (q8_1's `s` = d * sum, used by weights with a min such as Q4_1).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .f16 import round_f16


@njit(cache=True, nogil=True)
def quantize_rows(x, xq, xd, xi, xs):
    """x (n_tokens, cols) f32 -> xq (n_tokens, cols) int8 codes, xd (n_tokens, n_blocks) f32
    scales, xi (n_tokens, n_blocks) int32 code sums, xs (n_tokens, n_blocks) f32 = d * sum."""
    n_tokens, cols = x.shape
    for i in range(n_tokens):
        for b in range(cols // 32):
            base = b * 32
            amax = np.float32(0.0)
            for j in range(32):
                amax = max(amax, abs(x[i, base + j]))
            d = amax / np.float32(127.0)
            inv = np.float32(127.0) / amax if amax > 0 else np.float32(0.0)  # as ggml's AVX code
            total = 0
            for j in range(32):
                c = int(np.rint(x[i, base + j] * inv))
                xq[i, base + j] = c
                total += c
            xd[i, b] = round_f16(d)
            xi[i, b] = total
            xs[i, b] = round_f16(d * np.float32(total))
