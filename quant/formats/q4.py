"""Q4_0 and Q4_1: 32 values per block, 4-bit codes, an f16 scale (and an f16 minimum for Q4_1).

Block layouts (ggml-common.h): Q4_0 = d:f16, qs[16]; Q4_1 = d:f16, m:f16, qs[16]. Byte j of qs
holds value j in its low nibble and value j + 16 in its high nibble.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .base import QuantFormat
from .numerics import ONE, ZERO, f32, get_f16, put_f16
from .rows import WORKERS, claim

_FLT_MAX = np.float32(3.4028234663852886e38)


@njit(cache=True, inline="always")
def _q4_0_block(x: np.ndarray, o: np.ndarray) -> None:
    amax = ZERO
    mx = ZERO
    for j in range(32):
        if amax < abs(x[j]):
            amax = abs(x[j])
            mx = x[j]
    d = mx / f32(-8.0)
    inv = ONE / d if d != 0 else ZERO
    put_f16(o, 0, d)
    for j in range(16):
        a = min(15, int(x[j] * inv + f32(8.5)))
        b = min(15, int(x[j + 16] * inv + f32(8.5)))
        o[2 + j] = a | (b << 4)


@njit(cache=True, inline="always")
def _q4_1_block(x: np.ndarray, o: np.ndarray) -> None:
    lo = _FLT_MAX
    hi = -_FLT_MAX
    for j in range(32):
        lo = min(lo, x[j])
        hi = max(hi, x[j])
    d = (hi - lo) / f32(15.0)
    inv = ONE / d if d != 0 else ZERO
    put_f16(o, 0, d)
    put_f16(o, 2, lo)
    for j in range(16):
        a = min(15, int((x[j] - lo) * inv + f32(0.5)))
        b = min(15, int((x[j + 16] - lo) * inv + f32(0.5)))
        o[4 + j] = a | (b << 4)


@njit(cache=True, parallel=True)
def quantize_q4_0(x: np.ndarray, out: np.ndarray) -> None:
    nxt = np.zeros(1, np.int64)
    for _ in prange(WORKERS):
        r = claim(nxt)
        while r < x.shape[0]:
            for b in range(x.shape[1] // 32):
                _q4_0_block(x[r, b * 32:b * 32 + 32], out[r, b * 18:b * 18 + 18])
            r = claim(nxt)


@njit(cache=True, parallel=True)
def quantize_q4_1(x: np.ndarray, out: np.ndarray) -> None:
    nxt = np.zeros(1, np.int64)
    for _ in prange(WORKERS):
        r = claim(nxt)
        while r < x.shape[0]:
            for b in range(x.shape[1] // 32):
                _q4_1_block(x[r, b * 32:b * 32 + 32], out[r, b * 20:b * 20 + 20])
            r = claim(nxt)


@njit(cache=True, parallel=True)
def dequantize_q4_0(q: np.ndarray, y: np.ndarray) -> None:
    for r in prange(q.shape[0]):
        for b in range(y.shape[1] // 32):
            o = b * 18
            d = get_f16(q[r], o)
            for j in range(16):
                y[r, b * 32 + j] = f32((q[r, o + 2 + j] & 15) - 8) * d
                y[r, b * 32 + j + 16] = f32((q[r, o + 2 + j] >> 4) - 8) * d


@njit(cache=True, parallel=True)
def dequantize_q4_1(q: np.ndarray, y: np.ndarray) -> None:
    for r in prange(q.shape[0]):
        for b in range(y.shape[1] // 32):
            o = b * 20
            d = get_f16(q[r], o)
            m = get_f16(q[r], o + 2)
            for j in range(16):
                y[r, b * 32 + j] = f32(q[r, o + 4 + j] & 15) * d + m
                y[r, b * 32 + j + 16] = f32(q[r, o + 4 + j] >> 4) * d + m


class Q4_0(QuantFormat):
    name = "Q4_0"
    ggml_type = 2
    block_size = 32
    type_size = 18
    quantize_rows = quantize_q4_0
    dequantize_rows = dequantize_q4_0


class Q4_1(QuantFormat):
    name = "Q4_1"
    ggml_type = 3
    block_size = 32
    type_size = 20
    quantize_rows = quantize_q4_1
    dequantize_rows = dequantize_q4_1
