"""Q5_0 and Q5_1: 32 values per block, 5-bit codes: 4 low bits in qs, the 5th bits in qh (u32).

Block layouts (ggml-common.h): Q5_0 = d:f16, qh[4], qs[16]; Q5_1 = d:f16, m:f16, qh[4], qs[16].
Bit j of qh is the 5th bit of value j (j < 16 from the low nibbles, j >= 16 from the high ones).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .base import QuantFormat
from .numerics import ONE, ZERO, f32, get_f16, put_f16
from .rows import WORKERS, claim

_FLT_MAX = np.float32(3.4028234663852886e38)


@njit(cache=True, inline="always")
def _pack(o: np.ndarray, at: int, j: int, a: int, b: int, qh: int) -> int:
    o[at + 4 + j] = (a & 15) | ((b & 15) << 4)
    return qh | (((a & 16) >> 4) << j) | (((b & 16) >> 4) << (j + 16))


@njit(cache=True, inline="always")
def _store_qh(o: np.ndarray, at: int, qh: int) -> None:
    for k in range(4):
        o[at + k] = (qh >> (8 * k)) & 0xFF


@njit(cache=True, inline="always")
def _q5_0_block(x: np.ndarray, o: np.ndarray) -> None:
    amax = ZERO
    mx = ZERO
    for j in range(32):
        if amax < abs(x[j]):
            amax = abs(x[j])
            mx = x[j]
    d = mx / f32(-16.0)
    inv = ONE / d if d != 0 else ZERO
    put_f16(o, 0, d)
    qh = 0
    for j in range(16):
        a = min(31, int(x[j] * inv + f32(16.5)))
        b = min(31, int(x[j + 16] * inv + f32(16.5)))
        qh = _pack(o, 2, j, a, b, qh)
    _store_qh(o, 2, qh)


@njit(cache=True, inline="always")
def _q5_1_block(x: np.ndarray, o: np.ndarray) -> None:
    lo = _FLT_MAX
    hi = -_FLT_MAX
    for j in range(32):
        lo = min(lo, x[j])
        hi = max(hi, x[j])
    d = (hi - lo) / f32(31.0)
    inv = ONE / d if d != 0 else ZERO
    put_f16(o, 0, d)
    put_f16(o, 2, lo)
    qh = 0
    for j in range(16):
        a = int((x[j] - lo) * inv + f32(0.5)) & 0xFF
        b = int((x[j + 16] - lo) * inv + f32(0.5)) & 0xFF
        qh = _pack(o, 4, j, a, b, qh)
    _store_qh(o, 4, qh)


@njit(cache=True, inline="always")
def _codes(q: np.ndarray, at: int, y: np.ndarray, d: np.float32, m: np.float32, off: int,
           has_m: bool) -> None:
    qh = 0
    for k in range(4):
        qh |= np.int64(q[at + k]) << (8 * k)
    for j in range(16):
        a = (q[at + 4 + j] & 15) | (((qh >> j) << 4) & 16)
        b = (q[at + 4 + j] >> 4) | ((qh >> (j + 12)) & 16)
        if has_m:
            y[j] = f32(a - off) * d + m
            y[j + 16] = f32(b - off) * d + m
        else:  # no "+ 0": it would turn -0.0 into +0.0
            y[j] = f32(a - off) * d
            y[j + 16] = f32(b - off) * d


@njit(cache=True, parallel=True)
def quantize_q5_0(x: np.ndarray, out: np.ndarray) -> None:
    nxt = np.zeros(1, np.int64)
    for _ in prange(WORKERS):
        r = claim(nxt)
        while r < x.shape[0]:
            for b in range(x.shape[1] // 32):
                _q5_0_block(x[r, b * 32:b * 32 + 32], out[r, b * 22:b * 22 + 22])
            r = claim(nxt)


@njit(cache=True, parallel=True)
def quantize_q5_1(x: np.ndarray, out: np.ndarray) -> None:
    nxt = np.zeros(1, np.int64)
    for _ in prange(WORKERS):
        r = claim(nxt)
        while r < x.shape[0]:
            for b in range(x.shape[1] // 32):
                _q5_1_block(x[r, b * 32:b * 32 + 32], out[r, b * 24:b * 24 + 24])
            r = claim(nxt)


@njit(cache=True, parallel=True)
def dequantize_q5_0(q: np.ndarray, y: np.ndarray) -> None:
    for r in prange(q.shape[0]):
        for b in range(y.shape[1] // 32):
            d = get_f16(q[r], b * 22)
            _codes(q[r], b * 22 + 2, y[r, b * 32:b * 32 + 32], d, ZERO, 16, False)


@njit(cache=True, parallel=True)
def dequantize_q5_1(q: np.ndarray, y: np.ndarray) -> None:
    for r in prange(q.shape[0]):
        for b in range(y.shape[1] // 32):
            d = get_f16(q[r], b * 24)
            m = get_f16(q[r], b * 24 + 2)
            _codes(q[r], b * 24 + 4, y[r, b * 32:b * 32 + 32], d, m, 0, True)


class Q5_0(QuantFormat):
    name = "Q5_0"
    ggml_type = 6
    block_size = 32
    type_size = 22
    quantize_rows = quantize_q5_0
    dequantize_rows = dequantize_q5_0


class Q5_1(QuantFormat):
    name = "Q5_1"
    ggml_type = 7
    block_size = 32
    type_size = 24
    quantize_rows = quantize_q5_1
    dequantize_rows = dequantize_q5_1
