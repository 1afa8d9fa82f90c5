"""Paged attention over the engine's block tables: one kernel for prefill, chunked prefill and
decode, a KV-store kernel driven by the slot mapping, and the merge of a split decode.

A program takes one "query block" — up to BLOCK_Q consecutive tokens of one sequence — and one
KV head, and packs the GROUP query heads that share that KV head into the rows of one tile:

    rows r = (token t, head h) = (r // GROUP_P, r % GROUP_P)     R = BLOCK_Q * GROUP_P rows
    for each tile of 64 keys (4 KV blocks of 16) the rows can see:  (block table -> physical ids)
        S = Q · K_tileᵀ · scale   (softcap)   causal + sliding-window mask   (R, 64)
        online softmax: m, l, acc updated exactly as one softmax over all keys

so each K/V block is read once for a whole GQA group and BLOCK_Q tokens.  A prefill chunk whose
earlier tokens are cached (prefix reuse, chunked prefill) is the same loop with more blocks
before the diagonal; a decode is BLOCK_Q = 1.  Long decodes with few sequences split their
tiles over `n_splits` programs (grid axis 2) that write unnormalized partial results; the merge
rescales them to the common maximum, so the result is the unsplit one up to rounding.
K/V pool layout, per layer: (num_blocks, block_size, n_kv_heads, head_dim) f16.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

NEG = -1.0e30  # the running max's start: finite, so a row with no visible key stays 0, not NaN


@triton.jit(do_not_specialize=["stride_q", "stride_o", "stride_t", "n_tokens", "window",
                               "n_splits"])
def _attention_kernel(q_ptr, k_ptr, v_ptr, table_ptr, qb_seq_ptr, qb_start_ptr, qb_len_ptr,
                      pos_ptr, out_ptr, pacc_ptr, pml_ptr, stride_q, stride_o, stride_t,
                      n_tokens, sm_scale, softcap, window, n_splits,
                      N_HEADS: tl.constexpr, N_KV: tl.constexpr, GROUP: tl.constexpr,
                      GROUP_P: tl.constexpr, BLOCK_Q: tl.constexpr, HEAD_DIM: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                      PAGES: tl.constexpr, HAS_SOFTCAP: tl.constexpr, SPLIT: tl.constexpr):
    qb = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq = tl.load(qb_seq_ptr + qb).to(tl.int64)
    start = tl.load(qb_start_ptr + qb)
    q_len = tl.load(qb_len_ptr + qb)
    r = tl.arange(0, BLOCK_Q * GROUP_P)
    tok = start + r // GROUP_P
    head = kvh * GROUP + r % GROUP_P
    row_ok = (r // GROUP_P < q_len) & (r % GROUP_P < GROUP)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    # f16 operands, f32 accumulation (as llama.cpp's CUDA flash attention): K and V are f16
    # in the pool already; Q and the probabilities P round to f16 for the tensor cores
    q = tl.load(q_ptr + tok[:, None].to(tl.int64) * stride_q + head[:, None] * HEAD_DIM + d,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float16)
    pos = tl.load(pos_ptr + tok, mask=row_ok, other=-1)
    # the KV blocks any row may see: from the first row's window to the last row's diagonal
    first_pos = tl.load(pos_ptr + start)
    last_pos = tl.load(pos_ptr + start + q_len - 1)
    lo = 0
    if window > 0:
        lo = tl.maximum(first_pos - window + 1, 0)
    blk_lo = lo // BLOCK_SIZE
    blk_hi = last_pos // BLOCK_SIZE + 1
    # TILE = PAGES blocks of keys per iteration (each through its own block-table entry)
    n_tiles = tl.cdiv(blk_hi - blk_lo, PAGES)
    per = tl.cdiv(n_tiles, n_splits)
    t0 = split * per
    t1 = tl.minimum(n_tiles, t0 + per)

    m = tl.full((BLOCK_Q * GROUP_P,), NEG, tl.float32)
    l_sum = tl.zeros((BLOCK_Q * GROUP_P,), tl.float32)
    acc = tl.zeros((BLOCK_Q * GROUP_P, BLOCK_D), tl.float32)
    j = tl.arange(0, PAGES * BLOCK_SIZE)
    for t in range(t0, t1):
        page = blk_lo + t * PAGES + j // BLOCK_SIZE  # (TILE,) logical block of each key
        page_ok = page < blk_hi
        phys = tl.load(table_ptr + seq * stride_t + page, mask=page_ok, other=0).to(tl.int64)
        kv = ((phys * BLOCK_SIZE + j % BLOCK_SIZE)[:, None] * (N_KV * HEAD_DIM)
              + kvh * HEAD_DIM + d[None, :])
        kv_ok = page_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + kv, mask=kv_ok, other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale  # (R, TILE)
        if HAS_SOFTCAP:
            t = tl.minimum(tl.maximum(2.0 * s / softcap, -30.0), 30.0)  # tanh = ±1 beyond
            s = softcap * (1.0 - 2.0 / (tl.exp(t) + 1.0))
        kpos = page * BLOCK_SIZE + j % BLOCK_SIZE
        ok = page_ok[None, :] & (kpos[None, :] <= pos[:, None])
        if window > 0:
            ok = ok & (kpos[None, :] > pos[:, None] - window)
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l_sum = l_sum * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + kv, mask=kv_ok, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m = m_new
    if SPLIT:  # unnormalized partials: (n_splits, n_tokens, N_HEADS, ...)
        at = (split * n_tokens + tok.to(tl.int64)) * N_HEADS + head
        tl.store(pacc_ptr + at[:, None] * HEAD_DIM + d[None, :], acc,
                 mask=row_ok[:, None] & d_ok[None, :])
        tl.store(pml_ptr + at * 2, m, mask=row_ok)
        tl.store(pml_ptr + at * 2 + 1, l_sum, mask=row_ok)
    else:
        out = acc / tl.where(l_sum > 0, l_sum, 1.0)[:, None]
        tl.store(out_ptr + tok[:, None].to(tl.int64) * stride_o + head[:, None] * HEAD_DIM
                 + d[None, :], out, mask=row_ok[:, None] & d_ok[None, :])


@triton.jit(do_not_specialize=["stride_o", "n_tokens", "n_splits"])
def _merge_kernel(pacc_ptr, pml_ptr, out_ptr, stride_o, n_tokens, n_splits,
                  N_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_S: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_ok = s < n_splits
    at = (s * n_tokens + t) * N_HEADS + h
    m = tl.load(pml_ptr + at * 2, mask=s_ok, other=NEG)
    ls = tl.load(pml_ptr + at * 2 + 1, mask=s_ok, other=0.0)
    w = tl.exp(m - tl.max(m, axis=0))
    acc = tl.load(pacc_ptr + at[:, None] * HEAD_DIM + d[None, :],
                  mask=s_ok[:, None] & (d < HEAD_DIM)[None, :], other=0.0)
    total = tl.sum(ls * w, axis=0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + t * stride_o + h * HEAD_DIM + d, out, mask=d < HEAD_DIM)


@triton.jit(do_not_specialize=["stride", "k_col", "v_col"])
def _kv_store_kernel(x_ptr, slot_ptr, k_ptr, v_ptr, stride, k_col, v_col, N: tl.constexpr,
                     BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    c = tl.arange(0, BLOCK)
    ok = (c < N) & (c * 0 + slot >= 0)  # slot -1: a padding row (CUDA graphs) writes nothing
    k = tl.load(x_ptr + t * stride + k_col + c, mask=ok, other=0.0)
    v = tl.load(x_ptr + t * stride + v_col + c, mask=ok, other=0.0)
    tl.store(k_ptr + slot * N + c, k.to(tl.float16), mask=ok)
    tl.store(v_ptr + slot * N + c, v.to(tl.float16), mask=ok)


@dataclass(slots=True)
class AttentionPlan:
    """A step's query blocks and split count, on the device (built once per step, used by every
    layer)."""

    qb_seq: torch.Tensor  # (n_qblocks,) int32 sequence index
    qb_start: torch.Tensor  # (n_qblocks,) int32 first token (flat index)
    qb_len: torch.Tensor  # (n_qblocks,) int32 tokens in the block (1..BLOCK_Q)
    block_q: int
    n_splits: int


def query_blocks(seq_starts: np.ndarray, n_heads: int, n_kv: int, max_blocks: int,
                 split_target: int, n_splits: int | None = None
                 ) -> tuple[np.ndarray, int, int]:
    """Query blocks for sequences whose tokens are [seq_starts[i], seq_starts[i+1]): (3,
    n_qblocks) int32 rows sequence, first token, length; BLOCK_Q; the split count.  A decode
    step (one token per sequence) packs a GQA group into >= 16 rows; longer chunks take 64-row
    tiles.  split_target: programs the device wants busy (about 2 per SM); a decode whose
    sequences and KV heads give fewer programs splits each context over n_splits programs."""
    group_p = triton.next_power_of_2(n_heads // n_kv)  # the kernel's rows per token
    lens = np.diff(seq_starts)
    decode = bool(lens.max(initial=1) <= 1)
    block_q = max(1, (16 if decode else 64) // group_p)
    n_blocks = -(-lens // block_q)
    qb = np.empty((3, int(n_blocks.sum())), np.int32)
    qb[0] = np.repeat(np.arange(len(lens)), n_blocks)
    first = np.repeat(np.cumsum(n_blocks) - n_blocks, n_blocks)
    qb[1] = np.repeat(seq_starts[:-1], n_blocks) + (np.arange(qb.shape[1]) - first) * block_q
    qb[2] = np.minimum(block_q, np.repeat(seq_starts[1:], n_blocks) - qb[1])
    if n_splits is None:
        n_splits = 1
        programs = qb.shape[1] * n_kv
        if decode and programs < split_target:
            n_splits = int(min(max(1, max_blocks // 8), -(-split_target // max(programs, 1)), 16))
    return qb, block_q, n_splits


def plan(seq_starts: np.ndarray, n_heads: int, n_kv: int, device: torch.device,
         max_blocks: int, split_target: int, n_splits: int | None = None) -> AttentionPlan:
    """query_blocks() on the device (a step packs them with its other inputs instead)."""
    qb, block_q, n_splits = query_blocks(seq_starts, n_heads, n_kv, max_blocks, split_target,
                                         n_splits)
    dev = torch.from_numpy(qb).to(device)
    return AttentionPlan(dev[0], dev[1], dev[2], block_q, n_splits)


def split_buffers(p: AttentionPlan, n_tokens: int, n_heads: int, head_dim: int,
                  device: torch.device, have: tuple[torch.Tensor, torch.Tensor] | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """A split decode's partials, (n_splits, n_tokens, n_heads) x (head_dim | max and sum):
    `have` when it is big enough, else new buffers."""
    need = p.n_splits * n_tokens * n_heads
    if have is not None and have[1].numel() >= 2 * need:
        return have
    return (torch.empty(need * head_dim, device=device), torch.empty(2 * need, device=device))


def kv_store(qkv: torch.Tensor, slots: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
             k_col: int, v_col: int) -> None:
    """k_pool/v_pool (num_blocks, block_size, n_kv, head_dim) f16 <- qkv's K and V columns at
    each token's slot."""
    n = qkv.shape[0]
    width = k_pool.shape[2] * k_pool.shape[3]
    _kv_store_kernel[(n,)](qkv, slots, k_pool, v_pool, qkv.stride(0), k_col, v_col, N=width,
                           BLOCK=triton.next_power_of_2(width))


