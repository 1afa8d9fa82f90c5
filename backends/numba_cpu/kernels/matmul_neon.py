"""out = x @ W.T over the 16-row weight tiles (quants/tiles.py) with NEON: the AArch64
counterpart of kernels/matmul_avx2.py, reading each tile as two halves of 8 rows (bytes 0..31
and 32..63 of every 64-byte group; scales d[t, b, 0:8] and d[t, b, 8:16]), each half held in
pairs of 128-bit registers (simd/neon.py).

Per half tile and block of 32 columns, SDOT sums weight codes times int8 activation codes into
8 int32 lanes, one per output row; then, per lane, exactly the scalar formula of
kernels/matmul.py:
    acc += d_w * (d_x * float(isum - zero * xsum)) + m_w * s_x
so every output equals the generic path's bit for bit.

Batched steps take activation rows four at a time per weight load (4 int + 4 float
accumulators = 16 of the 32 q registers); the first pass over a half tile prefetches the next
tile.  One prange over half tiles.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..quants.tiles import TILE_ROWS
from ..simd.neon import (
    q8_offset,
    vadd,
    vadd_i32,
    vbcast4,
    vcvt_f32,
    vdot_q8,
    vdpbusd,
    vlane,
    vload_bytes,
    vload_f16,
    vmul,
    vnib_hi,
    vnib_lo,
    vsplat_f32,
    vsplat_i32,
    vstore_f32,
    vsub_i32,
    vzero_f32,
    vzero_i32,
)
from ..simd.prefetch import prefetch

HALF = TILE_ROWS // 2  # rows per F32x8 (two q registers)


@njit(nogil=True)
def _accumulate(acc, isum, dw, mw, has_m, zero, xd, xi, xs):
    """acc + dw * (xd * float(isum - zero * xi)) + mw * xs, lane by lane."""
    f = vcvt_f32(vsub_i32(isum, vsplat_i32(zero * xi)))
    t = vmul(dw, vmul(vsplat_f32(xd), f))
    if has_m:
        t = vadd(t, vmul(mw, vsplat_f32(xs)))
    return vadd(acc, t)


@njit(nogil=True)
def _group(isa, q4, w, wo, k):
    """Weight codes of group k (elements 4k..4k+3 of 8 rows; k < 8) of a half tile."""
    if q4:
        g = vload_bytes(w, wo + 64 * (k % 4))
        return vnib_lo(g) if k < 4 else vnib_hi(g)
    return vload_bytes(w, wo + 64 * k)


@njit(nogil=True)
def _dot(isa, q4, acc, g, x):
    return vdpbusd(isa, acc, g, x) if q4 else vdot_q8(isa, acc, g, x)


@njit(nogil=True)
def _isum1(isa, q4, w, wo, xq, xo):
    """One block, one activation row: (8,) int32 sums (two chains for latency)."""
    lo = vzero_i32()
    hi = vzero_i32()
    for k in range(4):
        lo = _dot(isa, q4, lo, _group(isa, q4, w, wo, k), vbcast4(xq, xo + 4 * k))
        hi = _dot(isa, q4, hi, _group(isa, q4, w, wo, k + 4), vbcast4(xq, xo + 16 + 4 * k))
    return vadd_i32(lo, hi)


@njit(nogil=True)
def _isum4(isa, q4, w, wo, xq, xo, rs):
    """One block, four activation rows (rs elements apart): four (8,) int32 sums.  One chain
    per row (16 of the 32 q registers)."""
    s0 = vzero_i32()
    s1 = vzero_i32()
    s2 = vzero_i32()
    s3 = vzero_i32()
    for k in range(8):
        g = _group(isa, q4, w, wo, k)
        o = xo + 4 * k
        s0 = _dot(isa, q4, s0, g, vbcast4(xq, o))
        s1 = _dot(isa, q4, s1, g, vbcast4(xq, o + rs))
        s2 = _dot(isa, q4, s2, g, vbcast4(xq, o + 2 * rs))
        s3 = _dot(isa, q4, s3, g, vbcast4(xq, o + 3 * rs))
    return s0, s1, s2, s3


@njit(nogil=True)
def _store(out, i, r0, rows, acc):
    if r0 + HALF <= rows:
        vstore_f32(out[i], r0, acc)
    else:
        for lane in range(rows - r0):
            out[i, r0 + lane] = vlane(acc, lane)


@njit(nogil=True, inline="always")
def _prefetch_block(w, d, m, has_m, nxt, b):
    """Ask for block b of tile nxt (both halves: they share cache lines) ahead of its use."""
    nb, tb = w.shape[1], w.shape[2]
    for c in range(tb // 64):
        prefetch(w, (nxt * nb + b) * tb + 64 * c)
    prefetch(d, (nxt * nb + b) * TILE_ROWS)
    if has_m:
        prefetch(m, (nxt * nb + b) * TILE_ROWS)


@njit(nogil=True, inline="always")
def _rows4(isa, q4, has_m, zo, w, d, m, xq, xd, xi, xs, out, t, h, i, pf, nxt):
    """Rows i..i+3 of out, half h of tile t.  q4 and pf (prefetch tile nxt alongside):
    constants at each call site; has_m: m is not empty."""
    nb, tb = w.shape[1], w.shape[2]
    rs = xq.strides[0]  # int8: bytes == elements
    a0 = vzero_f32()
    a1 = vzero_f32()
    a2 = vzero_f32()
    a3 = vzero_f32()
    for b in range(nb):
        if pf:
            _prefetch_block(w, d, m, has_m, nxt, b)
        mo = (t * nb + b) * TILE_ROWS + h * HALF
        dw = vload_f16(d, mo)
        mw = vload_f16(m, mo) if has_m else dw
        s0, s1, s2, s3 = _isum4(isa, q4, w, (t * nb + b) * tb + h * 32, xq, i * rs + 32 * b,
                                rs)
        a0 = _accumulate(a0, s0, dw, mw, has_m, zo, xd[i, b], xi[i, b], xs[i, b])
        a1 = _accumulate(a1, s1, dw, mw, has_m, zo, xd[i + 1, b], xi[i + 1, b], xs[i + 1, b])
        a2 = _accumulate(a2, s2, dw, mw, has_m, zo, xd[i + 2, b], xi[i + 2, b], xs[i + 2, b])
        a3 = _accumulate(a3, s3, dw, mw, has_m, zo, xd[i + 3, b], xi[i + 3, b], xs[i + 3, b])
    r0 = t * TILE_ROWS + h * HALF
    rows = out.shape[1]
    _store(out, i, r0, rows, a0)
    _store(out, i + 1, r0, rows, a1)
    _store(out, i + 2, r0, rows, a2)
    _store(out, i + 3, r0, rows, a3)


@njit(nogil=True, inline="always")
def _row1(isa, q4, has_m, zo, w, d, m, xq, xd, xi, xs, out, t, h, i, pf, nxt):
    """Row i of out, half h of tile t; the flags as in _rows4."""
    nb, tb = w.shape[1], w.shape[2]
    rs = xq.strides[0]
    acc = vzero_f32()
    for b in range(nb):
        if pf:
            _prefetch_block(w, d, m, has_m, nxt, b)
        mo = (t * nb + b) * TILE_ROWS + h * HALF
        dw = vload_f16(d, mo)
        mw = vload_f16(m, mo) if has_m else dw
        s = _isum1(isa, q4, w, (t * nb + b) * tb + h * 32, xq, i * rs + 32 * b)
        acc = _accumulate(acc, s, dw, mw, has_m, zo, xd[i, b], xi[i, b], xs[i, b])
    _store(out, i, t * TILE_ROWS + h * HALF, out.shape[1], acc)


@njit(nogil=True, inline="always")
def _half_tile(isa, q4, has_m, zo, w, d, m, xq, xd, xi, xs, out, u):
    """Every row of out against half tile u (tile u // 2, half u % 2), four rows per pass; the
    first pass also prefetches the next tile."""
    n_tokens, rows = out.shape
    t = np.int64(u) // 2
    h = np.int64(u) % 2
    if t * TILE_ROWS + h * HALF >= rows:
        return
    nxt = min(t + 1, w.shape[0] - 1)
    i = 0
    if n_tokens >= 4:
        _rows4(isa, q4, has_m, zo, w, d, m, xq, xd, xi, xs, out, t, h, 0, True, nxt)
        i = 4
    elif n_tokens > 0:
        _row1(isa, q4, has_m, zo, w, d, m, xq, xd, xi, xs, out, t, h, 0, True, nxt)
        i = 1
    while i + 4 <= n_tokens:
        _rows4(isa, q4, has_m, zo, w, d, m, xq, xd, xi, xs, out, t, h, i, False, nxt)
        i += 4
    while i < n_tokens:
        _row1(isa, q4, has_m, zo, w, d, m, xq, xd, xi, xs, out, t, h, i, False, nxt)
        i += 1


@njit(cache=True, nogil=True, parallel=True)
def matmul_tiles_neon(isa, q4, zero, w, d, m, xq, xd, xi, xs, out):
    """As matmul_avx2.matmul_tiles_avx2, with SDOT; isa: IsaType neon."""
    n_half = w.shape[0] * 2
    zo = zero if q4 else q8_offset(isa)  # 8-bit weights: vdot_q8 leaves no offset
    has_m = m.size > 0
    if q4:
        for u in prange(n_half):
            _half_tile(isa, True, has_m, zo, w, d, m, xq, xd, xi, xs, out, u)
    else:
        for u in prange(n_half):
            _half_tile(isa, False, has_m, zo, w, d, m, xq, xd, xi, xs, out, u)
