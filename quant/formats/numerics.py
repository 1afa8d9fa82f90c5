"""Scalar helpers shared by the block kernels, matching ggml's float rounding exactly.

Every kernel works in float32 like ggml-quants.c. Numba promotes float32 with int64 or a Python
float to float64, so kernels convert ints with f32() and use the float32 constants below.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

f32 = np.float32
ZERO = np.float32(0.0)
ONE = np.float32(1.0)
HALF = np.float32(0.5)
GROUP_MAX_EPS = np.float32(1e-15)


@njit(cache=True, inline="always")
def nearest_int(v: np.float32) -> int:
    """ggml's nearest_int: round half to even (via the 1.5*2^23 trick) for |v| <= 4194303."""
    return int(np.rint(np.float64(v)))


@njit(cache=True, inline="always")
def roundf(v: np.float32) -> int:
    """C roundf: half away from zero (exact in float64 for any float32)."""
    a = math.floor(abs(np.float64(v)) + 0.5)
    return int(-a if v < 0 else a)


@njit(cache=True)
def fp32_to_fp16(v: np.float32) -> int:
    """float32 -> IEEE half bits, round to nearest even (what F16C and ggml's fallback do)."""
    x = np.float64(v)
    if x != x:
        return 0x7E00 | (0x8000 if math.copysign(1.0, x) < 0 else 0)
    sign = 0x8000 if math.copysign(1.0, x) < 0 else 0
    a = abs(x)
    if a >= 65520.0:
        return sign | 0x7C00
    if a < 6.103515625e-05:  # below 2^-14: subnormal half, step 2^-24
        return sign | int(np.rint(a * 16777216.0))
    _, e = math.frexp(a)
    exp = e - 1
    q = int(np.rint((math.ldexp(a, -exp) - 1.0) * 1024.0))
    if q == 1024:
        exp += 1
        q = 0
    return sign | ((exp + 15) << 10) | q


@njit(cache=True)
def fp16_to_fp32(h: int) -> np.float32:
    """IEEE half bits -> float32 (exact)."""
    e = (h >> 10) & 31
    m = h & 1023
    if e == 0:
        v = math.ldexp(np.float64(m), -24)
    elif e == 31:
        v = math.inf if m == 0 else math.nan
    else:
        v = math.ldexp(np.float64(1024 + m), e - 25)
    return np.float32(-v if h & 0x8000 else v)


@njit(cache=True, inline="always")
def put_f16(out: np.ndarray, pos: int, v: np.float32) -> np.float32:
    """Store v as a little-endian half at out[pos:pos+2]; return the stored value as float32."""
    h = fp32_to_fp16(v)
    out[pos] = h & 0xFF
    out[pos + 1] = h >> 8
    return fp16_to_fp32(h)


@njit(cache=True, inline="always")
def get_f16(b: np.ndarray, pos: int) -> np.float32:
    return fp16_to_fp32(np.int64(b[pos]) | (np.int64(b[pos + 1]) << 8))