def attend(qkv: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
           tables: torch.Tensor, positions: torch.Tensor, p: AttentionPlan, out: torch.Tensor,
           n_heads: int, sm_scale: float, window: int = 0, softcap: float = 0.0,
           scratch: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """out (n_tokens, n_heads * head_dim) <- attention of qkv's Q columns over the pool."""
    n_tokens = qkv.shape[0]
    _, block_size, n_kv, head_dim = k_pool.shape
    group = n_heads // n_kv
    split = p.n_splits > 1
    if split:
        pacc, pml = split_buffers(p, n_tokens, n_heads, head_dim, qkv.device, scratch)
    else:
        pacc = pml = out
    grid = (p.qb_seq.shape[0], n_kv, p.n_splits)
    _attention_kernel[grid](qkv, k_pool, v_pool, tables, p.qb_seq, p.qb_start, p.qb_len,
                            positions, out, pacc, pml, qkv.stride(0), out.stride(0),
                            tables.stride(0), n_tokens, sm_scale, softcap, window, p.n_splits,
                            N_HEADS=n_heads, N_KV=n_kv, GROUP=group,
                            GROUP_P=triton.next_power_of_2(group), BLOCK_Q=p.block_q,
                            HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim),
                            BLOCK_SIZE=block_size, PAGES=max(1, 64 // block_size),
                            HAS_SOFTCAP=softcap > 0, SPLIT=split)
    if split:
        _merge_kernel[(n_tokens, n_heads)](pacc, pml, out, out.stride(0), n_tokens, p.n_splits,
                                           N_HEADS=n_heads, HEAD_DIM=head_dim,
                                           BLOCK_D=triton.next_power_of_2(head_dim),
                                           BLOCK_S=triton.next_power_of_2(p.n_splits))
