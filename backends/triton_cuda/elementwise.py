"""The small fused ops between the matmuls: RMSNorm with the residual add, RoPE with gemma's
per-head Q/K norms, and the gated activations.  One program per token row; each reads its row
once and writes it once, where the unfused sequence would make a pass per operation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import triton
import triton.language as tl

if TYPE_CHECKING:
    import torch

ACT_SILU = 0
ACT_GELU_TANH = 1


@triton.jit(do_not_specialize=["stride_x", "stride_d", "stride_o"])
def _add_rmsnorm_kernel(x_ptr, d_ptr, pw_ptr, w_ptr, out_ptr, N, eps, stride_x, stride_d,
                        stride_o, HAS_DELTA: tl.constexpr, HAS_POST: tl.constexpr,
                        BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0)
    if HAS_DELTA:
        d = tl.load(d_ptr + row * stride_d + cols, mask=ok, other=0.0)
        if HAS_POST:  # gemma's norm of the block's output before the residual add
            d = d / tl.sqrt(tl.sum(d * d, axis=0) / N + eps) * tl.load(pw_ptr + cols, mask=ok)
        x = x + d
        tl.store(x_ptr + row * stride_x + cols, x, mask=ok)
    y = x / tl.sqrt(tl.sum(x * x, axis=0) / N + eps) * tl.load(w_ptr + cols, mask=ok)
    tl.store(out_ptr + row * stride_o + cols, y, mask=ok)


def add_rmsnorm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                out: torch.Tensor, eps: float, post: torch.Tensor | None = None) -> None:
    """x += delta (normed by `post` first when given), then out = rmsnorm(x) * weight."""
    n_rows, n = x.shape
    if n_rows == 0:
        return
    d = x if delta is None else delta
    _add_rmsnorm_kernel[(n_rows,)](x, d, weight if post is None else post, weight, out, n, eps,
                                   x.stride(0), d.stride(0), out.stride(0),
                                   HAS_DELTA=delta is not None, HAS_POST=post is not None,
                                   BLOCK=triton.next_power_of_2(n))


@triton.jit(do_not_specialize=["stride", "n_heads"])
def _rope_kernel(x_ptr, pos_ptr, inv_freq_ptr, norm_ptr, stride, col0, n_heads, eps,
                 freq_scale, HEAD_DIM: tl.constexpr, ROPE_DIM: tl.constexpr,
                 NEOX: tl.constexpr, HAS_NORM: tl.constexpr, BLOCK_H: tl.constexpr,
                 BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    ok = (h < n_heads) & (d < HEAD_DIM)
    row = x_ptr + t * stride + col0 + h * HEAD_DIM
    half = ROPE_DIM // 2
    if NEOX:  # pairs (i, i + half)
        pair = tl.where(d < half, d + half, d - half)
        fi = d % half
        first = d < half
    else:  # pairs (2i, 2i + 1)
        pair = d ^ 1
        fi = d // 2
        first = (d & 1) == 0
    rotated = d < ROPE_DIM
    x = tl.load(row + d, mask=ok, other=0.0)
    xp = tl.load(row + pair, mask=ok & rotated, other=0.0)
    if HAS_NORM:  # gemma: RMSNorm of each head before the rotation
        r = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / HEAD_DIM + eps)
        x = x * r[:, None] * tl.load(norm_ptr + d, mask=d < HEAD_DIM, other=0.0)
        xp = xp * r[:, None] * tl.load(norm_ptr + pair, mask=rotated, other=0.0)
    theta = tl.load(pos_ptr + t).to(tl.float32) * freq_scale * tl.load(
        inv_freq_ptr + fi, mask=rotated, other=0.0)
    c = tl.cos(theta)
    s = tl.sin(theta)
    y = tl.where(rotated, tl.where(first, x * c - xp * s, x * c + xp * s), x)
    tl.store(row + d, y, mask=ok)


def inv_freq(rope_dim: int, base: float) -> np.ndarray:
    """base^(-2i / rope_dim) for the rope_dim / 2 rotation frequencies."""
    return (base ** (-np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)).astype(np.float32)


def rope(x: torch.Tensor, col0: int, n_heads: int, head_dim: int, rope_dim: int,
         positions: torch.Tensor, freqs: torch.Tensor, neox: bool, freq_scale: float = 1.0,
         norm: torch.Tensor | None = None, eps: float = 0.0) -> None:
    """Rotate, in place, heads [0, n_heads) starting at column col0 of each row of x
    (optionally RMS-normed per head with `norm` first)."""
    n = x.shape[0]
    if n == 0:
        return
    _rope_kernel[(n,)](x, positions, freqs, freqs if norm is None else norm, x.stride(0), col0,
                       n_heads, eps, freq_scale, HEAD_DIM=head_dim, ROPE_DIM=rope_dim,
                       NEOX=neox, HAS_NORM=norm is not None,
                       BLOCK_H=triton.next_power_of_2(n_heads),
                       BLOCK_D=triton.next_power_of_2(head_dim))


@triton.jit(do_not_specialize=["stride_gu", "stride_o"])
def _act_mul_kernel(gu_ptr, out_ptr, n_ff, stride_gu, stride_o, ACT: tl.constexpr,
                    BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_ff
    g = tl.load(gu_ptr + row * stride_gu + cols, mask=ok, other=0.0)
    u = tl.load(gu_ptr + row * stride_gu + n_ff + cols, mask=ok, other=0.0)
    if ACT == 0:  # SiLU
        a = g / (1.0 + tl.exp(-g))
    else:  # GELU, tanh approximation; tanh(y) = 1 - 2 / (exp(2y) + 1), |y| <= 15 (tanh = ±1
        # in f32 there) so exp never overflows
        y = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        y = tl.minimum(tl.maximum(y, -15.0), 15.0)
        a = 0.5 * g * (2.0 - 2.0 / (tl.exp(2.0 * y) + 1.0))
    tl.store(out_ptr + row * stride_o + cols, a * u, mask=ok)


def act_mul(gu: torch.Tensor, n_ff: int, out: torch.Tensor, act: int) -> None:
    """out = act(gate) * up for gu = [gate | up] (n, 2 n_ff)."""
    n = gu.shape[0]
    if n == 0:
        return
    block = min(1024, triton.next_power_of_2(n_ff))
    _act_mul_kernel[(n, triton.cdiv(n_ff, block))](gu, out, n_ff, gu.stride(0), out.stride(0),
                                                   ACT=act, BLOCK=block)


def softcap_(logits: torch.Tensor, cap: float) -> None:
    """logits = cap * tanh(logits / cap), in place (gemma's final softcap; torch suffices)."""
    if cap > 0:
        logits.div_(cap).tanh_().mul_(cap)
