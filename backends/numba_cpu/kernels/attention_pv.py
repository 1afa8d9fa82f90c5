"""The P V product of one key chunk (kernels/attention_simd.py): acc (group, head_dim) =
probabilities (group, chunk) @ the chunk's V rows, for the query heads of one kv head.

Each lane adds its products in position order from zero whichever variant runs, so both give
the same bits; they differ in how many accumulators stay in registers, which is chosen for the
width while typing (only that variant compiles):
- 16 lanes (32 zmm registers): four heads x four vectors of dims in 16 registers while the
  chunk's V rows stream past;
- 8 lanes (16 ymm registers): four heads x one vector, through memory once per block (sixteen
  accumulators would spill).
"""

from __future__ import annotations

from numba import njit
from numba.extending import overload

from ..simd.vectors import lanes, vload_f16, vload_f32, vsplat_f32, vstore_f32, vzero_f32, width
from ..simd.vmath import vadd, vmul


def pv(isa, scores, v_pool, table, g, b_lo, b_hi, block_size, c0, c1, acc):
    """acc (group, head_dim) = sum over positions p of the chunk starting at c0 (blocks b_lo..
    b_hi of table, keys before c1) of scores[h, p - c0] * V[p] (kv head g).  Positions before
    the first visible key have probability 0 and are read anyway (whole blocks)."""


@overload(pv, jit_options={"nogil": True})
def _pv_for_width(isa, scores, v_pool, table, g, b_lo, b_hi, block_size, c0, c1, acc):
    return _pv_in_registers if width(isa) == 16 else _pv_per_block


def _pv_in_registers(isa, scores, v_pool, table, g, b_lo, b_hi, block_size, c0, c1, acc):
    # a head or slice index past the end repeats the last one: computed, stored first,
    # overwritten
    group, head_dim = acc.shape
    n = lanes(isa)
    for h0 in range(0, group, 4):
        h1 = min(h0 + 1, group - 1)
        h2 = min(h0 + 2, group - 1)
        h3 = min(h0 + 3, group - 1)
        for d0 in range(0, head_dim, 4 * n):
            d1 = min(d0 + n, head_dim - n)
            d2 = min(d0 + 2 * n, head_dim - n)
            d3 = min(d0 + 3 * n, head_dim - n)
            a00 = vzero_f32(isa)
            a01 = vzero_f32(isa)
            a02 = vzero_f32(isa)
            a03 = vzero_f32(isa)
            a10 = vzero_f32(isa)
            a11 = vzero_f32(isa)
            a12 = vzero_f32(isa)
            a13 = vzero_f32(isa)
            a20 = vzero_f32(isa)
            a21 = vzero_f32(isa)
            a22 = vzero_f32(isa)
            a23 = vzero_f32(isa)
            a30 = vzero_f32(isa)
            a31 = vzero_f32(isa)
            a32 = vzero_f32(isa)
            a33 = vzero_f32(isa)
            for b in range(b_lo, b_hi):
                vb = v_pool[table[b], g]  # (block_size, head_dim)
                p0 = b * block_size - c0
                for p in range(min(block_size, c1 - b * block_size)):
                    v0 = vload_f16(isa, vb[p], d0)
                    v1 = vload_f16(isa, vb[p], d1)
                    v2 = vload_f16(isa, vb[p], d2)
                    v3 = vload_f16(isa, vb[p], d3)
                    a00, a01, a02, a03 = _axpy4(isa, scores[h0, p0 + p], v0, v1, v2, v3,
                                                a00, a01, a02, a03)
                    a10, a11, a12, a13 = _axpy4(isa, scores[h1, p0 + p], v0, v1, v2, v3,
                                                a10, a11, a12, a13)
                    a20, a21, a22, a23 = _axpy4(isa, scores[h2, p0 + p], v0, v1, v2, v3,
                                                a20, a21, a22, a23)
                    a30, a31, a32, a33 = _axpy4(isa, scores[h3, p0 + p], v0, v1, v2, v3,
                                                a30, a31, a32, a33)
            _store4(acc[h3], d0, d1, d2, d3, a30, a31, a32, a33)
            _store4(acc[h2], d0, d1, d2, d3, a20, a21, a22, a23)
            _store4(acc[h1], d0, d1, d2, d3, a10, a11, a12, a13)
            _store4(acc[h0], d0, d1, d2, d3, a00, a01, a02, a03)


@njit(nogil=True, inline="always")
def _axpy4(isa, p, v0, v1, v2, v3, a0, a1, a2, a3):
    """a_k + p * v_k for four slices of one head (p: its probability at this position)."""
    s = vsplat_f32(isa, p)
    return (vadd(a0, vmul(s, v0)), vadd(a1, vmul(s, v1)), vadd(a2, vmul(s, v2)),
            vadd(a3, vmul(s, v3)))


@njit(nogil=True)
def _store4(row, d0, d1, d2, d3, a0, a1, a2, a3):
    """Four slices of one head's output, the last first (a repeated slice keeps the value of
    its first index)."""
    vstore_f32(row, d3, a3)
    vstore_f32(row, d2, a2)
    vstore_f32(row, d1, a1)
    vstore_f32(row, d0, a0)


def _pv_per_block(isa, scores, v_pool, table, g, b_lo, b_hi, block_size, c0, c1, acc):
    # four heads per V load; a head index past the group repeats the last head (stored
    # first, overwritten)
    group, head_dim = acc.shape
    n = lanes(isa)
    acc[:] = 0.0
    for b in range(b_lo, b_hi):
        vb = v_pool[table[b], g]  # (block_size, head_dim)
        n_here = min(block_size, c1 - b * block_size)
        p0 = b * block_size - c0
        for h0 in range(0, group, 4):
            h1 = min(h0 + 1, group - 1)
            h2 = min(h0 + 2, group - 1)
            h3 = min(h0 + 3, group - 1)
            for c in range(0, head_dim, n):
                a0 = vload_f32(isa, acc[h0], c)
                a1 = vload_f32(isa, acc[h1], c)
                a2 = vload_f32(isa, acc[h2], c)
                a3 = vload_f32(isa, acc[h3], c)
                for p in range(n_here):
                    vv = vload_f16(isa, vb[p], c)
                    a0 = vadd(a0, vmul(vsplat_f32(isa, scores[h0, p0 + p]), vv))
                    a1 = vadd(a1, vmul(vsplat_f32(isa, scores[h1, p0 + p]), vv))
                    a2 = vadd(a2, vmul(vsplat_f32(isa, scores[h2, p0 + p]), vv))
                    a3 = vadd(a3, vmul(vsplat_f32(isa, scores[h3, p0 + p]), vv))
                vstore_f32(acc[h3], c, a3)
                vstore_f32(acc[h2], c, a2)
                vstore_f32(acc[h1], c, a1)
                vstore_f32(acc[h0], c, a0)
