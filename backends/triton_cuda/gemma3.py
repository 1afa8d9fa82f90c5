"""The gemma3 architecture as one step of Triton kernels (the Numba backend's gemma3.py wiring).

    x = embed(tokens) * sqrt(n_embd);  xn = rmsnorm(x)
    per layer:  q, k, v = Wqkv · xn;  q, k = rope(rmsnorm_per_head(q, k); local or global base)
                store k, v in the layer's pool (local layers: the sliding-window pool)
                x += rmsnorm_post(Wo · attention(q; window on local layers));  xn = rmsnorm(x)
                x += rmsnorm_post(Wdown · (gelu(Wgate · xn) * Wup · xn));     xn = rmsnorm(x)
    logits = softcap(Whead · xn[logits_rows])

The GGUF norm weights already include gemma's "+1", so they are used as stored.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .attention import attend, kv_store
from .elementwise import ACT_GELU_TANH, act_mul, add_rmsnorm, rope, softcap_
from .linear import embed, project

if TYPE_CHECKING:
    import torch

    from localinfer.model_config import ModelConfig

    from .step import Pools, Scratch, StepInputs
    from .weights import TritonWeights


def gemma3_step(w: TritonWeights, c: ModelConfig, inp: StepInputs, pools: Pools,
                s: Scratch) -> torch.Tensor:
    n = inp.tokens.shape[0]
    x, xn, qkv, att, gu, hid = s.views(n)
    k_col, v_col = c.n_heads * c.head_dim, (c.n_heads + c.n_kv_heads) * c.head_dim
    scale = c.attn_scale or 1.0 / math.sqrt(c.head_dim)
    e = w.extra
    split = s.split_for(inp.plan, n)
    embed(inp.tokens, w.embd, x, scale=math.sqrt(c.n_embd))
    add_rmsnorm(x, None, w.attn_norm[0], xn, c.rms_eps)
    for layer in range(c.n_layers):
        local = pools.is_local[layer]
        k_pool, v_pool = pools.k[layer], pools.v[layer]
        tables, slots = (inp.swa_tables, inp.swa_slots) if local else (inp.tables, inp.slots)
        freqs, fscale = (pools.freqs_local, 1.0) if local else (pools.freqs, c.rope_freq_scale)
        project(xn, w.wqkv[layer], qkv)
        rope(qkv, 0, c.n_heads, c.head_dim, c.rope_dim, inp.positions, freqs, True, fscale,
             norm=e["attn_q_norm"][layer], eps=c.rms_eps)
        rope(qkv, k_col, c.n_kv_heads, c.head_dim, c.rope_dim, inp.positions, freqs, True,
             fscale, norm=e["attn_k_norm"][layer], eps=c.rms_eps)
        kv_store(qkv, slots, k_pool, v_pool, k_col, v_col)
        attend(qkv, k_pool, v_pool, tables, inp.positions, inp.plan, att, c.n_heads, scale,
               window=c.sliding_window if local else 0, scratch=split)
        project(att, w.wo[layer], xn)
        add_rmsnorm(x, xn, w.ffn_norm[layer], xn, c.rms_eps, post=e["post_attention_norm"][layer])
        project(xn, w.wgu[layer], gu)
        act_mul(gu, c.n_ff, hid, ACT_GELU_TANH)
        project(hid, w.wdown[layer], xn)
        last = layer + 1 == c.n_layers
        add_rmsnorm(x, xn, w.out_norm if last else w.attn_norm[layer + 1], xn, c.rms_eps,
                    post=e["post_ffw_norm"][layer])
    logits = s.logits(inp.rows.shape[0])
    project(xn.index_select(0, inp.rows), w.head, logits)
    softcap_(logits, c.final_logit_softcap)
    return logits
