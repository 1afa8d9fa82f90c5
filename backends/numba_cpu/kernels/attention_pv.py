"""The two products of one key chunk (kernels/attention_simd.py) for the query rows of a tile
(its tokens x the query heads of one kv head), in register blocks of four query rows by two
vectors, so eight independent FMA chains hide the instruction's latency and every K or V load
feeds four rows:

    scores (rows, chunk) = Q K^T * scale      four rows x two position vectors
    acc    (rows, hd)    = P V                four rows x two vectors of dims

Each score is one FMA chain over the head dimensions in order, and each output lane adds its
products in position order from zero, so a row's result does not depend on which block of
four it fell in, on the other rows of the tile, or on positions where its probability is 0
(0 * v adds nothing) — a token computes the same bits alone or in a prefill tile.  A row or
vector index past the end repeats the last one: computed, stored first, then overwritten with
the same value.
"""

from __future__ import annotations

from numba import njit

from ..simd.vectors import lanes, vload_f16, vload_f32, vsplat_f32, vstore_f32, vzero_f32
from ..simd.vmath import vfma, vmul


@njit(nogil=True)
def qk_scores(isa, qh, k_pool, table, g, block_size, c0, v_lo, v_hi, scale, scores):
    """scores[r, v*lanes ...] = scale * q_r . K at the positions of score vectors v_lo..v_hi-1
    (vector v holds positions c0 + v*lanes ...; block_size is a multiple of lanes).
    qh (rows, hd) f32 holding f16 values; k_pool (n_blocks, n_kv, hd, block_size) f16 bits."""
    n = lanes(isa)
    rows, hd = qh.shape
    sc = vsplat_f32(isa, scale)
    for v in range(v_lo, v_hi, 2):
        v1 = min(v + 1, v_hi - 1)
        pa = c0 + v * n
        pb = c0 + v1 * n
        ka = k_pool[table[pa // block_size], g]  # (hd, block_size)
        kb = k_pool[table[pb // block_size], g]
        oa = pa % block_size
        ob = pb % block_size
        for r0 in range(0, rows, 4):
            r1 = min(r0 + 1, rows - 1)
            r2 = min(r0 + 2, rows - 1)
            r3 = min(r0 + 3, rows - 1)
            a0 = vzero_f32(isa)
            a1 = vzero_f32(isa)
            a2 = vzero_f32(isa)
            a3 = vzero_f32(isa)
            b0 = vzero_f32(isa)
            b1 = vzero_f32(isa)
            b2 = vzero_f32(isa)
            b3 = vzero_f32(isa)
            for j in range(hd):
                x = vload_f16(isa, ka[j], oa)
                y = vload_f16(isa, kb[j], ob)
                q = vsplat_f32(isa, qh[r0, j])
                a0 = vfma(q, x, a0)
                b0 = vfma(q, y, b0)
                q = vsplat_f32(isa, qh[r1, j])
                a1 = vfma(q, x, a1)
                b1 = vfma(q, y, b1)
                q = vsplat_f32(isa, qh[r2, j])
                a2 = vfma(q, x, a2)
                b2 = vfma(q, y, b2)
                q = vsplat_f32(isa, qh[r3, j])
                a3 = vfma(q, x, a3)
                b3 = vfma(q, y, b3)
            _store2(isa, scores[r3], v * n, v1 * n, vmul(a3, sc), vmul(b3, sc))
            _store2(isa, scores[r2], v * n, v1 * n, vmul(a2, sc), vmul(b2, sc))
            _store2(isa, scores[r1], v * n, v1 * n, vmul(a1, sc), vmul(b1, sc))
            _store2(isa, scores[r0], v * n, v1 * n, vmul(a0, sc), vmul(b0, sc))


@njit(nogil=True, inline="always")
def _store2(isa, row, ca, cb, a, b):
    """Two vectors of one row, the second first (a repeated index keeps the first's value)."""
    vstore_f32(row, cb, b)
    vstore_f32(row, ca, a)


@njit(nogil=True)
def pv(isa, probs, v_pool, table, g, b_lo, b_hi, block_size, c0, c1, acc):
    """acc (rows, hd) = sum over positions p of blocks b_lo..b_hi-1 of table, p < c1, of
    probs[r, p - c0] * V[p] (kv head g); v_pool (n_blocks, n_kv, block_size, hd) f16 bits.
    A row's positions outside its own keys must hold probability 0."""
    n = lanes(isa)
    rows, hd = acc.shape
    for r in range(rows):
        acc[r, :] = 0.0
    for b in range(b_lo, b_hi):
        vb = v_pool[table[b], g]  # (block_size, hd)
        n_here = min(block_size, c1 - b * block_size)
        p0 = b * block_size - c0
        for r0 in range(0, rows, 4):
            r1 = min(r0 + 1, rows - 1)
            r2 = min(r0 + 2, rows - 1)
            r3 = min(r0 + 3, rows - 1)
            for c in range(0, hd, 2 * n):
                d = min(c + n, hd - n)
                a0 = vload_f32(isa, acc[r0], c)
                a1 = vload_f32(isa, acc[r1], c)
                a2 = vload_f32(isa, acc[r2], c)
                a3 = vload_f32(isa, acc[r3], c)
                b0 = vload_f32(isa, acc[r0], d)
                b1 = vload_f32(isa, acc[r1], d)
                b2 = vload_f32(isa, acc[r2], d)
                b3 = vload_f32(isa, acc[r3], d)
                for p in range(n_here):
                    x = vload_f16(isa, vb[p], c)
                    y = vload_f16(isa, vb[p], d)
                    s = vsplat_f32(isa, probs[r0, p0 + p])
                    a0 = vfma(s, x, a0)
                    b0 = vfma(s, y, b0)
                    s = vsplat_f32(isa, probs[r1, p0 + p])
                    a1 = vfma(s, x, a1)
                    b1 = vfma(s, y, b1)
                    s = vsplat_f32(isa, probs[r2, p0 + p])
                    a2 = vfma(s, x, a2)
                    b2 = vfma(s, y, b2)
                    s = vsplat_f32(isa, probs[r3, p0 + p])
                    a3 = vfma(s, x, a3)
                    b3 = vfma(s, y, b3)
                _store2(isa, acc[r3], c, d, a3, b3)
                _store2(isa, acc[r2], c, d, a2, b2)
                _store2(isa, acc[r1], c, d, a1, b1)
                _store2(isa, acc[r0], c, d, a0, b0)
