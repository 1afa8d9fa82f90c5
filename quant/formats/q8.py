"""Q8_0: 32 values per block, int8 codes and an f16 scale. Layout: d:f16, qs[32] (int8)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .base import QuantFormat
from .numerics import ONE, ZERO, f32, get_f16, put_f16, roundf
from .rows import WORKERS, claim


@njit(cache=True, inline="always")
def _q8_0_block(x: np.ndarray, o: np.ndarray) -> None:
    amax = ZERO
    for j in range(32):
        amax = max(amax, abs(x[j]))
    d = amax / f32(127.0)
    inv = ONE / d if d != 0 else ZERO
    put_f16(o, 0, d)
    for j in range(32):
        o[2 + j] = roundf(x[j] * inv) & 0xFF


@njit(cache=True, parallel=True)
def quantize_q8_0(x: np.ndarray, out: np.ndarray) -> None:
    nxt = np.zeros(1, np.int64)
    for _ in prange(WORKERS):
        r = claim(nxt)
        while r < x.shape[0]:
            for b in range(x.shape[1] // 32):
                _q8_0_block(x[r, b * 32:b * 32 + 32], out[r, b * 34:b * 34 + 34])
            r = claim(nxt)


@njit(cache=True, parallel=True)
def dequantize_q8_0(q: np.ndarray, y: np.ndarray) -> None:
    codes = q.view(np.int8)
    for r in prange(q.shape[0]):
        for b in range(y.shape[1] // 32):
            d = get_f16(q[r], b * 34)
            for j in range(32):
                y[r, b * 32 + j] = f32(codes[r, b * 34 + 2 + j]) * d


class Q8_0(QuantFormat):
    name = "Q8_0"
    ggml_type = 8
    block_size = 32
    type_size = 34
    quantize_rows = quantize_q8_0
    dequantize_rows = dequantize_q8_0
