"""Activation quantization and SwiGLU with NEON (simd/neon.py, 8 lanes = two q registers):
the AArch64 counterparts of kernels/elementwise_avx2.py, computing exactly what
kernels/quantize.py computes (so every path feeds the matmuls identical codes) and SiLU with the
same exp algorithm."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..simd.neon import (
    sround_f16,
    vabs,
    vadd,
    vadd_i32,
    vdiv,
    vexp,
    vhmax,
    vhsum_i32,
    vload_f32,
    vmax,
    vmul,
    vround_i32,
    vsplat_f32,
    vstore_f32,
    vstore_i8,
    vsub,
)
from .elementwise_avx512 import PARALLEL_ROWS


@njit(nogil=True)
def _quantize_row(x, xq, xd, xi, xs):
    for b in range(x.shape[0] // 32):
        o = 32 * b
        v0 = vload_f32(x, o)
        v1 = vload_f32(x, o + 8)
        v2 = vload_f32(x, o + 16)
        v3 = vload_f32(x, o + 24)
        amax = vhmax(vmax(vmax(vabs(v0), vabs(v1)), vmax(vabs(v2), vabs(v3))))
        d = amax / np.float32(127.0)
        inv = vsplat_f32(np.float32(127.0) / amax if amax > 0 else np.float32(0.0))
        c0 = vround_i32(vmul(v0, inv))
        c1 = vround_i32(vmul(v1, inv))
        c2 = vround_i32(vmul(v2, inv))
        c3 = vround_i32(vmul(v3, inv))
        vstore_i8(xq, o, c0)
        vstore_i8(xq, o + 8, c1)
        vstore_i8(xq, o + 16, c2)
        vstore_i8(xq, o + 24, c3)
        total = vhsum_i32(vadd_i32(vadd_i32(c0, c1), vadd_i32(c2, c3)))
        xd[b] = sround_f16(d)
        xi[b] = total
        xs[b] = sround_f16(d * np.float32(total))


@njit(cache=True, nogil=True, parallel=True)
def quantize_rows_neon(x, xq, xd, xi, xs):
    """x (n_tokens, cols) f32 -> xq (n_tokens, cols) i8, xd, xs (n_tokens, n_blocks) f32,
    xi (n_tokens, n_blocks) i32, as kernels/quantize.quantize_rows."""
    n = x.shape[0]
    if n < PARALLEL_ROWS:
        for i in range(n):
            _quantize_row(x[i], xq[i], xd[i], xi[i], xs[i])
    else:
        for i in prange(n):
            _quantize_row(x[i], xq[i], xd[i], xi[i], xs[i])


@njit(nogil=True)
def _swiglu_row(gu, n_ff, out):
    one = vsplat_f32(np.float32(1.0))
    for c in range(0, n_ff, 8):
        g = vload_f32(gu, c)
        silu = vdiv(g, vadd(one, vexp(vsub(vsplat_f32(np.float32(0.0)), g))))
        vstore_f32(out, c, vmul(silu, vload_f32(gu, n_ff + c)))


@njit(cache=True, nogil=True, parallel=True)
def swiglu_neon(gate_up, n_ff, out):
    """gate_up (n_tokens, 2 n_ff) = [gate | up] -> out (n_tokens, n_ff); n_ff % 8 == 0."""
    n = gate_up.shape[0]
    if n < PARALLEL_ROWS:
        for i in range(n):
            _swiglu_row(gate_up[i], n_ff, out[i])
    else:
        for i in prange(n):
            _swiglu_row(gate_up[i], n_ff, out[i])
