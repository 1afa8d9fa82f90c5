"""Per-head RMSNorm of Q and K (gemma3's q_norm / k_norm) and the Q scale before attention;
qk_norm_rope fuses both with the NEOX RoPE between them, split over threads by token."""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .elementwise import PARALLEL_ROWS, rms_scale, rms_scale4, scale_row


@njit(cache=True, nogil=True)
def head_rmsnorm(x, col0, n_heads, head_dim, weight, eps):
    """In place: each head of x[:, col0 : col0 + n_heads head_dim] /= its rms, * weight
    (head_dim,).  Sums squares in double, as ggml's rms_norm."""
    for i in range(x.shape[0]):
        for h in range(n_heads):
            c = col0 + h * head_dim
            total = 0.0
            for j in range(head_dim):
                v = x[i, c + j]
                total += v * v
            mean = np.float32(total / head_dim)
            scale = np.float32(1.0) / np.float32(math.sqrt(mean + eps))
            for j in range(head_dim):
                x[i, c + j] = (x[i, c + j] * scale) * weight[j]


@njit(cache=True, nogil=True)
def scale_columns(x, n_cols, s):
    """In place: x[:, :n_cols] *= s."""
    for i in range(x.shape[0]):
        for j in range(n_cols):
            x[i, j] *= s


@njit(nogil=True)
def _rope_head(head, rope_dim, cos_r, sin_r):
    """NEOX rotation of one head's first rope_dim dims (as elementwise.rope_neox)."""
    half = rope_dim // 2
    for k in range(half):
        x0 = head[k]
        x1 = head[k + half]
        cs = cos_r[k]
        sn = sin_r[k]
        head[k] = x0 * cs - x1 * sn
        head[k + half] = x0 * sn + x1 * cs


@njit(nogil=True)
def _norm_rope_heads(row, col0, n_heads, head_dim, weight, eps, rope_dim, cos_r, sin_r):
    """One token's heads at row[col0:]: RMSNorm each (as head_rmsnorm; four heads' sums of
    squares side by side), then rotate it while it is in L1."""
    h = 0
    while h < n_heads:
        c = col0 + h * head_dim
        if h + 4 <= n_heads:
            s = rms_scale4(row[c:c + head_dim], row[c + head_dim:c + 2 * head_dim],
                           row[c + 2 * head_dim:c + 3 * head_dim],
                           row[c + 3 * head_dim:c + 4 * head_dim], eps)
            for r in range(4):
                head = row[c + r * head_dim:c + (r + 1) * head_dim]
                scale_row(head, s[r], weight, head)
                _rope_head(head, rope_dim, cos_r, sin_r)
            h += 4
        else:
            head = row[c:c + head_dim]
            scale_row(head, rms_scale(head, eps), weight, head)
            _rope_head(head, rope_dim, cos_r, sin_r)
            h += 1


@njit(nogil=True)
def _qk_row(row, n_heads, n_kv, head_dim, q_weight, k_weight, eps, rope_dim, cos_r, sin_r,
            q_scale):
    _norm_rope_heads(row, 0, n_heads, head_dim, q_weight, eps, rope_dim, cos_r, sin_r)
    _norm_rope_heads(row, n_heads * head_dim, n_kv, head_dim, k_weight, eps, rope_dim, cos_r,
                     sin_r)
    for j in range(n_heads * head_dim):
        row[j] *= q_scale


@njit(cache=True, nogil=True, parallel=True)
def qk_norm_rope(qkv, n_heads, n_kv, head_dim, q_weight, k_weight, eps, rope_dim, cos_t, sin_t,
                 q_scale):
    """In place on the Q and K columns of qkv (n_tokens, (n_heads + 2 n_kv) head_dim):
    head_rmsnorm, rope_neox and Q *= q_scale (scale_columns), token by token in one pass;
    every value computed by the same operations as those three kernels in turn."""
    n = qkv.shape[0]
    if n < PARALLEL_ROWS:
        for i in range(n):
            _qk_row(qkv[i], n_heads, n_kv, head_dim, q_weight, k_weight, eps, rope_dim,
                    cos_t[i], sin_t[i], q_scale)
    else:
        for i in prange(n):
            _qk_row(qkv[i], n_heads, n_kv, head_dim, q_weight, k_weight, eps, rope_dim,
                    cos_t[i], sin_t[i], q_scale)
