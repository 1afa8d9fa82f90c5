"""Q6_K: super-blocks of 256 values, 16 groups of 16 with int8 scales, 6-bit codes.

Layout (ggml-common.h, 210 bytes): ql[128] low 4 bits, qh[64] high 2 bits, scales[16] int8,
d:f16. Within each half of 128 values, ql[l] holds values l and l+64 (low, high nibble),
ql[l+32] values l+32 and l+96, and qh[l] the top bits of l, l+32, l+64, l+96.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .base import QuantFormat
from .kquant_search import make_qx_quants
from .numerics import GROUP_MAX_EPS, ZERO, f32, get_f16, nearest_int, put_f16
from .rows import WORKERS, claim


@njit(cache=True)
def _q6_k_block(x: np.ndarray, o: np.ndarray, L: np.ndarray, scales: np.ndarray) -> None:
    max_scale = ZERO
    max_abs = ZERO
    for g in range(16):
        s = make_qx_quants(16, 32, x[16 * g:16 * g + 16], L[16 * g:16 * g + 16])
        scales[g] = s
        if abs(s) > max_abs:
            max_abs = abs(s)
            max_scale = s
    o[:] = 0
    if max_abs < GROUP_MAX_EPS:
        return
    iscale = f32(-128.0) / max_scale
    d = put_f16(o, 208, f32(1.0) / iscale)
    for g in range(16):
        sc = min(127, nearest_int(iscale * scales[g]))
        o[192 + g] = sc & 0xFF
        dg = d * f32(sc)
        if dg == 0:
            continue
        for i in range(16 * g, 16 * g + 16):
            L[i] = max(-32, min(31, nearest_int(x[i] / dg))) + 32
    for h in range(2):
        j = 128 * h
        for l in range(32):
            o[64 * h + l] = (L[j + l] & 15) | ((L[j + l + 64] & 15) << 4)
            o[64 * h + l + 32] = (L[j + l + 32] & 15) | ((L[j + l + 96] & 15) << 4)
            o[128 + 32 * h + l] = ((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2)
                                   | ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6))


@njit(cache=True, parallel=True)
def quantize_q6_k(x: np.ndarray, out: np.ndarray) -> None:
    nxt = np.zeros(1, np.int64)
    for _ in prange(WORKERS):
        L = np.zeros(256, dtype=np.int32)
        scales = np.zeros(16, dtype=np.float32)
        r = claim(nxt)
        while r < x.shape[0]:
            for b in range(x.shape[1] // 256):
                _q6_k_block(x[r, b * 256:b * 256 + 256], out[r, b * 210:b * 210 + 210], L, scales)
            r = claim(nxt)


@njit(cache=True, parallel=True)
def dequantize_q6_k(q: np.ndarray, y: np.ndarray) -> None:
    sc = q.view(np.int8)
    for r in prange(q.shape[0]):
        for b in range(y.shape[1] // 256):
            o = b * 210
            d = get_f16(q[r], o + 208)
            for h in range(2):
                for l in range(32):
                    g = o + 192 + 8 * h + l // 16
                    lo0 = q[r, o + 64 * h + l]
                    lo1 = q[r, o + 64 * h + l + 32]
                    hb = q[r, o + 128 + 32 * h + l]
                    base = b * 256 + 128 * h + l
                    y[r, base] = d * f32(sc[r, g]) * f32(((lo0 & 15) | ((hb & 3) << 4)) - 32)
                    y[r, base + 32] = (d * f32(sc[r, g + 2])
                                       * f32(((lo1 & 15) | (((hb >> 2) & 3) << 4)) - 32))
                    y[r, base + 64] = (d * f32(sc[r, g + 4])
                                       * f32(((lo0 >> 4) | (((hb >> 4) & 3) << 4)) - 32))
                    y[r, base + 96] = (d * f32(sc[r, g + 6])
                                       * f32(((lo1 >> 4) | (((hb >> 6) & 3) << 4)) - 32))


class Q6_K(QuantFormat):
    name = "Q6_K"
    ggml_type = 14
    block_size = 256
    type_size = 210
    quantize_rows = quantize_q6_k
    dequantize_rows = dequantize_q6_k


