"""IEEE half precision without Numba float16 support: values travel as uint16 bit patterns.

The KV cache is stored as f16 bits (like llama.cpp's default cache) and activation block scales
are rounded to f16 (like ggml's q8_0/q8_1 blocks), so our numbers stay close to llama.cpp's.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

TWO_POW_112 = np.float32(2.0**112)


@njit(cache=True, nogil=True)
def round_f16(x):
    """Round a float to the nearest f16 value (ties to even), returned as float32."""
    a = abs(x)
    if a >= 65520.0:
        r = np.inf
    elif a < 6.103515625e-05:  # below 2**-14: subnormal step 2**-24
        r = np.rint(a * 16777216.0) / 16777216.0
    else:
        m, e = math.frexp(a)  # a = m * 2**e, 0.5 <= m < 1
        r = math.ldexp(np.rint(m * 2048.0), e - 11)
    return np.float32(-r if x < 0 else r)


@njit(cache=True, nogil=True)
def f16_bits(x):
    """float -> f16 bit pattern (uint16), round to nearest even; NaN -> quiet NaN."""
    if x != x:
        return np.uint16(0x7E00)
    sign = 0x8000 if x < 0 or (x == 0 and math.copysign(1.0, x) < 0) else 0
    a = abs(float(x))
    if a >= 65520.0:
        return np.uint16(sign | 0x7C00)
    if a < 6.103515625e-05:
        return np.uint16(sign | int(np.rint(a * 16777216.0)))  # 1024 -> smallest normal
    m, e = math.frexp(a)
    mant = int(np.rint(m * 2048.0))  # 1024..2048
    exp = e - 1 + 15
    if mant == 2048:
        mant = 1024
        exp += 1
    if exp >= 31:
        return np.uint16(sign | 0x7C00)
    return np.uint16(sign | (exp << 10) | (mant - 1024))


@njit(cache=True, nogil=True, fastmath=True)
def f16_row_to_f32(src, bits, dst):
    """src (n,) uint16 -> dst (n,) float32 through the scratch bits (n,) uint32.

    Moves sign/exponent/mantissa into f32 position and rescales the exponent by 2**112 with one
    multiply, which is exact for normal and subnormal halves and vectorizes well.  (Infinities
    and NaNs, which a sane cache never holds, come out as large finite values.)
    """
    n = src.shape[0]
    for i in range(n):
        h = np.uint32(src[i])
        bits[i] = ((h & np.uint32(0x8000)) << np.uint32(16)) | (
            (h & np.uint32(0x7FFF)) << np.uint32(13))
    as_f32 = bits.view(np.float32)
    for i in range(n):
        dst[i] = as_f32[i] * TWO_POW_112


@njit(cache=True, nogil=True)
def f16_value(h):
    """One f16 bit pattern (finite) -> its value as float32 (exact)."""
    e = (h >> 10) & 31
    mant = h & 1023
    v = math.ldexp(float(mant), -24) if e == 0 else math.ldexp(float(1024 + mant), e - 25)
    return np.float32(-v if h & 0x8000 else v)
