"""GELU (tanh approximation) gated FFN, as ggml computes it on the CPU.

ggml evaluates GELU through a 65536-entry table: the input is rounded to f16, looked up, and
the f16 result multiplies the up projection in f32 (inputs beyond +-10 bypass the table).
Using the same table makes our FFN outputs match llama.cpp's bit for bit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .f16 import f16_bits

SQRT_2_OVER_PI = np.float32(0.79788456080286535587989211986876)
GELU_COEF_A = np.float32(0.044715)


def gelu_f16_table() -> np.ndarray:
    """(65536,) f32: gelu(x) rounded to f16 for every f16 bit pattern x."""
    with np.errstate(all="ignore"):  # NaN / inf patterns: never looked up
        x = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
        x = x.astype(np.float32)
        half = np.float32(0.5)
        one = np.float32(1.0)
        inner = SQRT_2_OVER_PI * x * (one + GELU_COEF_A * x * x)
        y = half * x * (one + np.tanh(inner))
        return y.astype(np.float16).astype(np.float32)


@njit(cache=True, nogil=True)
def geglu(gate_up, n_ff, table, out):
    """gate_up (n_tokens, 2 n_ff) = [gate | up] -> out (n_tokens, n_ff) = gelu(gate) * up."""
    for i in range(gate_up.shape[0]):
        for j in range(n_ff):
            g = gate_up[i, j]
            u = gate_up[i, n_ff + j]
            if g <= -10.0:
                out[i, j] = 0.0
            elif g >= 10.0:
                out[i, j] = g * u
            else:
                out[i, j] = table[f16_bits(g)] * u
