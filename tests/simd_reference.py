"""numpy references for the vector kernels' float code, bit for bit: the same float32
operations in the same order as simd/vexp.py and kernels/elementwise_simd.py (numpy rounds each
float32 operation as IEEE does, as the kernels' plain fadd/fmul do); and the buffers an
activation quantizer fills, for comparing two of them.  Used on x86
(tests/test_numba_simd_paths.py) and under qemu (tests/arm64_neon_checks.py)."""

from __future__ import annotations

import numpy as np

F = np.float32
LOG2E = F(1.4426950408889634)
LN2_HI = F(0.693359375)
LN2_LO = F(-2.12194440e-4)
COEFFS = [F(1.0 / 5040.0), F(1.0 / 720.0), F(1.0 / 120.0), F(1.0 / 24.0), F(1.0 / 6.0),
          F(0.5), F(1.0)]


def quantized(run, x: np.ndarray) -> tuple[np.ndarray, ...]:
    """run(x, xq, xd, xi, xs), an activation quantizer, into fresh buffers -> the buffers."""
    n, cols = x.shape
    bufs = (np.zeros((n, cols), np.int8), np.zeros((n, cols // 32), np.float32),
            np.zeros((n, cols // 32), np.int32), np.zeros((n, cols // 32), np.float32))
    run(x, *bufs)
    return bufs


def vexp(x: np.ndarray) -> np.ndarray:
    x = np.minimum(np.maximum(x, F(-87.0)), F(88.0))
    n = np.rint(x * LOG2E)
    r = (x - n * LN2_HI) - n * LN2_LO
    p = np.full_like(x, COEFFS[0])
    for c in COEFFS[1:]:
        p = p * r + c
    p = p * r + F(1.0)
    return p * np.ldexp(F(1.0), n.astype(np.int32)).astype(np.float32)


def swiglu(gate_up: np.ndarray, n_ff: int) -> np.ndarray:
    """silu(gate) * up as the vector kernels compute it: g / (1 + e**(0 - g)) * up."""
    g, up = gate_up[:, :n_ff], gate_up[:, n_ff:2 * n_ff]
    return g / (F(1.0) + vexp(F(0.0) - g)) * up
