"""The scale searches of ggml's K-quants (make_qx_quants, make_q3_quants, make_qkx2_quants),
written in float32 with the same operation order, so the chosen codes match bit for bit.

Codes go into int32 scratch arrays; each function returns the group's scale (and minimum).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .numerics import GROUP_MAX_EPS, ONE, ZERO, f32, nearest_int


@njit(cache=True)
def make_qx_quants(n: int, nmax: int, x: np.ndarray, L: np.ndarray) -> np.float32:
    """Symmetric codes in [0, 2*nmax) with weights x^2 (ggml's rmse_type 1, no imatrix)."""
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
        w = x[i] * x[i]
        sumlx += w * x[i] * f32(l)
        suml2 += w * f32(l) * f32(l)
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
            w = x[i] * x[i]
            sumlx += w * x[i] * f32(l)
            suml2 += w * f32(l) * f32(l)
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[i] = nmax + max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@njit(cache=True)
def make_q3_quants(n: int, nmax: int, x: np.ndarray, L: np.ndarray) -> np.float32:
    """Q3_K's search: start from the max-based scale, then move single codes while the
    weighted error drops (at most 5 passes)."""
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
        L[i] = l
        w = x[i] * x[i]
        sumlx += w * x[i] * f32(l)
        suml2 += w * f32(l) * f32(l)
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            w = x[i] * x[i]
            slx = sumlx - w * x[i] * f32(L[i])
            if slx > 0:
                sl2 = suml2 - w * f32(L[i]) * f32(L[i])
                new_l = max(-nmax, min(nmax - 1, nearest_int(x[i] * sl2 / slx)))
                if new_l != L[i]:
                    slx += w * x[i] * f32(new_l)
                    sl2 += w * f32(new_l) * f32(new_l)
                    if sl2 > 0 and slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    for i in range(n):
        L[i] += nmax
    return sumlx / suml2 if suml2 > 0 else ZERO


@njit(cache=True)
def make_qkx2_quants(n: int, nmax: int, x: np.ndarray, weights: np.ndarray, L: np.ndarray,
                     Laux: np.ndarray, rmin: np.float32, rdelta: np.float32, nstep: int,
                     use_mad: bool) -> tuple[np.float32, np.float32]:
    """Asymmetric codes in [0, nmax]: try nstep+1 scales around the min/max one and keep the
    weighted least-squares fit with the smallest error. Returns (scale, -min)."""
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
    if hi == lo:
        for i in range(n):
            L[i] = 0
        return ZERO, -lo
    iscale = f32(nmax) / (hi - lo)
    scale = ONE / iscale
    best_error = ZERO
    for i in range(n):
        L[i] = max(0, min(nmax, nearest_int(iscale * (x[i] - lo))))
        diff = scale * f32(L[i]) + lo - x[i]
        diff = abs(diff) if use_mad else diff * diff
        best_error += weights[i] * diff
    if nstep < 1:
        return scale, -lo
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
            cur_error = ZERO
            for i in range(n):
                diff = this_scale * f32(Laux[i]) + this_min - x[i]
                diff = abs(diff) if use_mad else diff * diff
                cur_error += weights[i] * diff
            if cur_error < best_error:
                for i in range(n):
                    L[i] = Laux[i]
                best_error = cur_error
                scale = this_scale
                lo = this_min
    return scale, -lo
