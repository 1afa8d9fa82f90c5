"""Per-token small steps: RMSNorm, RoPE (llama.cpp's "normal" adjacent-pair form), SwiGLU,
embedding lookup.  Each row is computed on its own, in the same order ggml uses where it
matters for closeness (RMSNorm sums squares in double; RoPE angles by repeated f32 products).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def rmsnorm(x, weight, eps, out):
    """x (n_tokens, dim) -> out (n_tokens, dim) = x / rms(x) * weight."""
    n_tokens, dim = x.shape
    for i in range(n_tokens):
        total = 0.0  # float64, like ggml_float
        for j in range(dim):
            v = x[i, j]
            total += v * v
        mean = np.float32(total / dim)
        scale = np.float32(1.0) / np.float32(math.sqrt(mean + eps))
        for j in range(dim):
            out[i, j] = (x[i, j] * scale) * weight[j]


@njit(cache=True, nogil=True)
def rope_tables(positions, rope_dim, base, cos_t, sin_t):
    """positions (n_tokens,) -> cos_t, sin_t (n_tokens, rope_dim // 2) f32.

    Pair k rotates by p * base**(-2k / rope_dim), the angle built by repeated multiplication in
    f32 as ggml's rope cache does, so angles (and the logits) track llama.cpp closely."""
    theta_scale = np.float32(base ** (-2.0 / rope_dim))
    for i in range(positions.shape[0]):
        theta = np.float32(positions[i])
        for k in range(rope_dim // 2):
            cos_t[i, k] = math.cos(theta)
            sin_t[i, k] = math.sin(theta)
            theta = np.float32(theta * theta_scale)


@njit(cache=True, nogil=True)
def rope_inplace(x, col0, n_heads, head_dim, rope_dim, cos_t, sin_t):
    """Rotate heads stored at x[:, col0 : col0 + n_heads * head_dim], (n_tokens, n_heads, head_dim).

    llama's GGUF Q/K rows were permuted by the converter so that the pairs are adjacent:
    (x[2k], x[2k+1]) rotates by angle k (ggml's GGML_ROPE_TYPE_NORMAL)."""
    for i in range(x.shape[0]):
        for h in range(n_heads):
            c = col0 + h * head_dim
            for k in range(rope_dim // 2):
                x0 = x[i, c + 2 * k]
                x1 = x[i, c + 2 * k + 1]
                cs = cos_t[i, k]
                sn = sin_t[i, k]
                x[i, c + 2 * k] = x0 * cs - x1 * sn
                x[i, c + 2 * k + 1] = x0 * sn + x1 * cs


@njit(cache=True, nogil=True)
def rope_neox(x, col0, n_heads, head_dim, rope_dim, cos_t, sin_t):
    """As rope_inplace, but pairs (x[k], x[k + rope_dim / 2]) rotate by angle k (ggml's
    GGML_ROPE_TYPE_NEOX, used by qwen2, whose Q/K rows the converter leaves unpermuted)."""
    half = rope_dim // 2
    for i in range(x.shape[0]):
        for h in range(n_heads):
            c = col0 + h * head_dim
            for k in range(half):
                x0 = x[i, c + k]
                x1 = x[i, c + k + half]
                cs = cos_t[i, k]
                sn = sin_t[i, k]
                x[i, c + k] = x0 * cs - x1 * sn
                x[i, c + k + half] = x0 * sn + x1 * cs


@njit(cache=True, nogil=True)
def add_bias(x, b):
    """x (n_tokens, dim) += b (dim,) on every row."""
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            x[i, j] += b[j]


@njit(cache=True, nogil=True)
def swiglu(gate_up, n_ff, out):
    """gate_up (n_tokens, 2 * n_ff) = [gate | up] -> out (n_tokens, n_ff) = silu(gate) * up."""
    for i in range(gate_up.shape[0]):
        for j in range(n_ff):
            g = gate_up[i, j]
            out[i, j] = g / (np.float32(1.0) + np.exp(-g)) * gate_up[i, n_ff + j]


@njit(cache=True, nogil=True)
def add_inplace(x, y):
    """x += y, both (n_tokens, dim)."""
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            x[i, j] += y[i, j]
