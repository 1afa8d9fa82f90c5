"""Causal grouped-query attention over the paged f16 KV pool in vectors of the IsaType's width
(16 lanes on avx512, 8 on avx2 and neon), one source for every vector path.

Pool layout of one layer on these paths (block_size and head_dim multiples of 16):
    K: (n_blocks, n_kv_heads, head_dim, block_size)  transposed: one f16 vector = one head
       dimension at `lanes` consecutive positions, so the scores build up with no horizontal
       sums
    V: (n_blocks, n_kv_heads, block_size, head_dim)  a position's values, `lanes` dims per
       vector
Numerics follow kernels/attention.py (and llama.cpp): Q and the probabilities are rounded to
f16 before they meet f16 K and V.  A width's sums group as its vectors do (the softmax total
is a sum over lanes), so the paths agree to rounding, not bit for bit.  Work items are (token,
kv head); the query heads of the GQA group reuse each K/V block while it is in L1.  Keys go in
chunks (kernels/attention_split.py): with many items each thread takes whole items; with few
items and long contexts (single-stream decode: SmolLM2 has 3 kv heads for 2 threads) the
threads share the chunks of each item (flash-decoding) and one merge follows.  Either way an
item's result depends only on its own token and context, never on the rest of the batch.
The P V product is kernels/attention_pv.py.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..simd.vectors import (
    lanes,
    vload_f16,
    vload_f32,
    vsplat_f32,
    vstore_f16,
    vstore_f32,
    vzero_f32,
)
from ..simd.vexp import vexp
from ..simd.vmath import vadd, vhmax, vhsum, vmax, vmul, vround_f16, vsub
from .attention_pv import pv
from .attention_split import SPLIT_ITEMS, chunk_span, merge, plan_chunks, slot


@njit(cache=True, nogil=True)
def write_kv_simd(isa, qkv, n_heads, n_kv, head_dim, slot_mapping, block_size, k_pool, v_pool):
    """K and V columns of qkv (n_tokens, q|k|v) -> their slots, rounded to f16."""
    n_lanes = lanes(isa)
    k_col = n_heads * head_dim
    v_col = k_col + n_kv * head_dim
    bits = np.empty(head_dim, np.uint16)
    for i in range(qkv.shape[0]):
        blk, off = divmod(slot_mapping[i], block_size)
        row = qkv[i]
        for h in range(n_kv):
            for c in range(0, head_dim, n_lanes):
                vstore_f16(v_pool[blk, h, off], c, vload_f32(isa, row, v_col + h * head_dim + c))
                vstore_f16(bits, c, vload_f32(isa, row, k_col + h * head_dim + c))
            for j in range(head_dim):
                k_pool[blk, h, j, off] = bits[j]


@njit(cache=True, nogil=True, parallel=True)
def attention_simd(isa, qkv, n_heads, n_kv, head_dim, positions, token_seq, block_tables,
                   block_size, k_pool, v_pool, scale, scratch, out, window=0):
    """qkv (n_tokens, (n_heads + 2 n_kv) head_dim), RoPE applied -> out (n_tokens,
    n_heads head_dim).  scratch (threads, group, width >= 3 head_dim + 4 + block_size):
    per-thread memory laid out as attention_split.py says (allocating inside a parallel loop
    costs about a millisecond per call).
    window > 0: sliding-window attention, a token at p sees keys p - window + 1 .. p only;
    blocks wholly before them are never read (a sliding pool may have released them)."""
    n_tokens = qkv.shape[0]
    n_threads = scratch.shape[0]
    n_items = n_tokens * n_kv
    chunk, tail, per_thread = plan_chunks(scratch.shape[2], head_dim, block_size, n_threads)
    hd = head_dim
    if n_items < SPLIT_ITEMS * n_threads:
        # -- few items: count their chunks; split them over threads if slots hold them all
        starts = np.empty(n_items + 1, np.int64)
        units = 0
        for item in range(n_items):
            starts[item] = units
            k0, k1 = chunk_span(positions[item // n_kv], window, chunk)
            units += k1 - k0 + 1
        starts[n_items] = units
        if n_items < units <= per_thread * n_threads:
            per = (units + n_threads - 1) // n_threads
            for part in prange(n_threads):
                item = 0
                for u in range(part * per, min(units, (part + 1) * per)):
                    while starts[item + 1] <= u:
                        item += 1
                    i, g = item // n_kv, item % n_kv
                    k0, _ = chunk_span(positions[i], window, chunk)
                    qh = scratch[part, :, :hd]
                    _round_q(isa, qkv[i], g * (n_heads // n_kv) * hd, hd, qh)
                    _chunk(isa, i, g, k0 + u - starts[item], chunk, n_heads, n_kv, hd, positions,
                           token_seq, block_tables, block_size, k_pool, v_pool, scale, window,
                           qh, scratch[part, :, 2 * hd + 2:2 * hd + 2 + chunk],
                           slot(scratch, u, tail, hd, per_thread))
            for item in range(n_items):  # merge in chunk order, on this thread
                state = slot(scratch, starts[item], tail, hd, per_thread)
                for u in range(starts[item] + 1, starts[item + 1]):
                    merge(state, slot(scratch, u, tail, hd, per_thread), hd)
                _emit(isa, out, item // n_kv, (item % n_kv) * (n_heads // n_kv) * hd, hd, state)
            return
    per = (n_items + n_threads - 1) // n_threads
    for part in prange(n_threads):  # static split: part p owns scratch p
        for item in range(part * per, min(n_items, (part + 1) * per)):
            _attend_item(isa, item, chunk, qkv, n_heads, n_kv, hd, positions, token_seq,
                         block_tables, block_size, k_pool, v_pool, scale, window, out,
                         scratch[part, :, :hd],  # Q rounded to f16
                         scratch[part, :, hd:2 * hd + 2],  # one chunk's (o, m, l)
                         scratch[part, :, 2 * hd + 2:2 * hd + 2 + chunk],  # scores
                         scratch[part, :, tail - hd - 2:tail])  # merged (o, m, l)


@njit(nogil=True)
def _round_q(isa, row, q0, head_dim, qh):
    """The group's query heads (columns q0.. of a qkv row), rounded to f16 -> qh."""
    n_lanes = lanes(isa)
    for h in range(qh.shape[0]):
        for c in range(0, head_dim, n_lanes):
            vstore_f32(qh[h], c, vround_f16(vload_f32(isa, row, q0 + h * head_dim + c)))


