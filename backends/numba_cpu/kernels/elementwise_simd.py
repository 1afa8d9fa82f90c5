"""The per-token steps that are heavy in long prefills, in vectors of the IsaType's width:
activation quantization (one pass per matmul input) and SwiGLU (an exp per hidden unit).

quantize_rows_simd computes exactly what kernels/quantize.py computes (same f32 operations,
f16 rounding by the hardware converter, which rounds to nearest even like round_f16; the
block's max and code sum are exact whatever the width groups), so every path feeds the matmuls
identical codes.  SwiGLU is lane-wise, so every width gives the same bits.  Rows are
independent; long batches split over threads.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..simd.vectors import lanes, vload_f32, vsplat_f32, vstore_f32, vstore_i8, vzero_i32
from ..simd.vexp import vexp
from ..simd.vmath import (
    sround_f16,
    vabs,
    vadd,
    vadd_i32,
    vdiv,
    vhmax,
    vhsum_i32,
    vmax,
    vmul,
    vround_i32,
    vsub,
)
from .elementwise import PARALLEL_ROWS


@njit(nogil=True)
def _quantize_row(isa, x, xq, xd, xi, xs):
    n = lanes(isa)
    per_block = 32 // n  # vectors per block of 32: a constant, so LLVM unrolls both loops
    for b in range(x.shape[0] // 32):
        o = 32 * b
        amax_v = vabs(vload_f32(isa, x, o))
        for k in range(1, per_block):
            amax_v = vmax(amax_v, vabs(vload_f32(isa, x, o + k * n)))
        amax = vhmax(amax_v)
        d = amax / np.float32(127.0)
        inv = vsplat_f32(isa, np.float32(127.0) / amax if amax > 0 else np.float32(0.0))
        codes = vzero_i32(isa)
        for k in range(per_block):
            c = vround_i32(vmul(vload_f32(isa, x, o + k * n), inv))
            vstore_i8(xq, o + k * n, c)
            codes = vadd_i32(codes, c)
        total = vhsum_i32(codes)
        xd[b] = sround_f16(d)
        xi[b] = total
        xs[b] = sround_f16(d * np.float32(total))


@njit(cache=True, nogil=True, parallel=True)
def quantize_rows_simd(isa, x, xq, xd, xi, xs):
    """x (n_tokens, cols) f32 -> xq (n_tokens, cols) i8, xd, xs (n_tokens, n_blocks) f32,
    xi (n_tokens, n_blocks) i32, as kernels/quantize.quantize_rows."""
    n = x.shape[0]
    if n < PARALLEL_ROWS:
        for i in range(n):
            _quantize_row(isa, x[i], xq[i], xd[i], xi[i], xs[i])
    else:
        for i in prange(n):
            _quantize_row(isa, x[i], xq[i], xd[i], xi[i], xs[i])


@njit(nogil=True)
def _swiglu_row(isa, gu, n_ff, out):
    one = vsplat_f32(isa, np.float32(1.0))
    for c in range(0, n_ff, lanes(isa)):
        g = vload_f32(isa, gu, c)
        silu = vdiv(g, vadd(one, vexp(isa, vsub(vsplat_f32(isa, np.float32(0.0)), g))))
        vstore_f32(out, c, vmul(silu, vload_f32(isa, gu, n_ff + c)))


@njit(cache=True, nogil=True, parallel=True)
def swiglu_simd(isa, gate_up, n_ff, out):
    """gate_up (n_tokens, 2 n_ff) = [gate | up] -> out (n_tokens, n_ff); n_ff a multiple of
    the lane count."""
    n = gate_up.shape[0]
    if n < PARALLEL_ROWS:
        for i in range(n):
            _swiglu_row(isa, gate_up[i], n_ff, out[i])
    else:
        for i in prange(n):
            _swiglu_row(isa, gate_up[i], n_ff, out[i])
