"""Matmuls out = x @ W.T for a batch of activation rows over packed weights.

Layouts come from quants/packed.py.  Quantized weights meet int8 activations (quantize.py) in
integer dot products per block of 32, scaled once per block as ggml's vec_dot does:
    out[i, r] = sum_b  d_w[r,b] * (d_x[i,b] * (isum - zero * xsum[i,b]))  +  m_w[r,b] * s_x[i,b]
Integer block sums are exact and the float accumulation over blocks runs in one fixed order, each
block's two terms added by explicit fused multiply-adds (_block), so a row's result does not depend
on how many other rows share the call and equals the vector kernels' (matmul_tiles.py) bit for bit
(no fastmath here: contractions LLVM chose itself could differ between code paths).

Parallelism: one prange over tiles of TILE output rows; each tile's weights are read once and
used for every activation row (four at a time, so nibbles are unpacked once per four tokens).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..simd.vmath import sfma

TILE = 16


@njit(nogil=True, inline="always")
def _block(acc, dw, mw, xd, isum, xs):
    """acc + dw * (xd * isum) + mw * xs with two fused multiply-adds (llama.cpp's AVX2 and NEON
    dot products fuse the same way); isum is the block's integer sum as float32."""
    return sfma(mw, xs, sfma(dw, xd * isum, acc))


@njit(cache=True, nogil=True, parallel=True)
def matmul_q4(nib, d, m, zero, xq, xd, xi, xs, out):
    """nib (rows, n_blocks, 16) u8; d, m (rows, n_blocks); xq (n_tokens, cols) i8;
    xd, xs (n_tokens, n_blocks) f32; xi (n_tokens, n_blocks) i32 -> out (n_tokens, rows)."""
    rows, n_blocks = d.shape
    n_tokens = xq.shape[0]
    for t in prange((rows + TILE - 1) // TILE):
        r_end = min(rows, (t + 1) * TILE)
        i = 0
        while i + 4 <= n_tokens:
            for r in range(t * TILE, r_end):
                a0 = a1 = a2 = a3 = np.float32(0.0)
                for b in range(n_blocks):
                    s0 = s1 = s2 = s3 = 0
                    base = b * 32
                    for j in range(16):
                        w = nib[r, b, j]
                        lo = np.int32(w & 15)
                        hi = np.int32(w >> 4)
                        s0 += lo * xq[i, base + j] + hi * xq[i, base + 16 + j]
                        s1 += lo * xq[i + 1, base + j] + hi * xq[i + 1, base + 16 + j]
                        s2 += lo * xq[i + 2, base + j] + hi * xq[i + 2, base + 16 + j]
                        s3 += lo * xq[i + 3, base + j] + hi * xq[i + 3, base + 16 + j]
                    dw = d[r, b]
                    mw = m[r, b]
                    a0 = _block(a0, dw, mw, xd[i, b], np.float32(s0 - zero * xi[i, b]),
                                xs[i, b])
                    a1 = _block(a1, dw, mw, xd[i + 1, b],
                                np.float32(s1 - zero * xi[i + 1, b]), xs[i + 1, b])
                    a2 = _block(a2, dw, mw, xd[i + 2, b],
                                np.float32(s2 - zero * xi[i + 2, b]), xs[i + 2, b])
                    a3 = _block(a3, dw, mw, xd[i + 3, b],
                                np.float32(s3 - zero * xi[i + 3, b]), xs[i + 3, b])
                out[i, r] = a0
                out[i + 1, r] = a1
                out[i + 2, r] = a2
                out[i + 3, r] = a3
            i += 4
        while i < n_tokens:
            for r in range(t * TILE, r_end):
                a0 = np.float32(0.0)
                for b in range(n_blocks):
                    s0 = 0
                    base = b * 32
                    for j in range(16):
                        w = nib[r, b, j]
                        s0 += np.int32(w & 15) * xq[i, base + j] + np.int32(w >> 4) * xq[
                            i, base + 16 + j]
                    a0 = _block(a0, d[r, b], m[r, b], xd[i, b],
                                np.float32(s0 - zero * xi[i, b]), xs[i, b])
                out[i, r] = a0
            i += 1


@njit(cache=True, nogil=True, parallel=True)
def matmul_q8(q, d, m, xq, xd, xs, out):
    """q (rows, n_blocks, 32) i8; d, m (rows, n_blocks) -> out (n_tokens, rows)."""
    rows, n_blocks = d.shape
    n_tokens = xq.shape[0]
    for t in prange((rows + TILE - 1) // TILE):
        r_end = min(rows, (t + 1) * TILE)
        i = 0
        while i + 4 <= n_tokens:
            for r in range(t * TILE, r_end):
                a0 = a1 = a2 = a3 = np.float32(0.0)
                for b in range(n_blocks):
                    s0 = s1 = s2 = s3 = 0
                    base = b * 32
                    for j in range(32):
                        w = np.int32(q[r, b, j])
                        s0 += w * xq[i, base + j]
                        s1 += w * xq[i + 1, base + j]
                        s2 += w * xq[i + 2, base + j]
                        s3 += w * xq[i + 3, base + j]
                    dw = d[r, b]
                    mw = m[r, b]
                    a0 = _block(a0, dw, mw, xd[i, b], np.float32(s0), xs[i, b])
                    a1 = _block(a1, dw, mw, xd[i + 1, b], np.float32(s1), xs[i + 1, b])
                    a2 = _block(a2, dw, mw, xd[i + 2, b], np.float32(s2), xs[i + 2, b])
                    a3 = _block(a3, dw, mw, xd[i + 3, b], np.float32(s3), xs[i + 3, b])
                out[i, r] = a0
                out[i + 1, r] = a1
                out[i + 2, r] = a2
                out[i + 3, r] = a3
            i += 4
        while i < n_tokens:
            for r in range(t * TILE, r_end):
                a0 = np.float32(0.0)
                for b in range(n_blocks):
                    s0 = 0
                    base = b * 32
                    for j in range(32):
                        s0 += np.int32(q[r, b, j]) * xq[i, base + j]
                    a0 = _block(a0, d[r, b], m[r, b], xd[i, b], np.float32(s0), xs[i, b])
                out[i, r] = a0
            i += 1


@njit(cache=True, nogil=True, parallel=True)
def matmul_f32(w, x, out):
    """w (rows, cols) f32; x (n_tokens, cols) f32 -> out (n_tokens, rows); sequential sums."""
    rows, cols = w.shape
    n_tokens = x.shape[0]
    for t in prange((rows + TILE - 1) // TILE):
        for r in range(t * TILE, min(rows, (t + 1) * TILE)):
            for i in range(n_tokens):
                acc = np.float32(0.0)
                for c in range(cols):
                    acc += w[r, c] * x[i, c]
                out[i, r] = acc
