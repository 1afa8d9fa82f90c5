"""Per-token small steps: RMSNorm, RoPE (llama.cpp's "normal" adjacent-pair form), SwiGLU,
embedding lookup.  Each row is computed on its own, in the same order ggml uses where it
matters for closeness (RMSNorm sums squares in double; RoPE angles by repeated f32 products).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

PARALLEL_ROWS = 8  # below this many rows a parallel region costs more than it saves
GROUP = 4  # rows normed together: their sums of squares run as independent add chains


@njit(nogil=True)
def _inv_rms(total, dim, eps):
    mean = np.float32(total / dim)
    return np.float32(1.0) / np.float32(math.sqrt(mean + eps))


@njit(nogil=True)
def rms_scale(row, eps):
    """1 / rms(row) in f32, the sum of squares in double like ggml_float."""
    total = 0.0
    for j in range(row.shape[0]):
        v = row[j]
        total += v * v
    return _inv_rms(total, row.shape[0], eps)


@njit(nogil=True)
def rms_scale4(a, b, c, d, eps):
    """rms_scale of four rows at once.  Each row's sum is a serial chain of double adds (its
    order fixes the result), latency-bound on its own; four chains side by side keep the adder
    busy and give each row exactly rms_scale's value."""
    t0 = 0.0
    t1 = 0.0
    t2 = 0.0
    t3 = 0.0
    for j in range(a.shape[0]):
        v0 = a[j]
        v1 = b[j]
        v2 = c[j]
        v3 = d[j]
        t0 += v0 * v0
        t1 += v1 * v1
        t2 += v2 * v2
        t3 += v3 * v3
    n = a.shape[0]
    return _inv_rms(t0, n, eps), _inv_rms(t1, n, eps), _inv_rms(t2, n, eps), _inv_rms(t3, n, eps)


@njit(nogil=True)
def scale_row(row, scale, weight, out):
    """out = (row * scale) * weight, element by element (out may be row)."""
    for j in range(row.shape[0]):
        out[j] = (row[j] * scale) * weight[j]


@njit(nogil=True)
def _rmsnorm_group(x, i0, weight, eps, out):
    """Rows i0 .. i0 + GROUP - 1 of rmsnorm (fewer at the end of the batch)."""
    if i0 + GROUP <= x.shape[0]:
        s = rms_scale4(x[i0], x[i0 + 1], x[i0 + 2], x[i0 + 3], eps)
        for r in range(GROUP):
            scale_row(x[i0 + r], s[r], weight, out[i0 + r])
    else:
        for i in range(i0, x.shape[0]):
            scale_row(x[i], rms_scale(x[i], eps), weight, out[i])


@njit(cache=True, nogil=True, parallel=True)
def rmsnorm(x, weight, eps, out):
    """x (n_tokens, dim) -> out (n_tokens, dim) = x / rms(x) * weight (out may be x)."""
    n_groups = (x.shape[0] + GROUP - 1) // GROUP
    if x.shape[0] < PARALLEL_ROWS:
        for g in range(n_groups):
            _rmsnorm_group(x, g * GROUP, weight, eps, out)
    else:
        for g in prange(n_groups):
            _rmsnorm_group(x, g * GROUP, weight, eps, out)


@njit(nogil=True)
def _add_normed(x, y, scale, weight):
    for j in range(x.shape[0]):
        x[j] += (y[j] * scale) * weight[j]


@njit(nogil=True)
def _add_rmsnorm_group(x, y, i0, weight, eps, next_weight, out):
    """Rows i0 .. i0 + GROUP - 1 of add_rmsnorm (fewer at the end of the batch)."""
    norm_next = next_weight.shape[0] > 0
    if i0 + GROUP <= x.shape[0]:
        s = rms_scale4(y[i0], y[i0 + 1], y[i0 + 2], y[i0 + 3], eps)
        for r in range(GROUP):
            _add_normed(x[i0 + r], y[i0 + r], s[r], weight)
        if norm_next:
            s = rms_scale4(x[i0], x[i0 + 1], x[i0 + 2], x[i0 + 3], eps)
            for r in range(GROUP):
                scale_row(x[i0 + r], s[r], next_weight, out[i0 + r])
    else:
        for i in range(i0, x.shape[0]):
            _add_normed(x[i], y[i], rms_scale(y[i], eps), weight)
            if norm_next:
                scale_row(x[i], rms_scale(x[i], eps), next_weight, out[i])


@njit(cache=True, nogil=True, parallel=True)
def add_rmsnorm(x, y, weight, eps, next_weight, out):
    """x += rmsnorm(y) * weight, then out = rmsnorm(x) * next_weight (when next_weight has
    any elements), row by row: gemma3's post-norm, residual add and the next pre-norm in one
    pass, each value computed as rmsnorm + add_inplace + rmsnorm compute it.  out may be y;
    without a next norm it is left alone."""
    n_groups = (x.shape[0] + GROUP - 1) // GROUP
    if x.shape[0] < PARALLEL_ROWS:
        for g in range(n_groups):
            _add_rmsnorm_group(x, y, g * GROUP, weight, eps, next_weight, out)
    else:
        for g in prange(n_groups):
            _add_rmsnorm_group(x, y, g * GROUP, weight, eps, next_weight, out)


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


@njit(cache=True, nogil=True)
def gather_rows(src, rows, out):
    """out[r] = src[rows[r]] for each r, element by element: a row assignment (out[r] = ...)
    type-checks its shapes at run time, and the error message's formatting alone compiled for
    ~4 s of a cold start (Numba's raise-with-shape and string machinery)."""
    for r in range(rows.shape[0]):
        i = rows[r]
        for c in range(out.shape[1]):
            out[r, c] = src[i, c]
