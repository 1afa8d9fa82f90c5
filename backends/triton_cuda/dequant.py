"""Dequantization inside a tile: the one place that knows the re-laid weight formats.

Every weight is one of relayout.py's three kinds (KIND_FLOAT 0, KIND_NIBBLE 1, KIND_INT8 2);
a kernel asks for a (rows, cols) tile of float32 values and gets

    FLOAT   w[r, k]                                    (f32, f16 or bf16 storage)
    NIBBLE  scale[r, g] * code + bias[r, g]            code = 4 low bits | 1 or 2 high bits << 4
    INT8    scale[r, g] * code                         g = k // GROUP

so the matmul, the embedding gather and the tests all share this one function.  Addresses of a
tile row are contiguous (two codes per byte, eight or four high bits per byte), so a warp's
loads coalesce; the per-group scales are read once per GROUP columns from a small array that
stays in cache.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def dequant_tile(w_ptr, hi_ptr, s_ptr, b_ptr, rows, cols, mask, K,
                 KIND: tl.constexpr, HI_BITS: tl.constexpr, GROUP: tl.constexpr):
    """rows (R,) output-feature indices, cols (C,) input-feature indices, mask (R, C), K the
    matrix's columns -> (R, C) float32, zero where masked."""
    r = rows[:, None].to(tl.int64)
    c = cols[None, :]
    if KIND == 0:
        w = tl.load(w_ptr + r * K + c, mask=mask, other=0.0).to(tl.float32)
    else:
        g = r * (K // GROUP) + c // GROUP
        scale = tl.load(s_ptr + g, mask=mask, other=0.0)
        if KIND == 1:
            byte = tl.load(w_ptr + r * (K // 2) + c // 2, mask=mask, other=0).to(tl.int32)
            code = (byte >> ((c & 1) * 4)) & 15
            if HI_BITS == 1:
                hb = tl.load(hi_ptr + r * (K // 8) + c // 8, mask=mask, other=0).to(tl.int32)
                code = code | (((hb >> (c & 7)) & 1) << 4)
            if HI_BITS == 2:
                hb = tl.load(hi_ptr + r * (K // 4) + c // 4, mask=mask, other=0).to(tl.int32)
                code = code | (((hb >> ((c & 3) * 2)) & 3) << 4)
            bias = tl.load(b_ptr + g, mask=mask, other=0.0)
            w = scale * code.to(tl.float32) + bias
        else:
            code = tl.load(w_ptr + r * K + c, mask=mask, other=0).to(tl.float32)
            w = scale * code
    return w
