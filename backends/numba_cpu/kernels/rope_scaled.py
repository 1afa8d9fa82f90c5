"""RoPE angle tables with linear position scaling (ggml's freq_scale, no YaRN)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def rope_tables_scaled(positions, rope_dim, base, freq_scale, cos_t, sin_t):
    """As elementwise.rope_tables, with every angle multiplied by freq_scale in f32 after it
    is built (ggml's rope_yarn with ext_factor 0); freq_scale 1 gives the same tables."""
    theta_scale = np.float32(base ** (-2.0 / rope_dim))
    fs = np.float32(freq_scale)
    for i in range(positions.shape[0]):
        theta = np.float32(positions[i])
        for k in range(rope_dim // 2):
            t = np.float32(fs * theta)
            cos_t[i, k] = math.cos(t)
            sin_t[i, k] = math.sin(t)
            theta = np.float32(theta * theta_scale)
