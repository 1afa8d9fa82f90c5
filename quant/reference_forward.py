"""A plain numpy float32 forward pass of the llama family (llama, qwen2) with a hook on the
input of every weight matrix — what `localinfer imatrix` needs.

Why not the engine: the Numba step is one jitted function over all layers with int8 activation
codes inside the matmuls; instrumenting it would slow or complicate the hot path for a rare
tool. Here every weight is dequantized to float32 (like llama.cpp's imatrix tool sees float
activations entering ggml_mul_mat), and all chunks advance one layer at a time, so each layer's
weights are dequantized once and only one layer is in memory in float32.

    x = embd[tokens]                                      # (n_chunks, n_ctx, n_embd)
    per layer:  h = rmsnorm(x)        -> hook attn_q/attn_k/attn_v
                a = attention(rope(h Wq + bq), rope(h Wk + bk), h Wv + bv)
                                      -> hook attn_output
                x += a Wo
                h = rmsnorm(x)        -> hook ffn_gate/ffn_up
                s = silu(h Wg) * (h Wu)  -> hook ffn_down
                x += s Wd
    logits = rmsnorm(x) Whead
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from localinfer.errors import UnsupportedModelError
from localinfer.gguf_file import GGUFFile
from localinfer.model_config import ModelConfig

from .formats import format_for

Hook = Callable[[list[str], np.ndarray], None]  # (weight names, (n_rows, n_cols) input)
FAMILIES = ("llama", "qwen2")


def dequantize(g: GGUFFile, name: str) -> np.ndarray:
    """A tensor as float32 (rows, ne0) — for a weight matrix, (out features, in features)."""
    info = g.tensors[name]
    arr = g.array(name)
    block = arr.reshape(-1, arr.shape[-1])
    if info.ggml_type == 0:
        return np.asarray(block, np.float32)
    if info.ggml_type == 1:
        return block.astype(np.float32)
    if info.ggml_type == 30:
        return (block.astype(np.uint32) << 16).view(np.float32)
    return format_for(info.ggml_type).dequantize(block, info.shape[0])


def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return (x / np.sqrt(ms + np.float32(eps))).astype(np.float32) * w


def _rope(x: np.ndarray, rope_dim: int, base: float, neox: bool) -> np.ndarray:
    """x (chunks, T, heads, head_dim), positions 0..T-1 (ggml's normal or NEOX pairing)."""
    t = x.shape[1]
    half = rope_dim // 2
    inv = base ** (-np.arange(half, dtype=np.float64) * 2 / rope_dim)
    ang = np.arange(t, dtype=np.float64)[:, None] * inv[None, :]  # (T, half)
    cos = np.cos(ang).astype(np.float32)[None, :, None, :]
    sin = np.sin(ang).astype(np.float32)[None, :, None, :]
    out = x.copy()
    if neox:
        a, b = x[..., :half], x[..., half:rope_dim]
        out[..., :half] = a * cos - b * sin
        out[..., half:rope_dim] = a * sin + b * cos
    else:
        a, b = x[..., 0:rope_dim:2], x[..., 1:rope_dim:2]
        out[..., 0:rope_dim:2] = a * cos - b * sin
        out[..., 1:rope_dim:2] = a * sin + b * cos
    return out


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Causal attention; q (C, T, H, D), k/v (C, T, KV, D) -> (C, T, H * D)."""
    c, t, h, d = q.shape
    group = h // k.shape[2]
    k = np.repeat(k, group, axis=2)
    v = np.repeat(v, group, axis=2)
    out = np.empty_like(q)
    mask = np.triu(np.full((t, t), -np.inf, np.float32), 1)
    scale = np.float32(1.0 / np.sqrt(d))
    for i in range(c):
        s = np.einsum("thd,uhd->htu", q[i], k[i]) * scale + mask  # (H, T, T)
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        out[i] = np.einsum("htu,uhd->thd", s, v[i])
    return out.reshape(c, t, h * d)


def forward(g: GGUFFile, tokens: np.ndarray, hook: Hook | None = None,
            want_logits: bool = False) -> np.ndarray | None:
    """Run chunks of tokens (n_chunks, n_ctx), each from position 0; optional logits."""
    cfg = ModelConfig.from_gguf(g, strict_arch=False)
    if cfg.arch not in FAMILIES:
        raise UnsupportedModelError(f"{g.path}: the reference forward pass (imatrix) supports "
                                    f"{', '.join(FAMILIES)}, not {cfg.arch!r}")
    cfg.check_tensors(g)
    neox = cfg.rope_neox
    c, t = tokens.shape
    hd = cfg.head_dim
    x = dequantize(g, "token_embd.weight")[tokens]  # (C, T, E)
    eps = cfg.rms_eps
    for layer in range(cfg.n_layers):
        p = f"blk.{layer}."

        def w(name: str, p: str = p) -> np.ndarray:
            return dequantize(g, p + name)

        h = _rmsnorm(x, w("attn_norm.weight")[0], eps)
        flat = h.reshape(c * t, -1)
        if hook:
            hook([p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"], flat)
        q, k, v = (flat @ w(f"attn_{n}.weight").T for n in "qkv")
        if cfg.qkv_bias:
            q, k, v = (m + w(f"attn_{n}.bias")[0] for m, n in zip((q, k, v), "qkv", strict=True))
        q = _rope(q.reshape(c, t, cfg.n_heads, hd), cfg.rope_dim, cfg.rope_base, neox)
        k = _rope(k.reshape(c, t, cfg.n_kv_heads, hd), cfg.rope_dim, cfg.rope_base, neox)
        a = _attention(q, k, v.reshape(c, t, cfg.n_kv_heads, hd)).reshape(c * t, -1)
        if hook:
            hook([p + "attn_output.weight"], a)
        x = x + (a @ w("attn_output.weight").T).reshape(c, t, -1)
        h = _rmsnorm(x, w("ffn_norm.weight")[0], eps).reshape(c * t, -1)
        if hook:
            hook([p + "ffn_gate.weight", p + "ffn_up.weight"], h)
        gate = h @ w("ffn_gate.weight").T
        s = gate / (np.float32(1) + np.exp(-gate)) * (h @ w("ffn_up.weight").T)
        if hook:
            hook([p + "ffn_down.weight"], s)
        x = x + (s @ w("ffn_down.weight").T).reshape(c, t, -1)
    if not want_logits:
        return None
    head = "token_embd.weight" if cfg.tied_embeddings else "output.weight"
    return _rmsnorm(x, dequantize(g, "output_norm.weight")[0], eps) @ dequantize(g, head).T
