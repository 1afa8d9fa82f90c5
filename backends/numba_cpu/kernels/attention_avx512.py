"""Causal grouped-query attention over the paged f16 KV pool with 512-bit vectors.

Pool layout of one layer on this path (block_size and head_dim multiples of 16):
    K: (n_blocks, n_kv_heads, head_dim, block_size)  transposed: one f16 vector = one head
       dimension at 16 consecutive positions, so 16 scores build up with no horizontal sums
    V: (n_blocks, n_kv_heads, block_size, head_dim)  a position's values, 16 dims per vector
Numerics follow kernels/attention.py (and llama.cpp): Q and the probabilities are rounded to
f16 before they meet f16 K and V.  One work item per (token, kv head); the query heads of the
GQA group reuse each K/V block while it is in L1.  Each item's arithmetic depends only on its
own token and context, never on the rest of the batch.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..simd.avx512 import (
    vadd,
    vhmax,
    vhsum,
    vload_f16,
    vload_f32,
    vmax,
    vmul,
    vround_f16,
    vsplat_f32,
    vstore_f16,
    vstore_f32,
    vsub,
    vzero_f32,
)
from ..simd.vexp import vexp

V = 16  # lanes


@njit(cache=True, nogil=True)
def write_kv_avx512(qkv, n_heads, n_kv, head_dim, slot_mapping, block_size, k_pool, v_pool):
    """K and V columns of qkv (n_tokens, q|k|v) -> their slots, rounded to f16."""
    k_col = n_heads * head_dim
    v_col = k_col + n_kv * head_dim
    bits = np.empty(head_dim, np.uint16)
    for i in range(qkv.shape[0]):
        blk, off = divmod(slot_mapping[i], block_size)
        row = qkv[i]
        for h in range(n_kv):
            for c in range(0, head_dim, V):
                vstore_f16(v_pool[blk, h, off], c, vload_f32(row, v_col + h * head_dim + c))
                vstore_f16(bits, c, vload_f32(row, k_col + h * head_dim + c))
            for j in range(head_dim):
                k_pool[blk, h, j, off] = bits[j]


@njit(cache=True, nogil=True, parallel=True)
def attention_avx512(qkv, n_heads, n_kv, head_dim, positions, token_seq, block_tables,
                     block_size, k_pool, v_pool, scale, scratch, out):
    """qkv (n_tokens, (n_heads + 2 n_kv) head_dim), RoPE applied -> out (n_tokens,
    n_heads head_dim).  scratch (threads, group, 2 head_dim + max_ctx): per-thread memory
    (allocating inside a parallel loop costs about a millisecond per call)."""
    n_tokens = qkv.shape[0]
    n_threads = scratch.shape[0]
    n_items = n_tokens * n_kv
    per = (n_items + n_threads - 1) // n_threads
    for part in prange(n_threads):  # static split: part p owns scratch p
        for item in range(part * per, min(n_items, (part + 1) * per)):
            _attend_item(item, qkv, n_heads, n_kv, head_dim, positions, token_seq,
                         block_tables, block_size, k_pool, v_pool, scale, out,
                         scratch[part, :, :head_dim],  # Q rounded to f16
                         scratch[part, :, 2 * head_dim:],  # scores, then probabilities
                         scratch[part, :, head_dim:2 * head_dim])  # output accumulator


@njit(nogil=True)
def _attend_item(item, qkv, n_heads, n_kv, head_dim, positions, token_seq, block_tables,
                 block_size, k_pool, v_pool, scale, out, qh, scores, acc):
    """Token item // n_kv, kv head item % n_kv; qh, scores, acc: this thread's scratch."""
    group = n_heads // n_kv
    i = item // n_kv
    g = item % n_kv
    n_ctx = positions[i] + 1
    n_blk = (n_ctx + block_size - 1) // block_size
    table = block_tables[token_seq[i]]
    q0 = g * group * head_dim
    acc[:] = 0.0
    for h in range(group):
        for c in range(0, head_dim, V):
            vstore_f32(qh[h], c, vround_f16(vload_f32(qkv[i], q0 + h * head_dim + c)))
    # scores (group, n_ctx) = Q K^T * scale, 16 positions per vector; heads go four at a time
    # through one K load each (a head index past the group repeats the last head: computed,
    # never stored), which also gives four independent add chains
    for b in range(n_blk):
        kb = k_pool[table[b], g]  # (head_dim, block_size)
        for c in range(0, min(block_size, n_ctx - b * block_size), V):
            for h0 in range(0, group, 4):
                h1 = min(h0 + 1, group - 1)
                h2 = min(h0 + 2, group - 1)
                h3 = min(h0 + 3, group - 1)
                s0 = vzero_f32()
                s1 = vzero_f32()
                s2 = vzero_f32()
                s3 = vzero_f32()
                for j in range(head_dim):
                    k = vload_f16(kb[j], c)
                    s0 = vadd(s0, vmul(vsplat_f32(qh[h0, j]), k))
                    s1 = vadd(s1, vmul(vsplat_f32(qh[h1, j]), k))
                    s2 = vadd(s2, vmul(vsplat_f32(qh[h2, j]), k))
                    s3 = vadd(s3, vmul(vsplat_f32(qh[h3, j]), k))
                o = b * block_size + c
                vstore_f32(scores[h3], o, vmul(s3, vsplat_f32(scale)))
                vstore_f32(scores[h2], o, vmul(s2, vsplat_f32(scale)))
                vstore_f32(scores[h1], o, vmul(s1, vsplat_f32(scale)))
                vstore_f32(scores[h0], o, vmul(s0, vsplat_f32(scale)))
    n_vec = (n_ctx + V - 1) // V
    for h in range(group):
        sh = scores[h]
        for p in range(n_ctx, n_vec * V):
            sh[p] = -np.inf  # lanes past the context: exp gives ~1e-38, which vanishes
            # in the sum and rounds to 0 in f16 (and V rows past n_ctx are never read)
        mx = vload_f32(sh, 0)
        for c in range(1, n_vec):
            mx = vmax(mx, vload_f32(sh, c * V))
        m = vsplat_f32(vhmax(mx))
        total = vzero_f32()
        for c in range(n_vec):
            e = vexp(vsub(vload_f32(sh, c * V), m))
            vstore_f32(sh, c * V, e)
            total = vadd(total, e)
        inv = vsplat_f32(np.float32(1.0) / vhsum(total))
        for c in range(n_vec):
            vstore_f32(sh, c * V, vround_f16(vmul(vload_f32(sh, c * V), inv)))
    # out (group, head_dim) = P V, again four heads per V load
    for b in range(n_blk):
        vb = v_pool[table[b], g]  # (block_size, head_dim)
        n_here = min(block_size, n_ctx - b * block_size)
        p0 = b * block_size
        for h0 in range(0, group, 4):
            h1 = min(h0 + 1, group - 1)
            h2 = min(h0 + 2, group - 1)
            h3 = min(h0 + 3, group - 1)
            for c in range(0, head_dim, V):
                a0 = vload_f32(acc[h0], c)
                a1 = vload_f32(acc[h1], c)
                a2 = vload_f32(acc[h2], c)
                a3 = vload_f32(acc[h3], c)
                for p in range(n_here):
                    v = vload_f16(vb[p], c)
                    a0 = vadd(a0, vmul(vsplat_f32(scores[h0, p0 + p]), v))
                    a1 = vadd(a1, vmul(vsplat_f32(scores[h1, p0 + p]), v))
                    a2 = vadd(a2, vmul(vsplat_f32(scores[h2, p0 + p]), v))
                    a3 = vadd(a3, vmul(vsplat_f32(scores[h3, p0 + p]), v))
                vstore_f32(acc[h3], c, a3)
                vstore_f32(acc[h2], c, a2)
                vstore_f32(acc[h1], c, a1)
                vstore_f32(acc[h0], c, a0)
    for h in range(group):
        for c in range(0, head_dim, V):
            vstore_f32(out[i], q0 + h * head_dim + c, vload_f32(acc[h], c))
