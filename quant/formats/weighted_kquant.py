"""Importance-weighted Q2_K, Q3_K, Q4_K, Q5_K and Q6_K (ggml's quantize_row_q*_K_impl with
quant_weights).

Each kernel: (x (rows, n) float32, out (rows, row_bytes) uint8, qw (n,) float32).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .numerics import GROUP_MAX_EPS, ZERO, f32, nearest_int, put_f16
from .q23_k import _pack2, _q3_scale
from .rows import WORKERS, claim
from .weighted_search import (
    block_weights,
    make_qkx3_quants,
    make_qp_quants,
    make_qx_quants_w,
)


@njit(cache=True)
def _qk_block_w(x: np.ndarray, qw: np.ndarray, o: np.ndarray, nmax: int, L: np.ndarray,
                Laux: np.ndarray, w: np.ndarray, sw: np.ndarray, scales: np.ndarray,
                mins: np.ndarray, Ls: np.ndarray, Lm: np.ndarray) -> None:
    """Q4_K / Q5_K super-block: codes in L (0..nmax); d, dmin and packed scales in o[0:16]."""
    sum_x2 = ZERO
    for i in range(256):
        sum_x2 += x[i] * x[i]
    sigma2 = f32(2.0) * sum_x2 / f32(256.0)
    for g in range(8):
        xg = x[32 * g:32 * g + 32]
        block_weights(xg, qw[32 * g:32 * g + 32], sigma2, w)
        s = ZERO
        for i in range(32):
            s += w[i]
        sw[g] = s
        scales[g], mins[g] = make_qkx3_quants(32, nmax, xg, w, L[32 * g:32 * g + 32], Laux,
                                              f32(-0.9), f32(0.05), 36)
    d_block = make_qp_quants(8, 63, scales, Ls, sw)
    m_block = make_qp_quants(8, 63, mins, Lm, sw)
    sc = o[4:16]
    sc[:] = 0
    for g in range(8):
        ls = min(63, Ls[g])
        lm = min(63, Lm[g])
        if g < 4:
            sc[g] = ls
            sc[g + 4] = lm
        else:
            sc[g + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
            sc[g - 4] |= (ls >> 4) << 6
            sc[g] |= (lm >> 4) << 6
    d = put_f16(o, 0, d_block)
    dmin = put_f16(o, 2, m_block)
    for g in range(8):
        if g < 4:
            s, m = sc[g] & 63, sc[g + 4] & 63
        else:
            s = (sc[g + 4] & 0xF) | ((sc[g - 4] >> 6) << 4)
            m = (sc[g + 4] >> 4) | ((sc[g] >> 6) << 4)
        dg = d * f32(s)
        if dg == 0:
            continue
        dm = dmin * f32(m)
        for i in range(32 * g, 32 * g + 32):
            L[i] = max(0, min(nmax, nearest_int((x[i] + dm) / dg)))


@njit(cache=True, parallel=True)
def quantize_q4_k_w(x: np.ndarray, out: np.ndarray, qw: np.ndarray) -> None:
    nxt = np.zeros(1, np.int64)
    for _ in prange(WORKERS):
        L = np.zeros(256, np.int32)
        Laux = np.zeros(32, np.int32)
        w = np.zeros(32, np.float32)
        sw = np.zeros(8, np.float32)
        scales = np.zeros(8, np.float32)
        mins = np.zeros(8, np.float32)
        Ls = np.zeros(8, np.int32)
        Lm = np.zeros(8, np.int32)
        r = claim(nxt)
        while r < x.shape[0]:
            for b in range(x.shape[1] // 256):
                o = out[r, b * 144:b * 144 + 144]
                _qk_block_w(x[r, b * 256:b * 256 + 256], qw[b * 256:b * 256 + 256], o, 15, L,
                            Laux, w, sw, scales, mins, Ls, Lm)
                for c in range(4):
                    for l in range(32):
                        o[16 + 32 * c + l] = L[64 * c + l] | (L[64 * c + 32 + l] << 4)
            r = claim(nxt)


@njit(cache=True, parallel=True)
def quantize_q5_k_w(x: np.ndarray, out: np.ndarray, qw: np.ndarray) -> None:
    nxt = np.zeros(1, np.int64)
    for _ in prange(WORKERS):
        L = np.zeros(256, np.int32)
        Laux = np.zeros(32, np.int32)
        w = np.zeros(32, np.float32)
        sw = np.zeros(8, np.float32)
        scales = np.zeros(8, np.float32)
        mins = np.zeros(8, np.float32)
        Ls = np.zeros(8, np.int32)
        Lm = np.zeros(8, np.int32)
        r = claim(nxt)
        while r < x.shape[0]:
            for b in range(x.shape[1] // 256):
                o = out[r, b * 176:b * 176 + 176]
                _qk_block_w(x[r, b * 256:b * 256 + 256], qw[b * 256:b * 256 + 256], o, 31, L,
                            Laux, w, sw, scales, mins, Ls, Lm)
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
def quantize_q6_k_w(x: np.ndarray, out: np.ndarray, qw: np.ndarray) -> None:
    nxt = np.zeros(1, np.int64)
    for _ in prange(WORKERS):
        L = np.zeros(256, np.int32)
        scales = np.zeros(16, np.float32)
        r = claim(nxt)
        while r < x.shape[0]:
            for b in range(x.shape[1] // 256):
                xb = x[r, b * 256:b * 256 + 256]
                o = out[r, b * 210:b * 210 + 210]
                max_scale = ZERO
                max_abs = ZERO
                for g in range(16):
                    s = make_qx_quants_w(16, 32, xb[16 * g:16 * g + 16], L[16 * g:16 * g + 16],
                                         qw[b * 256 + 16 * g:b * 256 + 16 * g + 16])
                    scales[g] = s
                    if abs(s) > max_abs:
                        max_abs = abs(s)
                        max_scale = s
                o[:] = 0
                if max_abs < GROUP_MAX_EPS:
                    continue
                iscale = f32(-128.0) / max_scale
                d = put_f16(o, 208, f32(1.0) / iscale)
                for g in range(16):
                    sc = min(127, nearest_int(iscale * scales[g]))
                    o[192 + g] = sc & 0xFF
                    dg = d * f32(np.int8(sc & 0xFF))
                    if dg == 0:
                        continue
                    for i in range(16 * g, 16 * g + 16):
                        L[i] = max(-32, min(31, nearest_int(xb[i] / dg))) + 32
                for h in range(2):
                    j = 128 * h
                    for l in range(32):
                        o[64 * h + l] = (L[j + l] & 15) | ((L[j + l + 64] & 15) << 4)
                        o[64 * h + l + 32] = (L[j + l + 32] & 15) | ((L[j + l + 96] & 15) << 4)
                        o[128 + 32 * h + l] = ((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2)
                                               | ((L[j + l + 64] >> 4) << 4)
                                               | ((L[j + l + 96] >> 4) << 6))
            r = claim(nxt)


@njit(cache=True)
def _q2_k_block_w(x: np.ndarray, qw: np.ndarray, o: np.ndarray, L: np.ndarray, Laux: np.ndarray,
                  w: np.ndarray, sw: np.ndarray, scales: np.ndarray, mins: np.ndarray,
                  Ls: np.ndarray, Lm: np.ndarray) -> None:
    """quantize_row_q2_K_impl for one super-block: a weighted asymmetric fit per group of 16,
    then the 16 scales and 16 mins themselves quantized to 4 bits by make_qp_quants."""
    sum_x2 = ZERO
    for i in range(256):
        sum_x2 += x[i] * x[i]
    sigma2 = sum_x2 / f32(256.0)  # (Q3_K..Q5_K use twice this)
    for g in range(16):
        xg = x[16 * g:16 * g + 16]
        block_weights(xg, qw[16 * g:16 * g + 16], sigma2, w)
        s = ZERO
        for i in range(16):
            s += w[i]
        sw[g] = s
        scales[g], mins[g] = make_qkx3_quants(16, 3, xg, w, L[16 * g:16 * g + 16], Laux,
                                              f32(-0.9), f32(0.05), 36)
    d = put_f16(o, 80, make_qp_quants(16, 15, scales, Ls, sw))
    dmin = put_f16(o, 82, make_qp_quants(16, 15, mins, Lm, sw))
    for g in range(16):
        o[g] = (Ls[g] | (Lm[g] << 4)) & 0xFF
    for g in range(16):
        dg = d * f32(o[g] & 0xF)
        if dg == 0:
            continue
        dm = dmin * f32(o[g] >> 4)
        for i in range(16 * g, 16 * g + 16):
            L[i] = max(0, min(3, nearest_int((x[i] + dm) / dg)))
    _pack2(L, o, 16)


@njit(cache=True, parallel=True)
def quantize_q2_k_w(x: np.ndarray, out: np.ndarray, qw: np.ndarray) -> None:
    nxt = np.zeros(1, np.int64)
    for _ in prange(WORKERS):
        L = np.zeros(256, np.int32)
        Laux = np.zeros(16, np.int32)
        w = np.zeros(16, np.float32)
        sw = np.zeros(16, np.float32)
        scales = np.zeros(16, np.float32)
        mins = np.zeros(16, np.float32)
        Ls = np.zeros(16, np.int32)
        Lm = np.zeros(16, np.int32)
        r = claim(nxt)
        while r < x.shape[0]:
            for b in range(x.shape[1] // 256):
                _q2_k_block_w(x[r, b * 256:b * 256 + 256], qw[b * 256:b * 256 + 256],
                              out[r, b * 84:b * 84 + 84], L, Laux, w, sw, scales, mins, Ls, Lm)
            r = claim(nxt)


@njit(cache=True)
def _q3_k_block_w(x: np.ndarray, qw: np.ndarray, o: np.ndarray, L: np.ndarray, w: np.ndarray,
                  sw: np.ndarray, scales: np.ndarray, Ls: np.ndarray) -> None:
    """quantize_row_q3_K_impl for one super-block: make_qx_quants with weights per group, and
    again over the 16 group scales (weighted by each group's weight sum) for the 6-bit scales."""
    sum_x2 = ZERO
    for i in range(256):
        sum_x2 += x[i] * x[i]
    sigma2 = f32(2.0) * sum_x2 / f32(256.0)
    for g in range(16):
        xg = x[16 * g:16 * g + 16]
        block_weights(xg, qw[16 * g:16 * g + 16], sigma2, w)
        s = ZERO
        for i in range(16):
            s += w[i]
        sw[g] = s
        scales[g] = make_qx_quants_w(16, 4, xg, L[16 * g:16 * g + 16], w)
    sc = o[96:108]
    sc[:] = 0
    d_block = make_qx_quants_w(16, 32, scales, Ls, sw)
    for g in range(16):
        l = Ls[g]
        if g < 8:
            sc[g] = l & 0xF
        else:
            sc[g - 8] |= (l & 0xF) << 4
        sc[g % 4 + 8] |= (l >> 4) << (2 * (g // 4))
    d = put_f16(o, 108, d_block)
    for g in range(16):
        dg = d * f32(_q3_scale(sc, g))
        if dg == 0:
            continue  # the group keeps make_qx_quants' codes, as in ggml
        for i in range(16 * g, 16 * g + 16):
            L[i] = max(-4, min(3, nearest_int(x[i] / dg))) + 4
    o[0:32] = 0
    for i in range(256):  # 3rd bit of value i goes to hmask[i % 32], bit i // 32
        if L[i] > 3:
            o[i % 32] |= 1 << (i // 32)
            L[i] -= 4
    _pack2(L, o, 32)


@njit(cache=True, parallel=True)
def quantize_q3_k_w(x: np.ndarray, out: np.ndarray, qw: np.ndarray) -> None:
    nxt = np.zeros(1, np.int64)
    for _ in prange(WORKERS):
        L = np.zeros(256, np.int32)
        w = np.zeros(16, np.float32)
        sw = np.zeros(16, np.float32)
        scales = np.zeros(16, np.float32)
        Ls = np.zeros(16, np.int32)
        r = claim(nxt)
        while r < x.shape[0]:
            for b in range(x.shape[1] // 256):
                _q3_k_block_w(x[r, b * 256:b * 256 + 256], qw[b * 256:b * 256 + 256],
                              out[r, b * 110:b * 110 + 110], L, w, sw, scales, Ls)
            r = claim(nxt)
