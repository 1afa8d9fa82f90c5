"""Q2_K and Q3_K: super-blocks of 256 values in 16 groups of 16.

Q2_K (84 bytes): scales[16] (low nibble scale, high nibble min), qs[64] 2-bit codes, d, dmin.
Q3_K (110 bytes): hmask[32] (3rd bits), qs[64] 2-bit codes, scales[12] (16 packed 6-bit
signed scales), d. In both, qs byte 32h + l holds values 128h + l + 32k in bits 2k..2k+1.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .base import QuantFormat
from .kquant_search import make_q3_quants, make_qkx2_quants
from .numerics import ZERO, f32, get_f16, nearest_int, put_f16
from .rows import WORKERS, claim


@njit(cache=True, inline="always")
def _pack2(L: np.ndarray, o: np.ndarray, at: int) -> None:
    for h in range(2):
        j = 128 * h
        for l in range(32):
            o[at + 32 * h + l] = (L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4)
                                  | (L[j + l + 96] << 6))


@njit(cache=True)
def _q2_k_block(x: np.ndarray, o: np.ndarray, L: np.ndarray, Laux: np.ndarray, w: np.ndarray,
                scales: np.ndarray, mins: np.ndarray) -> None:
    max_scale = ZERO
    max_min = ZERO
    for g in range(16):
        xg = x[16 * g:16 * g + 16]
        for i in range(16):
            w[i] = abs(xg[i])
        s, m = make_qkx2_quants(16, 3, xg, w, L[16 * g:16 * g + 16], Laux, f32(-0.5),
                                f32(0.1), 15, True)
        scales[g] = s
        mins[g] = m
        if s > max_scale:
            max_scale = s
        if m > max_min:
            max_min = m
    if max_scale > 0:
        iscale = f32(15.0) / max_scale
        for g in range(16):
            o[g] = nearest_int(iscale * scales[g]) & 0xFF
        d = put_f16(o, 80, max_scale / f32(15.0))
    else:
        o[0:16] = 0
        d = put_f16(o, 80, ZERO)
    if max_min > 0:
        iscale = f32(15.0) / max_min
        for g in range(16):
            o[g] |= (nearest_int(iscale * mins[g]) << 4) & 0xFF
        dmin = put_f16(o, 82, max_min / f32(15.0))
    else:
        dmin = put_f16(o, 82, ZERO)
    for g in range(16):
        dg = d * f32(o[g] & 0xF)
        if dg == 0:
            continue
        dm = dmin * f32(o[g] >> 4)
        for i in range(16 * g, 16 * g + 16):
            L[i] = max(0, min(3, nearest_int((x[i] + dm) / dg)))
    _pack2(L, o, 16)


@njit(cache=True, inline="always")
def _q3_scale(sc: np.ndarray, g: int) -> int:
    s = np.int64(sc[g]) & 0xF if g < 8 else np.int64(sc[g - 8]) >> 4
    return (s | (((np.int64(sc[8 + g % 4]) >> (2 * (g // 4))) & 3) << 4)) - 32


@njit(cache=True)
def _q3_k_block(x: np.ndarray, o: np.ndarray, L: np.ndarray, scales: np.ndarray) -> None:
    max_scale = ZERO
    amax = ZERO
    for g in range(16):
        s = make_q3_quants(16, 4, x[16 * g:16 * g + 16], L[16 * g:16 * g + 16])
        scales[g] = s
        if abs(s) > amax:
            amax = abs(s)
            max_scale = s
    sc = o[96:108]
    sc[:] = 0
    if max_scale != 0:
        iscale = f32(-32.0) / max_scale
        for g in range(16):
            l = max(-32, min(31, nearest_int(iscale * scales[g]))) + 32
            if g < 8:
                sc[g] = l & 0xF
            else:
                sc[g - 8] |= (l & 0xF) << 4
            sc[g % 4 + 8] |= (l >> 4) << (2 * (g // 4))
        d = put_f16(o, 108, f32(1.0) / iscale)
    else:
        d = put_f16(o, 108, ZERO)
    for g in range(16):
        dg = d * f32(_q3_scale(sc, g))
        if dg == 0:
            continue
        for i in range(16 * g, 16 * g + 16):
            L[i] = max(-4, min(3, nearest_int(x[i] / dg))) + 4
    o[0:32] = 0
    for i in range(256):  # 3rd bit of value i goes to hmask[i % 32], bit i // 32
        if L[i] > 3:
            o[i % 32] |= 1 << (i // 32)
            L[i] -= 4
    _pack2(L, o, 32)


@njit(cache=True, parallel=True)
def quantize_q2_k(x: np.ndarray, out: np.ndarray) -> None:
    nxt = np.zeros(1, np.int64)
    for _ in prange(WORKERS):
        L = np.zeros(256, np.int32)
        Laux = np.zeros(16, np.int32)
        w = np.zeros(16, np.float32)
        scales = np.zeros(16, np.float32)
        mins = np.zeros(16, np.float32)
        r = claim(nxt)
        while r < x.shape[0]:
            for b in range(x.shape[1] // 256):
                _q2_k_block(x[r, b * 256:b * 256 + 256], out[r, b * 84:b * 84 + 84], L, Laux, w,
                            scales, mins)
            r = claim(nxt)


@njit(cache=True, parallel=True)
def quantize_q3_k(x: np.ndarray, out: np.ndarray) -> None:
    nxt = np.zeros(1, np.int64)
    for _ in prange(WORKERS):
        L = np.zeros(256, np.int32)
        scales = np.zeros(16, np.float32)
        r = claim(nxt)
        while r < x.shape[0]:
            for b in range(x.shape[1] // 256):
                _q3_k_block(x[r, b * 256:b * 256 + 256], out[r, b * 110:b * 110 + 110], L, scales)
            r = claim(nxt)


@njit(cache=True, parallel=True)
def dequantize_q2_k(q: np.ndarray, y: np.ndarray) -> None:
    for r in prange(q.shape[0]):
        for b in range(y.shape[1] // 256):
            o = b * 84
            d = get_f16(q[r], o + 80)
            dmin = get_f16(q[r], o + 82)
            for i in range(256):
                s = q[r, o + i // 16]
                code = (q[r, o + 16 + 32 * (i // 128) + i % 32] >> (2 * ((i % 128) // 32))) & 3
                y[r, b * 256 + i] = d * f32(s & 0xF) * f32(code) - dmin * f32(s >> 4)


@njit(cache=True, parallel=True)
def dequantize_q3_k(q: np.ndarray, y: np.ndarray) -> None:
    for r in prange(q.shape[0]):
        for b in range(y.shape[1] // 256):
            o = b * 110
            d = get_f16(q[r], o + 108)
            sc = q[r, o + 96:o + 108]
            for i in range(256):
                dl = d * f32(_q3_scale(sc, i // 16))
                code = (q[r, o + 32 + 32 * (i // 128) + i % 32] >> (2 * ((i % 128) // 32))) & 3
                high = q[r, o + i % 32] & (1 << (i // 32))
                y[r, b * 256 + i] = dl * f32(code - (0 if high else 4))


class Q2_K(QuantFormat):
    name = "Q2_K"
    ggml_type = 10
    block_size = 256
    type_size = 84
    quantize_rows = quantize_q2_k
    dequantize_rows = dequantize_q2_k


class Q3_K(QuantFormat):
    name = "Q3_K"
    ggml_type = 11
    block_size = 256
    type_size = 110
    quantize_rows = quantize_q3_k
    dequantize_rows = dequantize_q3_k
