"""out = x @ W.T over 16-row weight tiles (quants/tiles.py) with AVX-512 VNNI.

Per tile and block of 32 columns, vpdpbusd sums 4-bit (or 128-offset 8-bit) weight codes times
int8 activation codes into 16 int32 lanes, one per output row; then, per lane, exactly the
scalar formula of kernels/matmul.py:
    acc += d_w * (d_x * float(isum - zero * xsum)) + m_w * s_x
with the same operation order and no fast-math, so every output equals the generic path's bit
for bit, and a row's result does not depend on how many rows share the call.

Batched steps take activation rows four at a time: each 64-byte weight group is loaded and
unpacked once and used by four rows, two vpdpbusd chains per row (_isum4).  One prange over
tiles; a tile's weights (a few KB) stay in L1 while every group of rows passes over them, and
the first pass prefetches the next tile.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..quants.tiles import TILE_ROWS
from ..simd.avx512 import (
    vadd,
    vadd_i32,
    vbcast4,
    vcvt_f32,
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
from .f16 import f16_value


@njit(nogil=True)
def _accumulate(acc, isum, dw, mw, has_m, zero, xd, xi, xs):
    """acc + dw * (xd * float(isum - zero * xi)) + mw * xs, lane by lane."""
    f = vcvt_f32(vsub_i32(isum, vsplat_i32(zero * xi)))
    t = vmul(dw, vmul(vsplat_f32(xd), f))
    if has_m:
        t = vadd(t, vmul(mw, vsplat_f32(xs)))
    return vadd(acc, t)


@njit(nogil=True)
def _isum1(q4, w, wo, xq, xo):
    """One block, one activation row: (16,) int32 sums of weight codes x activation codes."""
    lo = vzero_i32()
    hi = vzero_i32()
    if q4:
        for k in range(4):
            g = vload_bytes(w, wo + 64 * k)
            lo = vdpbusd(lo, vnib_lo(g), vbcast4(xq, xo + 4 * k))
            hi = vdpbusd(hi, vnib_hi(g), vbcast4(xq, xo + 16 + 4 * k))
    else:
        for k in range(4):
            lo = vdpbusd(lo, vload_bytes(w, wo + 64 * k), vbcast4(xq, xo + 4 * k))
            hi = vdpbusd(hi, vload_bytes(w, wo + 256 + 64 * k), vbcast4(xq, xo + 16 + 4 * k))
    return vadd_i32(lo, hi)


@njit(nogil=True)
def _group(q4, w, wo, k):
    """Weight codes of group k (elements 4k..4k+3 of the 16 rows; k < 8) of one block."""
    if q4:
        g = vload_bytes(w, wo + 64 * (k % 4))
        return vnib_lo(g) if k < 4 else vnib_hi(g)
    return vload_bytes(w, wo + 64 * k)


@njit(nogil=True)
def _isum4(q4, w, wo, xq, xo, rs):
    """One block, four activation rows (rs elements apart): four (16,) int32 sums.

    Each row sums in two chains, even and odd groups, that meet at the end: eight independent
    vpdpbusd chains hide the instruction's latency where four left the kernel latency-bound
    (about 1.4x faster here; integer sums, so the result is the same in any order).  Splitting
    by nibble instead (one load feeding both chains) measured slower."""
    a0 = vzero_i32()
    a1 = vzero_i32()
    a2 = vzero_i32()
    a3 = vzero_i32()
    b0 = vzero_i32()
    b1 = vzero_i32()
    b2 = vzero_i32()
    b3 = vzero_i32()
    for kk in range(4):
        k = 2 * kk
        o = xo + 4 * k
        g = _group(q4, w, wo, k)
        a0 = vdpbusd(a0, g, vbcast4(xq, o))
        a1 = vdpbusd(a1, g, vbcast4(xq, o + rs))
        a2 = vdpbusd(a2, g, vbcast4(xq, o + 2 * rs))
        a3 = vdpbusd(a3, g, vbcast4(xq, o + 3 * rs))
        g = _group(q4, w, wo, k + 1)
        o += 4
        b0 = vdpbusd(b0, g, vbcast4(xq, o))
        b1 = vdpbusd(b1, g, vbcast4(xq, o + rs))
        b2 = vdpbusd(b2, g, vbcast4(xq, o + 2 * rs))
        b3 = vdpbusd(b3, g, vbcast4(xq, o + 3 * rs))
    return vadd_i32(a0, b0), vadd_i32(a1, b1), vadd_i32(a2, b2), vadd_i32(a3, b3)


@njit(nogil=True)
def _store(out, i, r0, rows, acc):
    if r0 + TILE_ROWS <= rows:
        vstore_f32(out[i], r0, acc)
    else:
        for lane in range(rows - r0):
            out[i, r0 + lane] = vlane(acc, lane)


@njit(nogil=True, inline="always")
def _prefetch_block(w, d, m, has_m, nxt, b):
    """Ask for block b of tile nxt (weights, scales, mins) ahead of its use."""
    nb, tb = w.shape[1], w.shape[2]
    for c in range(tb // 64):
        prefetch(w, (nxt * nb + b) * tb + 64 * c)
    prefetch(d, (nxt * nb + b) * TILE_ROWS)
    if has_m:
        prefetch(m, (nxt * nb + b) * TILE_ROWS)


@njit(nogil=True, inline="always")
def _rows4(q4, has_m, zero, w, d, m, xq, xd, xi, xs, out, t, i, pf, nxt):
    """Rows i..i+3 of out, tile t.  q4 and pf (prefetch tile nxt alongside): constants at each
    call site; has_m: m is not empty."""
    nb, tb = w.shape[1], w.shape[2]
    rs = xq.strides[0]  # int8: bytes == elements
    a0 = vzero_f32()
    a1 = vzero_f32()
    a2 = vzero_f32()
    a3 = vzero_f32()
    for b in range(nb):
        if pf:
            _prefetch_block(w, d, m, has_m, nxt, b)
        mo = (t * nb + b) * TILE_ROWS
        dw = vload_f16(d, mo)
        mw = vload_f16(m, mo) if has_m else dw
        s0, s1, s2, s3 = _isum4(q4, w, (t * nb + b) * tb, xq, i * rs + 32 * b, rs)
        a0 = _accumulate(a0, s0, dw, mw, has_m, zero, xd[i, b], xi[i, b], xs[i, b])
        a1 = _accumulate(a1, s1, dw, mw, has_m, zero, xd[i + 1, b], xi[i + 1, b], xs[i + 1, b])
        a2 = _accumulate(a2, s2, dw, mw, has_m, zero, xd[i + 2, b], xi[i + 2, b], xs[i + 2, b])
        a3 = _accumulate(a3, s3, dw, mw, has_m, zero, xd[i + 3, b], xi[i + 3, b], xs[i + 3, b])
    r0 = t * TILE_ROWS
    rows = out.shape[1]
    _store(out, i, r0, rows, a0)
    _store(out, i + 1, r0, rows, a1)
    _store(out, i + 2, r0, rows, a2)
    _store(out, i + 3, r0, rows, a3)


@njit(nogil=True, inline="always")
def _row1(q4, has_m, zero, w, d, m, xq, xd, xi, xs, out, t, i, pf, nxt):
    """Row i of out, tile t; the flags as in _rows4."""
    nb, tb = w.shape[1], w.shape[2]
    rs = xq.strides[0]
    acc = vzero_f32()
    for b in range(nb):
        if pf:
            _prefetch_block(w, d, m, has_m, nxt, b)
        mo = (t * nb + b) * TILE_ROWS
        dw = vload_f16(d, mo)
        mw = vload_f16(m, mo) if has_m else dw
        s = _isum1(q4, w, (t * nb + b) * tb, xq, i * rs + 32 * b)
        acc = _accumulate(acc, s, dw, mw, has_m, zero, xd[i, b], xi[i, b], xs[i, b])
    _store(out, i, t * TILE_ROWS, out.shape[1], acc)


@njit(nogil=True, inline="always")
def _tile(q4, has_m, zero, w, d, m, xq, xd, xi, xs, out, t):
    """Every row of out against tile t, four rows per pass; the first pass also prefetches the
    next tile (a thread's tiles are consecutive under prange's static split)."""
    n_tokens = out.shape[0]
    nxt = min(t + 1, w.shape[0] - 1)
    i = 0
    if n_tokens >= 4:
        _rows4(q4, has_m, zero, w, d, m, xq, xd, xi, xs, out, t, 0, True, nxt)
        i = 4
    elif n_tokens > 0:
        _row1(q4, has_m, zero, w, d, m, xq, xd, xi, xs, out, t, 0, True, nxt)
        i = 1
    while i + 4 <= n_tokens:
        _rows4(q4, has_m, zero, w, d, m, xq, xd, xi, xs, out, t, i, False, nxt)
        i += 4
    while i < n_tokens:
        _row1(q4, has_m, zero, w, d, m, xq, xd, xi, xs, out, t, i, False, nxt)
        i += 1


@njit(cache=True, nogil=True, parallel=True)
def matmul_tiles(q4, zero, w, d, m, xq, xd, xi, xs, out):
    """w (tiles, nb, 256 | 512) u8; d, m (tiles, nb, 16) f16 bits (m may be empty);
    xq (n_tokens, >= cols) i8 rows; xd, xs (n_tokens, nb) f32; xi (n_tokens, nb) i32
    -> out (n_tokens, rows) f32.  q4: 4-bit codes (else 128-offset bytes).

    One loop per code width, so q4 is a constant inside each and the unpacking branches leave
    the inner loop (about 20% faster here than testing it there; a loop per has_m too gained
    only 2-7% for 60% more compile time); prefetching the next tile made batched steps
    another 10-35% faster."""
    n_tiles = w.shape[0]
    has_m = m.size > 0
    if q4:
        for t in prange(n_tiles):
            _tile(True, has_m, zero, w, d, m, xq, xd, xi, xs, out, t)
    else:
        for t in prange(n_tiles):
            _tile(False, has_m, zero, w, d, m, xq, xd, xi, xs, out, t)


@njit(cache=True, nogil=True)
def embed_tiles(q4, zero, w, d, m, tokens, out):
    """Rows `tokens` of a tiled matrix, dequantized -> out (n_tokens, cols), with the same
    arithmetic as linear.embed_rows (so both paths embed bit for bit alike)."""
    nb = w.shape[1]
    for i in range(tokens.shape[0]):
        t, lane = divmod(tokens[i], TILE_ROWS)
        for b in range(nb):
            scale = f16_value(d[t, b, lane])
            bias = f16_value(m[t, b, lane]) if m.size else np.float32(0.0)
            for e in range(32):
                if q4:
                    byte = w[t, b, 64 * ((e % 16) // 4) + 4 * lane + e % 4]
                    c = (np.int64(byte & 15) if e < 16 else np.int64(byte >> 4)) - zero
                    out[i, b * 32 + e] = scale * c + bias
                else:
                    c = np.int64(w[t, b, 64 * (e // 4) + 4 * lane + e % 4]) - 128
                    out[i, b * 32 + e] = scale * np.float32(c) + bias
