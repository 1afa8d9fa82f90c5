"""Kernel selection by ISA at compile time: project / embed / attend / silu_mul are overloaded on
the IsaType the step receives (isa.py), so llama.py wires one forward pass for every path.

Weight stacks differ per path (weights.py): the generic path reads WeightStack 7-tuples
(quants/packed.py layouts), the vector paths TileStack 6-tuples (quants/tiles.py layout, which
the 8-lane paths read as two 8-row halves per tile) and the same transposed KV layout.  A
TileStack's kind is in its type (tile_kind.py), so a role compiles only its own kernel.  The
vector kernels exist once each (kernels/*_simd.py, matmul_tiles.py) and take the IsaType
first: its lane count sets their width and, for the byte dot products, its name and vnni flag
the instruction (simd/dot.py: vpdpbusd zmm / ymm, the vpmaddubsw pair, or SDOT on neon).
"""

from __future__ import annotations

from numba.extending import overload

from .isa import IsaType
from .kernels.attention import attention, write_kv
from .kernels.attention_simd import attention_simd, write_kv_simd
from .kernels.elementwise import swiglu
from .kernels.elementwise_simd import quantize_rows_simd, swiglu_simd
from .kernels.embed_tiles import embed_tiles
from .kernels.matmul import matmul_f32
from .kernels.matmul_tiles import matmul_tiles
from .linear import embed_rows, linear
from .quants.packed import KIND_F32
from .tile_kind import stack_kind


def project(isa, ws, layer, x, qbuf, out):
    """out (n_tokens, rows) = x (n_tokens, cols) @ W[layer].T."""


def embed(isa, ws, tokens, out):
    """out (n_tokens, cols) = rows `tokens` of W[0], dequantized."""


def attend(isa, qkv, n_heads, n_kv, head_dim, positions, token_seq, block_tables, block_size,
           slot_mapping, k_pool, v_pool, scale, scratch, out, window):
    """Store this step's K/V (columns of qkv) into the pool, then causal GQA attention.
    scratch: (threads, rows, 3 head_dim + 4 + max_ctx) f32 per-thread memory, rows >= group
    (llama.make_buffers).
    window: 0, or the sliding window (keys a query sees, its own included)."""


def silu_mul(isa, gate_up, n_ff, out):
    """out (n_tokens, n_ff) = silu(gate) * up of gate_up (n_tokens, 2 n_ff) = [gate | up]."""


@overload(silu_mul, jit_options={"nogil": True})
def _silu_mul(isa, gate_up, n_ff, out):
    if not isinstance(isa, IsaType):
        return None
    if isa.isa == "generic":
        def generic(isa, gate_up, n_ff, out):
            swiglu(gate_up, n_ff, out)
        return generic

    def vector(isa, gate_up, n_ff, out):
        swiglu_simd(isa, gate_up, n_ff, out)
    return vector


@overload(project, jit_options={"nogil": True})
def _project(isa, ws, layer, x, qbuf, out):
    if not isinstance(isa, IsaType):
        return None
    if isa.isa == "generic":
        def generic(isa, ws, layer, x, qbuf, out):
            linear(ws, layer, x, qbuf, out)
        return generic

    if stack_kind(ws) == KIND_F32:  # known while typing (tile_kind.py): one kernel per kind
        def floats(isa, ws, layer, x, qbuf, out):
            matmul_f32(ws[5][layer], x, out)
        return floats

    def tiled(isa, ws, layer, x, qbuf, out):
        kind, zero, w, d, m, wf = ws
        n_tokens, cols = x.shape
        nb = cols // 32
        xq = qbuf[0][:n_tokens]
        xd = qbuf[1][:n_tokens, :nb]
        xi = qbuf[2][:n_tokens, :nb]
        xs = qbuf[3][:n_tokens, :nb]
        quantize_rows_simd(isa, x, xq[:, :cols], xd, xi, xs)
        matmul_tiles(isa, kind, zero[layer], w[layer], d[layer], m[layer], xq, xd, xi, xs, out)
    return tiled


@overload(embed, jit_options={"nogil": True})
def _embed(isa, ws, tokens, out):
    if not isinstance(isa, IsaType):
        return None
    if isa.isa == "generic":
        def generic(isa, ws, tokens, out):
            embed_rows(ws, tokens, out)
        return generic

    if stack_kind(ws) == KIND_F32:
        def floats(isa, ws, tokens, out):
            for i in range(tokens.shape[0]):
                out[i, :] = ws[5][0, tokens[i]]
        return floats

    def tiled(isa, ws, tokens, out):
        kind, zero, w, d, m, wf = ws
        embed_tiles(kind, zero[0], w[0], d[0], m[0], tokens, out)
    return tiled


@overload(attend, jit_options={"nogil": True})
def _attend(isa, qkv, n_heads, n_kv, head_dim, positions, token_seq, block_tables, block_size,
            slot_mapping, k_pool, v_pool, scale, scratch, out, window):
    if not isinstance(isa, IsaType):
        return None
    if isa.isa == "generic":
        def generic(isa, qkv, n_heads, n_kv, head_dim, positions, token_seq, block_tables,
                    block_size, slot_mapping, k_pool, v_pool, scale, scratch, out, window):
            k_col = n_heads * head_dim
            write_kv(qkv, k_col, k_col + n_kv * head_dim, n_kv, head_dim, slot_mapping,
                     block_size, k_pool, v_pool)
            attention(qkv, n_heads, n_kv, head_dim, positions, token_seq, block_tables,
                      block_size, k_pool, v_pool, scale, out, window)
        return generic

    def vector(isa, qkv, n_heads, n_kv, head_dim, positions, token_seq, block_tables,
               block_size, slot_mapping, k_pool, v_pool, scale, scratch, out, window):
        write_kv_simd(isa, qkv, n_heads, n_kv, head_dim, slot_mapping, block_size, k_pool,
                      v_pool)
        attention_simd(isa, qkv, n_heads, n_kv, head_dim, positions, token_seq, block_tables,
                       block_size, k_pool, v_pool, scale, scratch, out, window)
    return vector
