"""Causal grouped-query attention over the paged f16 KV pool.

The pool of one layer is (n_blocks, block_size, n_kv_heads, head_dim) uint16 (f16 bits).  A token
at position p of sequence s reads slots 0..p through s's block table; its own K/V (and those of
earlier tokens of the same chunk) were written before this call, earlier chunks' in earlier steps.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .f16 import f16_bits, f16_row_to_f32, round_f16


@njit(cache=True, nogil=True)
def write_kv(qkv, k_col, v_col, n_kv_heads, head_dim, slot_mapping, block_size, k_pool, v_pool):
    """Store K and V of every token (columns of qkv (n_tokens, q|k|v)) into its slot as f16."""
    for i in range(qkv.shape[0]):
        blk = slot_mapping[i] // block_size
        off = slot_mapping[i] % block_size
        for h in range(n_kv_heads):
            for j in range(head_dim):
                k_pool[blk, off, h, j] = f16_bits(qkv[i, k_col + h * head_dim + j])
                v_pool[blk, off, h, j] = f16_bits(qkv[i, v_col + h * head_dim + j])


@njit(cache=True, nogil=True, parallel=True, fastmath=True)
def attention(qkv, n_heads, n_kv_heads, head_dim, positions, token_seq, block_tables,
              block_size, k_pool, v_pool, scale, out, window=0):
    """qkv (n_tokens, (n_heads + 2 n_kv) * head_dim) with RoPE applied -> out (n_tokens,
    n_heads * head_dim).  One work item per (token, kv head): the query heads of a GQA group
    share each K/V row load.  Each item's arithmetic is independent of the rest of the batch
    (fastmath only reorders sums inside one item, identically for every item).
    window > 0: sliding-window attention, a token at p sees keys p - window + 1 .. p only (the
    blocks before them are never read, so a sliding pool may have released them)."""
    n_tokens = qkv.shape[0]
    group = n_heads // n_kv_heads
    for item in prange(n_tokens * n_kv_heads):
        i = item // n_kv_heads
        g = item % n_kv_heads
        n_ctx = positions[i] + 1
        lo = max(0, n_ctx - window) if window > 0 else 0  # first visible key (sliding window)
        table = block_tables[token_seq[i]]
        scores = np.empty((group, n_ctx), np.float32)  # (group, n_ctx)
        bits = np.empty(head_dim, np.uint32)
        row = np.empty(head_dim, np.float32)
        acc = np.zeros((group, head_dim), np.float32)  # (group, head_dim)
        q0 = g * group * head_dim
        # llama.cpp multiplies f16 K by Q rounded to f16, and f16 V by probabilities rounded
        # to f16; doing the same keeps our logits closest to its.
        qh = np.empty((group, head_dim), np.float32)  # (group, head_dim)
        for h in range(group):
            for j in range(head_dim):
                qh[h, j] = round_f16(qkv[i, q0 + h * head_dim + j])
        for p in range(lo, n_ctx):
            f16_row_to_f32(k_pool[table[p // block_size], p % block_size, g], bits, row)
            for h in range(group):
                s = np.float32(0.0)
                for j in range(head_dim):
                    s += qh[h, j] * row[j]
                scores[h, p] = s * scale
        for h in range(group):
            mx = scores[h, lo]
            for p in range(lo + 1, n_ctx):
                mx = max(mx, scores[h, p])
            total = 0.0  # float64, as ggml's softmax
            for p in range(lo, n_ctx):
                e = np.exp(scores[h, p] - mx)
                scores[h, p] = e
                total += e
            inv = np.float32(1.0 / total)
            for p in range(lo, n_ctx):
                scores[h, p] = round_f16(scores[h, p] * inv)
        for p in range(lo, n_ctx):
            f16_row_to_f32(v_pool[table[p // block_size], p % block_size, g], bits, row)
            for h in range(group):
                w = scores[h, p]
                for j in range(head_dim):
                    acc[h, j] += w * row[j]
        for h in range(group):
            for j in range(head_dim):
                out[i, q0 + h * head_dim + j] = acc[h, j]
