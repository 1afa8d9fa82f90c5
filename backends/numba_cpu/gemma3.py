"""The gemma3 architecture: one jitted step wiring the shared kernels over all layers.

    x = embed(tokens) * sqrt(n_embd)
    per layer:  q, k, v = Wqkv · rmsnorm(x);  q, k = rmsnorm_per_head(q, k)
                q, k = rope(q, k; local or global base);  q *= attn_scale
                x += rmsnorm_post(Wo · attention(q, k, v; sliding window on local layers))
                x += rmsnorm_post(Wdown · (gelu(Wgate · rmsnorm(x)) * Wup · rmsnorm(x)))
    logits = Whead · rmsnorm(x[logits_rows])   (softcapped when the model says so)

Local (sliding-window) and global layers keep K/V in separate pools: the global pool is indexed
by the sequence's full block table, the local one by its sliding table, whose blocks wholly
before the window the engine may have released (attention never reads them).  The GGUF norm
weights already include gemma's "+1", so they are used as stored.  After the last layer's
attention only the rows that give logits go on (a prefill needs one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numba import njit

from .dispatch import attend, embed
from .kernels.elementwise import add_rmsnorm, gather_rows, rmsnorm
from .kernels.gelu import gelu_f16_table
from .kernels.gelu_simd import gelu_mul
from .kernels.qk_norm import qk_norm_rope, scale_columns
from .kernels.rope_scaled import rope_tables_scaled
from .kv_pages import kv_zeros
from .llama import make_buffers as llama_buffers
from .project_q8k import project_as
from .weights import LlamaWeights

if TYPE_CHECKING:
    from localinfer.gguf_file import GGUFFile
    from localinfer.model_config import ModelConfig


@dataclass(slots=True)
class Gemma3Weights:
    base: LlamaWeights  # embd, head, norms, wqkv, wo, wgu (gate | up), wdown
    q_norm: np.ndarray  # (n_layers, head_dim)
    k_norm: np.ndarray  # (n_layers, head_dim)
    post_attn_norm: np.ndarray  # (n_layers, n_embd)
    post_ffn_norm: np.ndarray  # (n_layers, n_embd)

    @classmethod
    def load(cls, g: GGUFFile, config: ModelConfig, tiled: bool) -> Gemma3Weights:
        def norms(role: str) -> np.ndarray:
            return np.stack([np.asarray(g.array(f"blk.{i}.{role}.weight"), np.float32).reshape(-1)
                             for i in range(config.n_layers)])

        return cls(base=LlamaWeights.load(g, config, tiled=tiled),
                   q_norm=norms("attn_q_norm"), k_norm=norms("attn_k_norm"),
                   post_attn_norm=norms("post_attention_norm"),
                   post_ffn_norm=norms("post_ffw_norm"))

    def nbytes(self) -> int:
        return self.base.nbytes() + sum(a.nbytes for a in (
            self.q_norm, self.k_norm, self.post_attn_norm, self.post_ffn_norm))


def make_buffers(c: ModelConfig, n_tokens: int, threads: int, max_ctx: int) -> tuple:
    """llama.make_buffers plus the global layers' rope tables."""
    half = c.rope_dim // 2
    return (llama_buffers(n_tokens, c.n_embd, c.n_heads, c.n_kv_heads, c.head_dim, c.n_ff,
                          c.rope_dim, threads, max_ctx),
            np.zeros((n_tokens, half), np.float32), np.zeros((n_tokens, half), np.float32))


@njit(cache=True, nogil=True)
def _softcap(logits, cap):
    """ggml's scale(1/cap) -> tanh -> scale(cap)."""
    inv = np.float32(1.0 / cap)
    for i in range(logits.shape[0]):
        for j in range(logits.shape[1]):
            logits[i, j] = np.float32(np.tanh(logits[i, j] * inv)) * np.float32(cap)


