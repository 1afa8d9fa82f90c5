"""y = x · Wᵀ (+ b) with W quantized: a GEMV-shaped path for decode, a tl.dot GEMM for prefill.

One kernel source, two inner products picked at compile time:

    DOT=False  (M <= GEMV_MAX_M rows, decode)  acc[m, n] += Σ_k x[m, k] · w[n, k] on CUDA cores,
               f32 throughout; BLOCK_M is the batch rounded up to a power of two, so the
               weights — the whole cost of a decode step — are read once for up to 8 rows
    DOT=True   (prefill, big batches)  acc += tl.dot(x, wᵀ) on the tensor cores (tf32 inputs)

Both dequantize W inside the tile (dequant.py), so the weights stay quantized in GPU memory.
The configurations are fixed (no autotuning at run time) and M is not specialized on, so a
new batch size never compiles a new kernel mid-stream beyond the four GEMV widths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from .dequant import dequant_tile
from .device import interpreted

if TYPE_CHECKING:
    import torch

    from .weights import GpuWeight, Projection

GEMV_MAX_M = 8
INTERPRETED = interpreted()


@triton.jit(do_not_specialize=["M", "stride_xm", "stride_ym"])
def _linear_kernel(x_ptr, w_ptr, hi_ptr, s_ptr, b_ptr, bias_ptr, y_ptr, M, N, K, stride_xm,
                   stride_ym,
                   KIND: tl.constexpr, HI_BITS: tl.constexpr, GROUP: tl.constexpr,
                   HAS_BIAS: tl.constexpr, DOT: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_ok = rn < N
    m_ok = rm < M
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        w = dequant_tile(w_ptr, hi_ptr, s_ptr, b_ptr, rn, rk, n_ok[:, None] & k_ok[None, :], K,
                         KIND, HI_BITS, GROUP)  # (BLOCK_N, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_K)
        if DOT:
            acc += tl.dot(x, tl.trans(w))
        else:
            acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0)[None, :]
    tl.store(y_ptr + rm[:, None].to(tl.int64) * stride_ym + rn[None, :], acc,
             mask=m_ok[:, None] & n_ok[None, :])


def _config(m: int) -> tuple[int, int, int, bool]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, DOT) for m rows.  The interpreter runs programs one after
    another in Python, so it gets tiles 4x wider: the same kernels, a fraction of the calls."""
    wide = 4 if INTERPRETED else 1
    if m <= GEMV_MAX_M:  # the broadcast product (M, N, K) stays at 8K values per program
        block_m = triton.next_power_of_2(m)
        return block_m, max(16, 64 // block_m) * wide, 128 if block_m < 8 else 64, False
    return 64, 64 * wide, 32 * wide, True


def linear(x: torch.Tensor, w: GpuWeight, out: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (M, K) f32 -> out (M, N) f32; both may be column slices of wider matrices."""
    m, k = x.shape
    if m == 0:
        return out
    assert k == w.cols and out.shape == (m, w.rows) and x.stride(1) == 1 == out.stride(1)
    block_m, block_n, block_k, dot = _config(m)
    grid = (triton.cdiv(w.rows, block_n), triton.cdiv(m, block_m))
    _linear_kernel[grid](x, w.w, w.hi, w.scale, w.bias, out if bias is None else bias, out,
                         m, w.rows, k, x.stride(0), out.stride(0),
                         KIND=w.kind, HI_BITS=w.hi_bits,
                         GROUP=max(w.group, 1), HAS_BIAS=bias is not None, DOT=dot,
                         BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return out


def project(x: torch.Tensor, proj: Projection, out: torch.Tensor,
            bias: torch.Tensor | None = None) -> torch.Tensor:
    """out = x · Wᵀ (+ bias) for a role stored as parts of different formats (e.g. Q4_K Q and
    K beside a Q6_K V): each part writes its own column range of out."""
    for offset, w in proj:
        linear(x, w, out[:, offset: offset + w.rows],
               None if bias is None else bias[offset: offset + w.rows])
    return out


@triton.jit(do_not_specialize=["T"])
def _embed_kernel(tok_ptr, w_ptr, hi_ptr, s_ptr, b_ptr, y_ptr, T, K, scale,
                  KIND: tl.constexpr, HI_BITS: tl.constexpr, GROUP: tl.constexpr,
                  BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr):
    rt = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = rt < T
    tok = tl.load(tok_ptr + rt, mask=t_ok, other=0)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        mask = t_ok[:, None] & (rk < K)[None, :]
        rows = dequant_tile(w_ptr, hi_ptr, s_ptr, b_ptr, tok, rk, mask, K, KIND, HI_BITS, GROUP)
        tl.store(y_ptr + rt[:, None].to(tl.int64) * K + rk[None, :], rows * scale, mask=mask)


def embed(tokens: torch.Tensor, w: GpuWeight, out: torch.Tensor, scale: float = 1.0) -> None:
    """out[t] = dequantized row tokens[t] of the embedding (times `scale`, gemma's √n_embd)."""
    t = tokens.shape[0]
    block_t = 4
    _embed_kernel[(triton.cdiv(t, block_t),)](tokens, w.w, w.hi, w.scale, w.bias, out, t,
                                              w.cols, scale, KIND=w.kind, HI_BITS=w.hi_bits,
                                              GROUP=max(w.group, 1), BLOCK_T=block_t,
                                              BLOCK_K=min(1024, triton.next_power_of_2(w.cols)))
