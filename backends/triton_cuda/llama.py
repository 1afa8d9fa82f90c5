"""The llama architecture (qwen2 = llama + Q/K/V biases + NEOX rope) as one step of Triton
kernels; the same wiring as the Numba backend's llama.py.

    x = embed(tokens);  xn = rmsnorm(x)                           # (n_tokens, n_embd)
    per layer:  qkv = Wqkv · xn + bqkv;  rope(q, k);  store k, v at the slots
                x += Wo · attention(q, pool);  xn = rmsnorm(x)     (one add_rmsnorm)
                x += Wdown · swiglu(Wgu · xn);  xn = rmsnorm(x)    (the next layer's norm,
                                                                     after the last the output's)
    logits = Whead · xn[logits_rows]                               # (n_logits, n_vocab)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .attention import attend, kv_store
from .elementwise import ACT_SILU, act_mul, add_rmsnorm, rope
from .linear import embed, project

if TYPE_CHECKING:
    import torch

    from localinfer.model_config import ModelConfig

    from .step import Pools, Scratch, StepInputs
    from .weights import TritonWeights


def llama_step(w: TritonWeights, c: ModelConfig, inp: StepInputs, pools: Pools,
               s: Scratch) -> torch.Tensor:
    n = inp.tokens.shape[0]
    x, xn, qkv, att, gu, hid = s.views(n)
    k_col, v_col = c.n_heads * c.head_dim, (c.n_heads + c.n_kv_heads) * c.head_dim
    scale = 1.0 / math.sqrt(c.head_dim)
    split = s.split_for(inp.plan, n)
    embed(inp.tokens, w.embd, x)
    add_rmsnorm(x, None, w.attn_norm[0], xn, c.rms_eps)
    for layer in range(c.n_layers):
        k_pool, v_pool = pools.k[layer], pools.v[layer]
        project(xn, w.wqkv[layer], qkv, w.bqkv[layer])
        rope(qkv, 0, c.n_heads, c.head_dim, c.rope_dim, inp.positions, pools.freqs,
             c.rope_neox)
        rope(qkv, k_col, c.n_kv_heads, c.head_dim, c.rope_dim, inp.positions, pools.freqs,
             c.rope_neox)
        kv_store(qkv, inp.slots, k_pool, v_pool, k_col, v_col)
        attend(qkv, k_pool, v_pool, inp.tables, inp.positions, inp.plan, att, c.n_heads,
               scale, scratch=split)
        project(att, w.wo[layer], xn)
        add_rmsnorm(x, xn, w.ffn_norm[layer], xn, c.rms_eps)
        project(xn, w.wgu[layer], gu)
        act_mul(gu, c.n_ff, hid, ACT_SILU)
        project(hid, w.wdown[layer], xn)
        last = layer + 1 == c.n_layers
        add_rmsnorm(x, xn, w.out_norm if last else w.attn_norm[layer + 1], xn, c.rms_eps)
    logits = s.logits(inp.rows.shape[0])
    project(xn.index_select(0, inp.rows), w.head, logits)
    return logits
