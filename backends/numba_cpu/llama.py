"""The llama architecture (and qwen2 = llama + Q/K/V biases + NEOX rope): one jitted step that
wires the shared kernels over all layers.

    x = embed(tokens)                                   # (n_tokens, n_embd)
    per layer:  x += Wo · attention(rope(Wqkv · rmsnorm(x) + bqkv))
                x += Wdown · swiglu(Wgu · rmsnorm(x))
    logits = Whead · rmsnorm(x[logits_rows])            # (n_logits, n_vocab)

Python dispatch happens once per step, not per layer or per operation.  `isa` (isa.Isa) picks
the kernels at compile time (dispatch.py); the wiring below is the same for every path.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .dispatch import attend, embed, silu_mul
from .kernels.attention_split import TILE_TOKENS
from .kernels.elementwise import (
    add_bias,
    add_inplace,
    gather_rows,
    rmsnorm,
    rope_inplace,
    rope_neox,
    rope_tables,
)
from .project_q8k import project_as


def make_buffers(n_tokens: int, n_embd: int, n_heads: int, n_kv_heads: int, head_dim: int,
                 n_ff: int, rope_dim: int, threads: int = 1, max_ctx: int = 0) -> tuple:
    """Scratch for a step of up to n_tokens tokens (reused across steps); attention scratch
    for `threads` workers and contexts up to max_ctx (allocating inside a parallel loop costs
    about a millisecond per call, so kernels get their per-thread memory from here)."""
    f32 = np.float32
    qkv_cols = (n_heads + 2 * n_kv_heads) * head_dim
    widest = max(n_embd, n_ff, n_heads * head_dim)
    return (
        np.zeros((n_tokens, n_embd), f32),  # x: residual stream
        np.zeros((n_tokens, n_embd), f32),  # xn: normed / projection output
        np.zeros((n_tokens, qkv_cols), f32),  # qkv
        np.zeros((n_tokens, n_heads * head_dim), f32),  # att
        np.zeros((n_tokens, 2 * n_ff), f32),  # gate | up
        np.zeros((n_tokens, n_ff), f32),  # swiglu output
        np.zeros((n_tokens, rope_dim // 2), f32),  # cos
        np.zeros((n_tokens, rope_dim // 2), f32),  # sin
        # per thread, per query row (the vector kernels' tiles: TILE_TOKENS tokens x the
        # heads of a GQA group): the generic kernel's Q, output and scores (2 head_dim +
        # max_ctx); the vector kernels' Q, chunk state, merged state and chunk scores
        # (3 head_dim + 4 + chunk <= max_ctx, kernels/attention_split.py) — the wider of the
        # two, so even a pool of a few blocks leaves room for one whole chunk
        np.zeros((threads, TILE_TOKENS * (n_heads // n_kv_heads), 3 * head_dim + 4 + max_ctx),
                 f32),
        (
            np.zeros((n_tokens, widest), np.int8),  # int8 activation codes
            np.zeros((n_tokens, widest // 32), f32),  # block scales
            np.zeros((n_tokens, widest // 32), np.int32),  # block code sums
            np.zeros((n_tokens, widest // 32), f32),  # scale * code sum
        ),
    )


@njit(cache=True, nogil=True)
def llama_step(isa, tokens, positions, token_seq, block_tables, slot_mapping, logits_rows,
               dims, rms_eps, rope_base, attn_scale,
               embd, head, out_norm, attn_norm, ffn_norm, bqkv, wqkv, wo, wgu, wdown, q8k,
               k_pool, v_pool, bufs, logits):
    """One forward step.  tokens, positions, token_seq (sequence index), slot_mapping:
    (n_tokens,); block_tables (n_seqs, max_blocks); logits_rows (n_logits,) -> logits
    (n_logits, n_vocab).  k_pool, v_pool: (n_layers, ...) f16 bits in the isa's attention
    layout (kernels/attention.py, kernels/attention_simd.py).  bqkv (n_layers, qkv cols):
    biases added after the QKV projection (zeros for llama); dims[-1] = 1 for NEOX rope."""
    n_layers, n_embd, n_heads, n_kv, head_dim, n_ff, rope_dim, block_size, neox = dims
    n = tokens.shape[0]
    x_b, xn_b, qkv_b, att_b, gu_b, h_b, cos_b, sin_b, att_scratch, qbuf = bufs
    x = x_b[:n]
    xn = xn_b[:n]
    qkv = qkv_b[:n]
    att = att_b[:n]
    gu = gu_b[:n]
    hid = h_b[:n]
    cos_t = cos_b[:n]
    sin_t = sin_b[:n]
    k_col = n_heads * head_dim

    embed(isa, embd, tokens, x)
    rope_tables(positions, rope_dim, rope_base, cos_t, sin_t)
    for layer in range(n_layers):
        rmsnorm(x, attn_norm[layer], rms_eps, xn)
        # (n, (n_heads + 2 n_kv) head_dim)
        project_as(isa, wqkv, layer, xn, qbuf, qkv, q8k, 0)
        add_bias(qkv, bqkv[layer])
        if neox:
            rope_neox(qkv, 0, n_heads, head_dim, rope_dim, cos_t, sin_t)
            rope_neox(qkv, k_col, n_kv, head_dim, rope_dim, cos_t, sin_t)
        else:
            rope_inplace(qkv, 0, n_heads, head_dim, rope_dim, cos_t, sin_t)
            rope_inplace(qkv, k_col, n_kv, head_dim, rope_dim, cos_t, sin_t)
        attend(isa, qkv, n_heads, n_kv, head_dim, positions, token_seq, block_tables,
               block_size, slot_mapping, k_pool[layer], v_pool[layer], attn_scale, att_scratch,
               att, 0)
        project_as(isa, wo, layer, att, qbuf, xn, q8k, 1)  # (n, n_embd)
        add_inplace(x, xn)
        rmsnorm(x, ffn_norm[layer], rms_eps, xn)
        project_as(isa, wgu, layer, xn, qbuf, gu, q8k, 2)  # (n, 2 n_ff)
        silu_mul(isa, gu, n_ff, hid)
        project_as(isa, wdown, layer, hid, qbuf, xn, q8k, 3)  # (n, n_embd)
        add_inplace(x, xn)

    n_out = logits_rows.shape[0]
    sel = np.empty((n_out, n_embd), np.float32)
    gather_rows(x, logits_rows, sel)
    xn_out = xn_b[:n_out]
    rmsnorm(sel, out_norm, rms_eps, xn_out)
    project_as(isa, head, 0, xn_out, qbuf, logits, q8k, 4)
