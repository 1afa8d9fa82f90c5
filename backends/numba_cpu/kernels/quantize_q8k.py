"""Activation quantization as ggml's q8_K: blocks of 256 with one f32 scale.

llama.cpp multiplies K-quant weights (Q2_K..Q6_K) by activations in q8_K, whose one scale per
256 values loses more than q8_0's per-32 f16 scale where a row has outliers (gemma's GEGLU
output does).  Feeding those matmuls the same codes keeps our logits next to llama.cpp's.  The
output keeps the per-32 layout of kernels/quantize.py (each 32-block repeats its 256-block's
scale), so the matmul kernels read it unchanged.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .elementwise import PARALLEL_ROWS


@njit(cache=True, nogil=True, parallel=True)
def quantize_rows_q8k(x, xq, xd, xi, xs):
    """x (n_tokens, cols), cols % 256 == 0 -> as kernels/quantize.quantize_rows: xq int8 codes,
    per 32-block xd scale (f32, unrounded), xi code sum, xs = xd * xi.  Rows are independent;
    long batches split over threads (a gemma3 prefill spent a tenth of its time here)."""
    n = x.shape[0]
    if n < PARALLEL_ROWS:
        for i in range(n):
            _quantize_row_q8k(x[i], xq[i], xd[i], xi[i], xs[i])
    else:
        for i in prange(n):
            _quantize_row_q8k(x[i], xq[i], xd[i], xi[i], xs[i])


@njit(nogil=True)
def _quantize_row_q8k(x, xq, xd, xi, xs):
    for b in range(x.shape[0] // 256):
        base = b * 256
        amax = np.float32(0.0)
        mx = np.float32(0.0)
        for j in range(256):  # the signed value of largest magnitude (first on ties)
            v = x[base + j]
            if abs(v) > amax:
                amax = abs(v)
                mx = v
        if amax == 0.0:
            for j in range(256):
                xq[base + j] = 0
            for s in range(8):
                xd[b * 8 + s] = 0.0
                xi[b * 8 + s] = 0
                xs[b * 8 + s] = 0.0
            continue
        iscale = np.float32(-127.0) / mx
        d = np.float32(1.0) / iscale
        for s in range(8):
            total = 0
            for j in range(32):
                c = min(127, int(np.rint(iscale * x[base + s * 32 + j])))
                xq[base + s * 32 + j] = c
                total += c
            xd[b * 8 + s] = d
            xi[b * 8 + s] = total
            xs[b * 8 + s] = d * np.float32(total)