@njit(nogil=True)
def _emit(isa, out, i, q0, head_dim, state):
    n_lanes = lanes(isa)
    for h in range(state.shape[0]):
        for c in range(0, head_dim, n_lanes):
            vstore_f32(out[i], q0 + h * head_dim + c, vload_f32(isa, state[h], c))


@njit(nogil=True)
def _attend_item(isa, item, chunk, qkv, n_heads, n_kv, head_dim, positions, token_seq,
                 block_tables, block_size, k_pool, v_pool, scale, window, out, qh, part,
                 scores, state):
    """Token item // n_kv, kv head item % n_kv, all its chunks on this thread."""
    i = item // n_kv
    g = item % n_kv
    q0 = g * (n_heads // n_kv) * head_dim
    _round_q(isa, qkv[i], q0, head_dim, qh)
    k0, k1 = chunk_span(positions[i], window, chunk)
    _chunk(isa, i, g, k0, chunk, n_heads, n_kv, head_dim, positions, token_seq, block_tables,
           block_size, k_pool, v_pool, scale, window, qh, scores, state)
    for k in range(k0 + 1, k1 + 1):
        _chunk(isa, i, g, k, chunk, n_heads, n_kv, head_dim, positions, token_seq, block_tables,
               block_size, k_pool, v_pool, scale, window, qh, scores, part)
        merge(state, part, head_dim)
    _emit(isa, out, i, q0, head_dim, state)


@njit(nogil=True)
def _chunk(isa, i, g, k, chunk, n_heads, n_kv, head_dim, positions, token_seq, block_tables,
           block_size, k_pool, v_pool, scale, window, qh, scores, res):
    """Token i, kv head g, its visible keys in chunk k -> res (group, head_dim + 2):
    (o, m, l) per query head (attention_split.py).  qh: the group's Q rounded to f16;
    scores (group, >= chunk): this thread's memory."""
    group = n_heads // n_kv
    n_lanes = lanes(isa)
    n_ctx = positions[i] + 1
    lo = max(0, n_ctx - window) if window > 0 else 0  # first visible key (sliding window)
    c0 = k * chunk
    c1 = min(c0 + chunk, n_ctx)
    start = max(c0, lo)
    b_lo = start // block_size
    b_hi = (c1 + block_size - 1) // block_size
    s_lo = b_lo * block_size - c0  # first score read (block_size is a multiple of lanes)
    table = block_tables[token_seq[i]]
    # scores (group, chunk) = Q K^T * scale, n_lanes positions per vector; heads go four at a time
    # through one K load each (a head index past the group repeats the last head: computed,
    # never stored), which also gives four independent add chains
    for b in range(b_lo, b_hi):
        kb = k_pool[table[b], g]  # (head_dim, block_size)
        for c in range(0, min(block_size, c1 - b * block_size), n_lanes):
            for h0 in range(0, group, 4):
                h1 = min(h0 + 1, group - 1)
                h2 = min(h0 + 2, group - 1)
                h3 = min(h0 + 3, group - 1)
                s0 = vzero_f32(isa)
                s1 = vzero_f32(isa)
                s2 = vzero_f32(isa)
                s3 = vzero_f32(isa)
                for j in range(head_dim):
                    kv = vload_f16(isa, kb[j], c)
                    s0 = vadd(s0, vmul(vsplat_f32(isa, qh[h0, j]), kv))
                    s1 = vadd(s1, vmul(vsplat_f32(isa, qh[h1, j]), kv))
                    s2 = vadd(s2, vmul(vsplat_f32(isa, qh[h2, j]), kv))
                    s3 = vadd(s3, vmul(vsplat_f32(isa, qh[h3, j]), kv))
                o = b * block_size - c0 + c
                vstore_f32(scores[h3], o, vmul(s3, vsplat_f32(isa, scale)))
                vstore_f32(scores[h2], o, vmul(s2, vsplat_f32(isa, scale)))
                vstore_f32(scores[h1], o, vmul(s1, vsplat_f32(isa, scale)))
                vstore_f32(scores[h0], o, vmul(s0, vsplat_f32(isa, scale)))
    n_used = c1 - c0
    n_vec = (n_used + n_lanes - 1) // n_lanes
    v_lo = s_lo // n_lanes
    for h in range(group):
        sh = scores[h]
        for p in range(n_used, n_vec * n_lanes):
            sh[p] = -np.inf  # lanes past the context: exp gives ~1e-38, which vanishes
            # in the sum and rounds to 0 in f16 (and V rows past the context are never read)
        for p in range(s_lo, start - c0):
            sh[p] = -np.inf  # keys before the sliding window
        mx = vload_f32(isa, sh, v_lo * n_lanes)
        for c in range(v_lo + 1, n_vec):
            mx = vmax(mx, vload_f32(isa, sh, c * n_lanes))
        m = vhmax(mx)
        mv = vsplat_f32(isa, m)
        total = vzero_f32(isa)
        for c in range(v_lo, n_vec):
            e = vexp(isa, vsub(vload_f32(isa, sh, c * n_lanes), mv))
            vstore_f32(sh, c * n_lanes, e)
            total = vadd(total, e)
        lsum = vhsum(total)
        inv = vsplat_f32(isa, np.float32(1.0) / lsum)
        for c in range(v_lo, n_vec):
            vstore_f32(sh, c * n_lanes, vround_f16(vmul(vload_f32(isa, sh, c * n_lanes), inv)))
        res[h, head_dim] = m
        res[h, head_dim + 1] = lsum
    pv(isa, scores, v_pool, table, g, b_lo, b_hi, block_size, c0, c1, res[:, :head_dim])