@njit(cache=True, nogil=True)
def gemma3_step(isa, tokens, positions, token_seq, tables, slots, swa_tables, swa_slots,
                logits_rows, dims, fparams, is_swa, pool_index, gelu_table, q8k,
                embd, head, out_norm, attn_norm, ffn_norm, wqkv, wo, wgu, wdown,
                q_norm, k_norm, post_attn_norm, post_ffn_norm,
                k_global, v_global, k_local, v_local, bufs, logits):
    """One forward step.  tables/slots address the global pool, swa_tables/swa_slots the local
    one (kernels/attention*.py layouts, leading axis = the pool's own layer index
    pool_index[layer]).  dims = (n_layers, n_embd, n_heads, n_kv, head_dim, n_ff, rope_dim,
    block_size, window); fparams = (rms_eps, rope_base, rope_base_swa, freq_scale, attn_scale,
    embd_scale, softcap)."""
    n_layers, n_embd, n_heads, n_kv, head_dim, n_ff, rope_dim, block_size, window = dims
    rms_eps = np.float32(fparams[0])
    attn_scale = np.float32(fparams[4])
    n = tokens.shape[0]
    lbufs, cosg_b, sing_b = bufs
    x_b, xn_b, qkv_b, att_b, gu_b, h_b, cos_b, sin_b, att_scratch, qbuf = lbufs
    x = x_b[:n]
    xn = xn_b[:n]
    qkv = qkv_b[:n]
    att = att_b[:n]
    gu = gu_b[:n]
    hid = h_b[:n]
    cos_l = cos_b[:n]
    sin_l = sin_b[:n]
    cos_g = cosg_b[:n]
    sin_g = sing_b[:n]
    one = np.float32(1.0)

    no_norm = out_norm[:0]  # add_rmsnorm without a next norm (after the last layer)
    n_out = logits_rows.shape[0]
    out_rows = logits_rows  # where the logits rows are in x (moved to the top in the last layer)
    embed(isa, embd, tokens, x)
    scale_columns(x, n_embd, np.float32(fparams[5]))
    rope_tables_scaled(positions, rope_dim, fparams[2], 1.0, cos_l, sin_l)
    rope_tables_scaled(positions, rope_dim, fparams[1], fparams[3], cos_g, sin_g)
    rmsnorm(x, attn_norm[0], rms_eps, xn)
    # each layer's post-norms, residual adds and the next pre-norm go in one pass over the
    # rows (add_rmsnorm), and Q/K's norms, RoPE and the Q scale in another (qk_norm_rope):
    # a prefill spends most of its non-matmul time in these per-token loops
    for layer in range(n_layers):
        project_as(isa, wqkv, layer, xn, qbuf, qkv, q8k, 0)
        j = pool_index[layer]
        if is_swa[layer]:
            qk_norm_rope(qkv, n_heads, n_kv, head_dim, q_norm[layer], k_norm[layer], rms_eps,
                         rope_dim, cos_l, sin_l, attn_scale)
            attend(isa, qkv, n_heads, n_kv, head_dim, positions, token_seq, swa_tables,
                   block_size, swa_slots, k_local[j], v_local[j], one, att_scratch, att, window)
        else:
            qk_norm_rope(qkv, n_heads, n_kv, head_dim, q_norm[layer], k_norm[layer], rms_eps,
                         rope_dim, cos_g, sin_g, attn_scale)
            attend(isa, qkv, n_heads, n_kv, head_dim, positions, token_seq, tables,
                   block_size, slots, k_global[j], v_global[j], one, att_scratch, att, 0)
        if layer == n_layers - 1 and n_out < n:
            # past the last attention only the rows that give logits matter (llama.cpp's
            # inp_out_ids): keep those, in order; rows are computed independently, so their
            # values are the same as when every row goes on
            att_sel = np.empty((n_out, att.shape[1]), np.float32)
            x_sel = np.empty((n_out, n_embd), np.float32)
            gather_rows(att, out_rows, att_sel)
            gather_rows(x, out_rows, x_sel)
            out_rows = np.arange(n_out)
            att = att_b[:n_out]
            gather_rows(att_sel, out_rows, att)
            x = x_b[:n_out]
            gather_rows(x_sel, out_rows, x)
            xn = xn_b[:n_out]
            gu = gu_b[:n_out]
            hid = h_b[:n_out]
        project_as(isa, wo, layer, att, qbuf, xn, q8k, 1)  # (n, n_embd)
        add_rmsnorm(x, xn, post_attn_norm[layer], rms_eps, ffn_norm[layer], xn)
        project_as(isa, wgu, layer, xn, qbuf, gu, q8k, 2)  # (n, 2 n_ff)
        gelu_mul(isa, gu, n_ff, gelu_table, hid)
        project_as(isa, wdown, layer, hid, qbuf, xn, q8k, 3)  # (n, n_embd)
        if layer + 1 < n_layers:
            add_rmsnorm(x, xn, post_ffn_norm[layer], rms_eps, attn_norm[layer + 1], xn)
        else:
            add_rmsnorm(x, xn, post_ffn_norm[layer], rms_eps, no_norm, xn)

    sel = np.empty((n_out, n_embd), np.float32)
    gather_rows(x, out_rows, sel)
    xn_out = xn_b[:n_out]
    rmsnorm(sel, out_norm, rms_eps, xn_out)
    project_as(isa, head, 0, xn_out, qbuf, logits, q8k, 4)
    if fparams[6] > 0.0:
        _softcap(logits, fparams[6])


