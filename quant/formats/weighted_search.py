"""The importance-weighted searches of ggml-quants.c (make_qx_quants, make_qkx3_quants,
make_qp_quants with quant_weights) and the per-weight importance llama.cpp derives from an imatrix
column and the row's spread; shared by weighted_legacy.py and weighted_kquant.py.  Same float32
operation order as ggml, so the chosen codes match llama.cpp's bit for bit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .numerics import GROUP_MAX_EPS, ZERO, f32, nearest_int


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
def row_sigma2(x: np.ndarray) -> np.float32:
    s = ZERO
    for j in range(x.shape[0]):
        s += x[j] * x[j]
    return s / f32(x.shape[0])


@njit(cache=True, inline="always")
def block_weights(x: np.ndarray, qw: np.ndarray, sigma2: np.float32, w: np.ndarray) -> None:
    for j in range(x.shape[0]):
        w[j] = qw[j] * np.sqrt(sigma2 + x[j] * x[j])

