"""Q4_K and Q5_K: super-blocks of 256 values, 8 groups of 32, each with a 6-bit scale and a
6-bit minimum (packed into 12 bytes), f16 super-scales d and dmin.

Layouts (ggml-common.h): Q4_K = d, dmin, scales[12], qs[128] (144 bytes);
Q5_K = d, dmin, scales[12], qh[32], qs[128] (176 bytes). qs byte l of chunk c (64 values)
holds value 64c + l (low nibble) and 64c + 32 + l (high nibble); Q5_K's 5th bits are in qh.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .base import QuantFormat
from .kquant_search import make_qkx2_quants
from .numerics import ZERO, f32, get_f16, nearest_int, put_f16
from .rows import WORKERS, claim


@njit(cache=True, inline="always")
def scale_min_k4(j: int, s: np.ndarray) -> tuple[int, int]:
    """The j-th (scale, min) pair from the 12 packed bytes (ggml's get_scale_min_k4)."""
    if j < 4:
        return s[j] & 63, s[j + 4] & 63
    return (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)


@njit(cache=True)
def _qk_block(x: np.ndarray, o: np.ndarray, nmax: int, rmin: np.float32, nstep: int,
              L: np.ndarray, Laux: np.ndarray, w: np.ndarray, scales: np.ndarray,
              mins: np.ndarray) -> None:
    """Codes in L (0..nmax); writes d, dmin and the packed scales into o[0:16]."""
    max_scale = ZERO
    max_min = ZERO
    for g in range(8):
        xg = x[32 * g:32 * g + 32]
        sum_x2 = ZERO
        for i in range(32):
            sum_x2 += xg[i] * xg[i]
        av_x = np.sqrt(sum_x2 / f32(32.0))
        for i in range(32):
            w[i] = av_x + abs(xg[i])
        s, m = make_qkx2_quants(32, nmax, xg, w, L[32 * g:32 * g + 32], Laux, rmin,
                                f32(0.1), nstep, False)
        scales[g] = s
        mins[g] = m
        if s > max_scale:
            max_scale = s
        if m > max_min:
            max_min = m
    inv_scale = f32(63.0) / max_scale if max_scale > 0 else ZERO
    inv_min = f32(63.0) / max_min if max_min > 0 else ZERO
    sc = o[4:16]
    sc[:] = 0
    for g in range(8):
        ls = min(63, nearest_int(inv_scale * scales[g]) & 0xFF)
        lm = min(63, nearest_int(inv_min * mins[g]) & 0xFF)
        if g < 4:
            sc[g] = ls
            sc[g + 4] = lm
        else:
            sc[g + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
            sc[g - 4] |= (ls >> 4) << 6
            sc[g] |= (lm >> 4) << 6
    d = put_f16(o, 0, max_scale / f32(63.0))
    dmin = put_f16(o, 2, max_min / f32(63.0))
    for g in range(8):
        s, m = scale_min_k4(g, sc)
        dg = d * f32(s)
        if dg == 0:
            continue
        dm = dmin * f32(m)
        for i in range(32 * g, 32 * g + 32):
            L[i] = max(0, min(nmax, nearest_int((x[i] + dm) / dg)))


@njit(cache=True, parallel=True)
def quantize_q4_k(x: np.ndarray, out: np.ndarray) -> None:
    nxt = np.zeros(1, np.int64)
    for _ in prange(WORKERS):
        L = np.zeros(256, np.int32)
        Laux = np.zeros(32, np.int32)
        w = np.zeros(32, np.float32)
        scales = np.zeros(8, np.float32)
        mins = np.zeros(8, np.float32)
        r = claim(nxt)
        while r < x.shape[0]:
            for b in range(x.shape[1] // 256):
                o = out[r, b * 144:b * 144 + 144]
                _qk_block(x[r, b * 256:b * 256 + 256], o, 15, f32(-1.0), 20, L, Laux, w, scales,
                          mins)
                for c in range(4):
                    for l in range(32):
                        o[16 + 32 * c + l] = L[64 * c + l] | (L[64 * c + 32 + l] << 4)
            r = claim(nxt)


@njit(cache=True, parallel=True)
def quantize_q5_k(x: np.ndarray, out: np.ndarray) -> None:
    nxt = np.zeros(1, np.int64)
    for _ in prange(WORKERS):
        L = np.zeros(256, np.int32)
        Laux = np.zeros(32, np.int32)
        w = np.zeros(32, np.float32)
        scales = np.zeros(8, np.float32)
        mins = np.zeros(8, np.float32)
        r = claim(nxt)
        while r < x.shape[0]:
            for b in range(x.shape[1] // 256):
                o = out[r, b * 176:b * 176 + 176]
                _qk_block(x[r, b * 256:b * 256 + 256], o, 31, f32(-0.5), 15, L, Laux, w, scales,
                          mins)
                o[16:48] = 0
                for c in range(4):
                    for l in range(32):
                        l1 = L[64 * c + l]
                        l2 = L[64 * c + 32 + l]
                        if l1 > 15:
                            l1 -= 16
                            o[16 + l] |= 1 << (2 * c)
                        if l2 > 15:
                            l2 -= 16
                            o[16 + l] |= 2 << (2 * c)
                        o[48 + 32 * c + l] = l1 | (l2 << 4)
            r = claim(nxt)


@njit(cache=True, parallel=True)
def _dequantize_qk(q: np.ndarray, y: np.ndarray, type_size: int, five_bits: bool) -> None:
    qs_at = 48 if five_bits else 16
    for r in prange(q.shape[0]):
        for b in range(y.shape[1] // 256):
            o = b * type_size
            d = get_f16(q[r], o)
            dmin = get_f16(q[r], o + 2)
            sc = q[r, o + 4:o + 16]
            for c in range(4):
                s1, m1 = scale_min_k4(2 * c, sc)
                s2, m2 = scale_min_k4(2 * c + 1, sc)
                d1 = d * f32(s1)
                d2 = d * f32(s2)
                dm1 = dmin * f32(m1)
                dm2 = dmin * f32(m2)
                for l in range(32):
                    byte = q[r, o + qs_at + 32 * c + l]
                    lo = byte & 15
                    hi = byte >> 4
                    if five_bits:
                        hb = q[r, o + 16 + l]
                        lo += 16 if hb & (1 << (2 * c)) else 0
                        hi += 16 if hb & (2 << (2 * c)) else 0
                    y[r, b * 256 + 64 * c + l] = d1 * f32(lo) - dm1
                    y[r, b * 256 + 64 * c + 32 + l] = d2 * f32(hi) - dm2


@njit(cache=True)
def dequantize_q4_k(q: np.ndarray, y: np.ndarray) -> None:
    _dequantize_qk(q, y, 144, False)


@njit(cache=True)
def dequantize_q5_k(q: np.ndarray, y: np.ndarray) -> None:
    _dequantize_qk(q, y, 176, True)


class Q4_K(QuantFormat):
    name = "Q4_K"
    ggml_type = 12
    block_size = 256
    type_size = 144
    quantize_rows = quantize_q4_k
    dequantize_rows = dequantize_q4_k


class Q5_K(QuantFormat):
    name = "Q5_K"
    ggml_type = 13
    block_size = 256
    type_size = 176
    quantize_rows = quantize_q5_k
    dequantize_rows = dequantize_q5_k