class Gemma3Forward:
    """Weights, the two KV pools and scratch of a gemma3 model; NumbaModelRunner delegates
    its forward step here.  num_swa_blocks: blocks of the local (sliding-window) pool."""

    def __init__(self, weights: Gemma3Weights, config: ModelConfig, isa, isa_name: str, *,
                 num_blocks: int, num_swa_blocks: int, block_size: int, threads: int,
                 max_tokens: int) -> None:
        c = config
        self.config = c
        self.isa = isa
        self.threads = threads
        self.block_size = block_size
        self.weights = weights
        swa = [bool(s) and c.sliding_window > 0 for s in c.swa_layers]
        self.is_swa = np.array(swa, np.bool_)
        self.pool_index = np.zeros(c.n_layers, np.int64)
        counts = [0, 0]  # global, local
        for layer, local in enumerate(swa):
            self.pool_index[layer] = counts[local]
            counts[local] += 1

        def pools(n_layers: int, n_blocks: int) -> tuple[np.ndarray, np.ndarray]:
            kv, hd, bs = c.n_kv_heads, c.head_dim, block_size
            if isa_name == "generic":
                k_shape = v_shape = (n_layers, n_blocks, bs, kv, hd)
            else:  # the avx512 attention keeps K transposed within each block
                k_shape = (n_layers, n_blocks, kv, hd, bs)
                v_shape = (n_layers, n_blocks, kv, bs, hd)
            return kv_zeros(k_shape), kv_zeros(v_shape)

        self.k_global, self.v_global = pools(counts[0], num_blocks if counts[0] else 0)
        self.k_local, self.v_local = pools(counts[1], num_swa_blocks if counts[1] else 0)
        self.max_ctx = num_blocks * block_size
        self.dims = (c.n_layers, c.n_embd, c.n_heads, c.n_kv_heads, c.head_dim, c.n_ff,
                     c.rope_dim, block_size, c.sliding_window)
        scale = c.attn_scale or 1.0 / math.sqrt(c.head_dim)
        self.fparams = np.array([c.rms_eps, c.rope_base, c.rope_base_swa, c.rope_freq_scale,
                                 scale, math.sqrt(c.n_embd), c.final_logit_softcap], np.float64)
        # ggml's sqrtf(n_embd) and the f32 casts happen inside the step
        self.gelu_table = gelu_f16_table()
        self.capacity = 0
        self.bufs: tuple = ()
        self.ensure_capacity(max_tokens)

    def ensure_capacity(self, n_tokens: int) -> None:
        if n_tokens > self.capacity:
            self.bufs = make_buffers(self.config, n_tokens, self.threads, self.max_ctx)
            self.capacity = n_tokens

    def step_args(self, tokens, positions, token_seq, tables, slots, swa_tables, swa_slots,
                  rows, logits) -> tuple:
        """gemma3_step's arguments for a batch (the runner calls the step with them)."""
        self.ensure_capacity(tokens.shape[0])
        w = self.weights
        b = w.base
        return (self.isa, tokens, positions, token_seq, tables, slots, swa_tables,
                swa_slots, rows, self.dims, self.fparams, self.is_swa, self.pool_index,
                self.gelu_table, b.q8k, b.embd, b.head, b.out_norm, b.attn_norm, b.ffn_norm,
                b.wqkv, b.wo, b.wgu, b.wdown, w.q_norm, w.k_norm, w.post_attn_norm,
                w.post_ffn_norm, self.k_global, self.v_global, self.k_local,
                self.v_local, self.bufs, logits)

    def close(self) -> None:
        self.weights = None  # type: ignore[assignment]
        self.k_global = self.v_global = self.k_local = self.v_local = np.zeros(0, np.uint16)
