"""Causal grouped-query attention over the paged f16 KV pool in vectors of the IsaType's width
(16 lanes on avx512, 8 on avx2 and neon), one source for every vector path.

Pool layout of one layer on these paths (block_size and head_dim multiples of 16):
    K: (n_blocks, n_kv_heads, head_dim, block_size)  transposed: one f16 vector = one head
       dimension at `lanes` consecutive positions, so the scores build up with no horizontal
       sums
    V: (n_blocks, n_kv_heads, block_size, head_dim)  a position's values, `lanes` dims per
       vector
Numerics follow kernels/attention.py (and llama.cpp): Q and the probabilities are rounded to
f16 before they meet f16 K and V; the products are FMA chains (kernels/attention_pv.py), so
the paths agree with the generic kernel to rounding, not bit for bit.  Work items are (tile,
kv head): a tile is up to TILE_TOKENS consecutive tokens of one sequence (a prefill chunk;
a decode token is a tile of one), whose query rows — tokens x the heads of the GQA group —
share each K / V load, dealt round-robin to threads.  Keys go in chunks
(kernels/attention_split.py): with many items each thread takes whole items; with few items
and long contexts (single-stream decode: SmolLM2 has 3 kv heads for 2 threads) the threads
share the chunks of each token (flash-decoding) and one merge follows.  Either way a token's
result depends only on its own token and context, never on the rest of the batch or its
tile.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..simd.vectors import lanes, vload_f32, vsplat_f32, vstore_f16, vstore_f32, vzero_f32
from ..simd.vexp import vexp
from ..simd.vmath import vadd, vhmax, vhsum, vmax, vmul, vround_f16, vsub
from .attention_pv import pv, qk_scores
from .attention_split import SPLIT_ITEMS, TILE_TOKENS, chunk_span, merge, plan_chunks, slot


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
    n_heads head_dim).  scratch (threads, rows, width >= 3 head_dim + 4 + block_size):
    per-thread memory laid out as attention_split.py says (allocating inside a parallel loop
    costs about a millisecond per call); rows = TILE_TOKENS x group lets a tile's tokens share
    each K / V load (fewer rows: smaller tiles, the same results).
    window > 0: sliding-window attention, a token at p sees keys p - window + 1 .. p only;
    blocks wholly before them are never read (a sliding pool may have released them)."""
    n_tokens = qkv.shape[0]
    n_threads = scratch.shape[0]
    group = n_heads // n_kv
    hd = head_dim
    chunk, tail, per_thread = plan_chunks(scratch.shape[2], head_dim, block_size, n_threads)
    n_items = n_tokens * n_kv
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
                    qh = scratch[part, :group, :hd]
                    _round_q(isa, qkv[i], g * group * hd, hd, qh)
                    # nt as int64, not the literal 1: one _chunk compile serves both loops
                    _chunk(isa, i, np.int64(1), g, k0 + u - starts[item], chunk, n_heads,
                           n_kv, hd,
                           positions, token_seq, block_tables, block_size, k_pool, v_pool,
                           scale, window, qh, scratch[part, :group, 2 * hd + 2:2 * hd + 2 + chunk],
                           slot(scratch, u, tail, hd, per_thread)[:group])
            for item in range(n_items):  # merge in chunk order, on this thread
                state = slot(scratch, starts[item], tail, hd, per_thread)[:group]
                for u in range(starts[item] + 1, starts[item + 1]):
                    merge(state, slot(scratch, u, tail, hd, per_thread)[:group], hd)
                _emit(isa, out, item // n_kv, (item % n_kv) * group * hd, hd, state)
            return
    # -- tiles: runs of up to tile_max consecutive tokens of one sequence (a prefill chunk)
    tile_max = max(1, min(TILE_TOKENS, scratch.shape[1] // group))
    first = np.empty(n_tokens + 1, np.int64)
    n_tiles = 0
    i = 0
    while i < n_tokens:
        first[n_tiles] = i
        j = i + 1
        while (j < n_tokens and j - i < tile_max and token_seq[j] == token_seq[i]
               and positions[j] == positions[j - 1] + 1):
            j += 1
        n_tiles += 1
        i = j
    first[n_tiles] = n_tokens
    n_items = n_tiles * n_kv
    for part in prange(n_threads):  # part p owns scratch p; items dealt round-robin, so a
        # prefill's short early contexts and long late ones spread over every thread
        for item in range(part, n_items, n_threads):
            t, g = item // n_kv, item % n_kv
            nq = (first[t + 1] - first[t]) * group
            _attend_tile(isa, first[t], first[t + 1] - first[t], g, chunk, qkv, n_heads, n_kv,
                         hd, positions, token_seq, block_tables, block_size, k_pool, v_pool,
                         scale, window, out,
                         scratch[part, :nq, :hd],  # Q rounded to f16
                         scratch[part, :nq, hd:2 * hd + 2],  # one chunk's (o, m, l)
                         scratch[part, :nq, 2 * hd + 2:2 * hd + 2 + chunk],  # scores
                         scratch[part, :nq, tail - hd - 2:tail])  # merged (o, m, l)


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
def _attend_tile(isa, i0, nt, g, chunk, qkv, n_heads, n_kv, head_dim, positions, token_seq,
                 block_tables, block_size, k_pool, v_pool, scale, window, out, qh, part,
                 scores, state):
    """Tokens i0..i0+nt-1 (one sequence, consecutive positions), kv head g, every chunk any
    of them sees, on this thread."""
    group = n_heads // n_kv
    q0 = g * group * head_dim
    for t in range(nt):
        _round_q(isa, qkv[i0 + t], q0, head_dim, qh[t * group:(t + 1) * group])
    for r in range(state.shape[0]):  # empty: the first merge copies a chunk's result
        state[r, :] = 0.0
        state[r, head_dim] = -np.inf
    k0, _ = chunk_span(positions[i0], window, chunk)
    _, k1 = chunk_span(positions[i0 + nt - 1], window, chunk)
    for k in range(k0, k1 + 1):
        _chunk(isa, i0, nt, g, k, chunk, n_heads, n_kv, head_dim, positions, token_seq,
               block_tables, block_size, k_pool, v_pool, scale, window, qh, scores, part)
        merge(state, part, head_dim)
    for t in range(nt):
        _emit(isa, out, i0 + t, q0, head_dim, state[t * group:(t + 1) * group])


@njit(nogil=True)
def _chunk(isa, i0, nt, g, k, chunk, n_heads, n_kv, head_dim, positions, token_seq,
           block_tables, block_size, k_pool, v_pool, scale, window, qh, scores, res):
    """Tokens i0..i0+nt-1, kv head g, their visible keys in chunk k -> res (rows, head_dim
    + 2): (o, m, l) per query row (token-major, attention_split.py); l = 0 for a row that sees
    no key here.  qh: the rows' Q rounded to f16; scores (rows, >= chunk): this thread's
    memory.  Each row's softmax runs over exactly the vectors its token alone would use."""
    group = n_heads // n_kv
    n_lanes = lanes(isa)
    c0 = k * chunk
    p_last = positions[i0 + nt - 1]
    lo = max(0, positions[i0] + 1 - window) if window > 0 else 0  # the tile's first key
    c1 = min(c0 + chunk, p_last + 1)
    start = max(c0, lo)
    b_lo = start // block_size
    b_hi = (c1 + block_size - 1) // block_size
    v_lo = (b_lo * block_size - c0) // n_lanes  # score vectors of the tile: v_lo .. v_hi - 1
    v_hi = (c1 - c0 + n_lanes - 1) // n_lanes
    table = block_tables[token_seq[i0]]
    qk_scores(isa, qh, k_pool, table, g, block_size, c0, v_lo, v_hi, scale, scores)
    for r in range(qh.shape[0]):
        sh = scores[r]
        p = positions[i0 + r // group]
        first = max(c0, max(0, p + 1 - window) if window > 0 else 0)  # the row's own keys:
        end = min(c0 + chunk, p + 1)  # first .. end - 1
        if first >= end:
            for c in range(v_lo * n_lanes, v_hi * n_lanes):
                sh[c] = 0.0
            res[r, head_dim] = -np.inf
            res[r, head_dim + 1] = 0.0
            continue
        r_lo = ((first // block_size) * block_size - c0) // n_lanes
        r_hi = (end - c0 + n_lanes - 1) // n_lanes
        for c in range(r_lo * n_lanes, first - c0):
            sh[c] = -np.inf  # keys before the sliding window
        for c in range(end - c0, r_hi * n_lanes):
            sh[c] = -np.inf  # lanes past the context: exp gives ~1e-38, which vanishes
            # in the sum and rounds to 0 in f16
        mx = vload_f32(isa, sh, r_lo * n_lanes)
        for c in range(r_lo + 1, r_hi):
            mx = vmax(mx, vload_f32(isa, sh, c * n_lanes))
        m = vhmax(mx)
        mv = vsplat_f32(isa, m)
        total = vzero_f32(isa)
        for c in range(r_lo, r_hi):
            e = vexp(isa, vsub(vload_f32(isa, sh, c * n_lanes), mv))
            vstore_f32(sh, c * n_lanes, e)
            total = vadd(total, e)
        lsum = vhsum(total)
        inv = vsplat_f32(isa, np.float32(1.0) / lsum)
        for c in range(r_lo, r_hi):
            vstore_f32(sh, c * n_lanes, vround_f16(vmul(vload_f32(isa, sh, c * n_lanes), inv)))
        for c in range(v_lo * n_lanes, r_lo * n_lanes):
            sh[c] = 0.0  # the tile's keys this row does not see: probability 0 in P V
        for c in range(r_hi * n_lanes, v_hi * n_lanes):
            sh[c] = 0.0
        res[r, head_dim] = m
        res[r, head_dim + 1] = lsum
    pv(isa, scores, v_pool, table, g, b_lo, b_hi, block_size, c0, c1, res[:, :head_dim])
