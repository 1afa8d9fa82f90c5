"""Per-head RMSNorm of Q and K (gemma3's q_norm / k_norm) and the Q scale before attention."""

from __future__ import annotations

import math

import numpy as np
from numba import njit


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
