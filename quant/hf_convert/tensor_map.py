"""Hugging Face tensor names -> GGUF names for the llama family and Gemma 3, and the Q/K row
permutation llama.cpp's converter applies to llama (HF stores the rotary pairs as two halves of
each head; ggml's normal rope rotates adjacent pairs, so rows are interleaved; qwen2 uses NEOX
rope and keeps HF order)."""

from __future__ import annotations

import re

import numpy as np

_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight",
           "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
_PER_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
# Gemma 3: a norm after attention and around the FFN, and RMS norms on Q and K
_GEMMA3_LAYER = {**_PER_LAYER,
                 "post_attention_layernorm.weight": "post_attention_norm.weight",
                 "pre_feedforward_layernorm.weight": "ffn_norm.weight",
                 "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
                 "self_attn.q_norm.weight": "attn_q_norm.weight",
                 "self_attn.k_norm.weight": "attn_k_norm.weight"}
IGNORED = re.compile(r".*\.rotary_emb\.inv_freq$")


def gguf_name(hf: str, arch: str = "llama") -> str | None:
    if hf in _GLOBAL:
        return _GLOBAL[hf]
    per_layer = _GEMMA3_LAYER if arch == "gemma3" else _PER_LAYER
    m = _LAYER.fullmatch(hf)
    if m and m.group(2) in per_layer:
        return f"blk.{m.group(1)}.{per_layer[m.group(2)]}"
    return None


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF half-split rotary rows -> llama.cpp's interleaved rows, per head."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of permute_qk (GGUF rows back to HF order)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)
