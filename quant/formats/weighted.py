"""Importance-weighted quantization: ggml's quantize_row_*_impl paths, taken when an importance
matrix is given (llama.cpp passes `quant_weights`, one float per column). Same float32
operation order as ggml-quants.c, so the bytes match llama.cpp's given the same imatrix.

Each kernel: (x (rows, n) float32, out (rows, row_bytes) uint8, qw (n,) float32).
Types here: Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, and Q2_K / Q3_K at the end (Q8_0 and the
float types ignore the imatrix in ggml).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .numerics import GROUP_MAX_EPS, ZERO, f32, nearest_int, put_f16
from .q23_k import _pack2, _q3_scale
from .rows import WORKERS, claim


@njit(cache=True)
def make_qx_quants_w(n: int, nmax: int, x: np.ndarray, L: np.ndarray,
                     qw: np.ndarray) -> np.float32:
    """make_qx_quants(rmse_type 1) with explicit weights qw; codes in [0, 2*nmax)."""
    mx = ZERO
    amax = ZERO
    for i in range(n):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            mx = x[i]
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return ZERO
    iscale = f32(-nmax) / mx
    sumlx = ZERO
    suml2 = ZERO
    for i in range(n):
        l = max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))
        L[i] = l + nmax
        sumlx += qw[i] * x[i] * f32(l)
        suml2 += qw[i] * f32(l) * f32(l)
    scale = sumlx / suml2 if suml2 != 0 else ZERO
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(f32(nmax) + f32(0.1) * f32(step)) / mx
        sumlx = ZERO
        suml2 = ZERO
        for i in range(n):
            l = max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))
            sumlx += qw[i] * x[i] * f32(l)
            suml2 += qw[i] * f32(l) * f32(l)
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[i] = nmax + max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@njit(cache=True)
def make_qkx3_quants(n: int, nmax: int, x: np.ndarray, weights: np.ndarray, L: np.ndarray,
                     Laux: np.ndarray, rmin: np.float32, rdelta: np.float32,
                     nstep: int) -> tuple[np.float32, np.float32]:
    """Asymmetric weighted fit (use_mad false). Returns (scale, -min)."""
    lo = x[0]
    hi = x[0]
    sum_w = weights[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < lo:
            lo = x[i]
        if x[i] > hi:
            hi = x[i]
        w = weights[i]
        sum_w += w
        sum_x += w * x[i]
    if lo > 0:
        lo = ZERO
    if hi <= lo:
        for i in range(n):
            L[i] = 0
        return ZERO, -lo
    iscale = f32(nmax) / (hi - lo)
    scale = f32(1.0) / iscale
    best_mad = ZERO
    for i in range(n):
        L[i] = max(0, min(nmax, nearest_int(iscale * (x[i] - lo))))
        diff = scale * f32(L[i]) + lo - x[i]
        best_mad += weights[i] * (diff * diff)
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * f32(step) + f32(nmax)) / (hi - lo)
        sum_l = ZERO
        sum_l2 = ZERO
        sum_xl = ZERO
        for i in range(n):
            l = max(0, min(nmax, nearest_int(iscale * (x[i] - lo))))
            Laux[i] = l
            w = weights[i]
            sum_l += w * f32(l)
            sum_l2 += w * f32(l) * f32(l)
            sum_xl += w * f32(l) * x[i]
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > 0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > 0:
                this_min = ZERO
                this_scale = sum_xl / sum_l2
            mad = ZERO
            for i in range(n):
                diff = this_scale * f32(Laux[i]) + this_min - x[i]
                mad += weights[i] * (diff * diff)
            if mad < best_mad:
                for i in range(n):
                    L[i] = Laux[i]
                best_mad = mad
                scale = this_scale
                lo = this_min
    return scale, -lo


@njit(cache=True)
def make_qp_quants(n: int, nmax: int, x: np.ndarray, L: np.ndarray,
                   qw: np.ndarray) -> np.float32:
    """Non-negative codes in [0, nmax] for the sub-block scales of Q4_K/Q5_K (weights qw)."""
    mx = ZERO
    for i in range(n):
        mx = max(mx, x[i])
    if mx < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return ZERO
    iscale = f32(nmax) / mx
    for i in range(n):
        L[i] = nearest_int(iscale * x[i]) & 0xFF  # uint8 in ggml
    scale = f32(1.0) / iscale
    best_mse = ZERO
    for i in range(n):
        diff = x[i] - scale * f32(L[i])
        best_mse += qw[i] * diff * diff
    for step in range(-4, 5):
        if step == 0:
            continue
        iscale_is = (f32(0.1) * f32(step) + f32(nmax)) / mx
        scale_is = f32(1.0) / iscale_is
        mse = ZERO
        for i in range(n):
            l = min(nmax, nearest_int(iscale_is * x[i]))
            diff = x[i] - scale_is * f32(l)
            mse += qw[i] * diff * diff
        if mse < best_mse:
            best_mse = mse
            iscale = iscale_is
    sumlx = ZERO
    suml2 = ZERO
    for i in range(n):
        l = min(nmax, nearest_int(iscale * x[i]))
        L[i] = l & 0xFF
        sumlx += qw[i] * x[i] * f32(L[i])
        suml2 += qw[i] * f32(L[i]) * f32(L[i])
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            w = qw[i]
            slx = sumlx - w * x[i] * f32(L[i])
            sl2 = suml2 - w * f32(L[i]) * f32(L[i])
            if slx > 0 and sl2 > 0:
                new_l = min(nmax, nearest_int(x[i] * sl2 / slx))
                if new_l != L[i]:
                    slx += w * x[i] * f32(new_l)
                    sl2 += w * f32(new_l) * f32(new_l)
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l & 0xFF  # uint8 in ggml
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    return sumlx / suml2 if suml2 > 0 else ZERO


@njit(cache=True, inline="always")
def _row_sigma2(x: np.ndarray) -> np.float32:
    s = ZERO
    for j in range(x.shape[0]):
        s += x[j] * x[j]
    return s / f32(x.shape[0])


@njit(cache=True, inline="always")
def _block_weights(x: np.ndarray, qw: np.ndarray, sigma2: np.float32, w: np.ndarray) -> None:
    for j in range(x.shape[0]):
        w[j] = qw[j] * np.sqrt(sigma2 + x[j] * x[j])


@njit(cache=True, parallel=True)
def quantize_q4_0_w(x: np.ndarray, out: np.ndarray, qw: np.ndarray) -> None:
    nxt = np.zeros(1, np.int64)
    for _ in prange(WORKERS):
        L = np.zeros(32, np.int32)
        w = np.zeros(32, np.float32)
        r = claim(nxt)
        while r < x.shape[0]:
            sigma2 = _row_sigma2(x[r])
            for b in range(x.shape[1] // 32):
                xb = x[r, 32 * b:32 * b + 32]
                _block_weights(xb, qw[32 * b:32 * b + 32], sigma2, w)
                o = out[r, 18 * b:18 * b + 18]
                put_f16(o, 0, make_qx_quants_w(32, 8, xb, L, w))
                for j in range(16):
                    o[2 + j] = L[j] | (L[j + 16] << 4)
            r = claim(nxt)


@njit(cache=True, parallel=True)
def quantize_q5_0_w(x: np.ndarray, out: np.ndarray, qw: np.ndarray) -> None:
    nxt = np.zeros(1, np.int64)
    for _ in prange(WORKERS):
        L = np.zeros(32, np.int32)
        w = np.zeros(32, np.float32)
        r = claim(nxt)
        while r < x.shape[0]:
            sigma2 = _row_sigma2(x[r])
            for b in range(x.shape[1] // 32):
                xb = x[r, 32 * b:32 * b + 32]
                _block_weights(xb, qw[32 * b:32 * b + 32], sigma2, w)
                o = out[r, 22 * b:22 * b + 22]
                put_f16(o, 0, make_qx_quants_w(32, 16, xb, L, w))
                _pack5(o, 2, L)
            r = claim(nxt)


@njit(cache=True, inline="always")
def _pack5(o: np.ndarray, at: int, L: np.ndarray) -> None:
    """qh (u32 LE) at o[at:at+4], then qs[16]: low nibbles of values j and j+16."""
    qh = 0
    for j in range(16):
        a = L[j]
        b = L[j + 16]
        o[at + 4 + j] = (a & 15) | ((b & 15) << 4)
        qh |= ((a & 16) >> 4) << j
        qh |= ((b & 16) >> 4) << (j + 16)
    for k in range(4):
        o[at + k] = (qh >> (8 * k)) & 0xFF


@njit(cache=True, parallel=True)
def _qkx_32(x: np.ndarray, out: np.ndarray, qw: np.ndarray, nmax: int, type_size: int) -> None:
    """Q4_1 / Q5_1 weighted: make_qkx3_quants per block, then d, m and the codes."""
    nxt = np.zeros(1, np.int64)
    for _ in prange(WORKERS):
        L = np.zeros(32, np.int32)
        Laux = np.zeros(32, np.int32)
        w = np.zeros(32, np.float32)
        r = claim(nxt)
        while r < x.shape[0]:
            sigma2 = _row_sigma2(x[r])
            for b in range(x.shape[1] // 32):
                xb = x[r, 32 * b:32 * b + 32]
                _block_weights(xb, qw[32 * b:32 * b + 32], sigma2, w)
                d, m = make_qkx3_quants(32, nmax, xb, w, L, Laux, f32(-0.9), f32(0.05), 36)
                o = out[r, type_size * b:type_size * b + type_size]
                put_f16(o, 0, d)
                put_f16(o, 2, -m)
                if nmax == 15:
                    for j in range(16):
                        o[4 + j] = L[j] | (L[j + 16] << 4)
                else:
                    _pack5(o, 4, L)
            r = claim(nxt)


@njit(cache=True)
def quantize_q4_1_w(x: np.ndarray, out: np.ndarray, qw: np.ndarray) -> None:
    _qkx_32(x, out, qw, 15, 20)


@njit(cache=True)
def quantize_q5_1_w(x: np.ndarray, out: np.ndarray, qw: np.ndarray) -> None:
    _qkx_32(x, out, qw, 31, 24)


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
        _block_weights(xg, qw[32 * g:32 * g + 32], sigma2, w)
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
        _block_weights(xg, qw[16 * g:16 * g + 16], sigma2, w)
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
        _block_weights(xg, qw[16 * g:16 * g + 16], sigma2, w)
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


# ggml type id -> weighted kernel
WEIGHTED = {2: quantize_q4_0_w, 3: quantize_q4_1_w, 6: quantize_q5_0_w, 7: quantize_q5_1_w,
            10: quantize_q2_k_w, 11: quantize_q3_k_w, 12: quantize_q4_k_w, 13: quantize_q5_k_w,
            14: quantize_q6_k_w}
# types whose ggml quantizer ignores the importance matrix
IGNORES_IMATRIX = {0, 1, 8, 30}  # F32, F16, Q8_0, BF16
