"""exp over the float32 lanes of a vector, for softmax and SiLU: e**x = 2**n * e**r with
n = rint(x / ln 2) and |r| <= ln(2) / 2, e**r from a degree-7 Taylor polynomial (truncation
error ~5e-9, so the result is within about one ulp, from rounding alone).
Inputs are clamped to [-87, 88] so 2**n stays a normal float (softmax inputs are <= 0 after
subtracting the max; anything below -87 is ~1e-38, zero for every later use; e**88 ~ 1.6e38
stands in for overflow in SiLU's 1 + e**-x).  Lane for lane the same operations at every
width, so a lane's result does not depend on the vector it is in."""

from __future__ import annotations

import numpy as np
from numba import njit

from .vectors import vsplat_f32
from .vmath import vadd, vcvt_f32, vmax, vmin, vmul, vpow2_i32, vround_i32, vsub

LOG2E = np.float32(1.4426950408889634)
LN2_HI = np.float32(0.693359375)  # ln 2 split so n * LN2_HI is exact for |n| < 2**9
LN2_LO = np.float32(-2.12194440e-4)
# 1/k! for k = 7 .. 1, Horner order
COEFFS = (np.float32(1.0 / 5040.0), np.float32(1.0 / 720.0), np.float32(1.0 / 120.0),
          np.float32(1.0 / 24.0), np.float32(1.0 / 6.0), np.float32(0.5), np.float32(1.0))


@njit(nogil=True)
def vexp(isa, x):
    x = vmin(vmax(x, vsplat_f32(isa, np.float32(-87.0))), vsplat_f32(isa, np.float32(88.0)))
    n = vround_i32(vmul(x, vsplat_f32(isa, LOG2E)))
    nf = vcvt_f32(n)
    r = vsub(vsub(x, vmul(nf, vsplat_f32(isa, LN2_HI))), vmul(nf, vsplat_f32(isa, LN2_LO)))
    p = vsplat_f32(isa, COEFFS[0])
    for k in range(1, 7):
        p = vadd(vmul(p, r), vsplat_f32(isa, COEFFS[k]))
    p = vadd(vmul(p, r), vsplat_f32(isa, np.float32(1.0)))
    return vmul(p, vpow2_i32(n))
