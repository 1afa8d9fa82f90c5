"""Q5_0 -> 5-bit blocks (exact) and Q6_K -> 8-bit blocks (numba backend quants/requant.py):
within half a step of gguf's own dequantization, and the f16-exact scales the avx512 tiles
store."""

from __future__ import annotations

import numpy as np
import pytest

gguf_quants = pytest.importorskip("gguf.quants")

from localinfer.backends.numba_cpu.quants import FORMATS, KIND_Q5, KIND_Q8  # noqa: E402

# ggml type -> (block elements, bytes per block, byte offsets of its f16 scale fields, the kind
# it unpacks to)
CASES = {6: (32, 22, (0,), KIND_Q5), 14: (256, 210, (208,), KIND_Q8)}
# (Q4_K keeps 4 bits: test_numba_quant_types)


@pytest.mark.parametrize("ggml_type", sorted(CASES))
def test_requantized_weights_match_gguf_dequantize(ggml_type: int) -> None:
    from gguf import GGMLQuantizationType

    block, size, scale_at, kind = CASES[ggml_type]
    rows, cols = 8, 512
    rng = np.random.default_rng(ggml_type)
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for off in scale_at:  # finite, modest f16 scales
        scales = rng.uniform(0.001, 0.05, (rows, cols // block)).astype(np.float16)
        raw[:, :, off : off + 2] = scales.view(np.uint8).reshape(rows, cols // block, 2)
    raw = raw.reshape(rows, -1)
    ref = gguf_quants.dequantize(raw, GGMLQuantizationType(ggml_type)).reshape(rows, cols)
    p = FORMATS[ggml_type].unpack(raw.reshape(-1), rows, cols)
    assert p.kind == kind
    np.testing.assert_array_equal(p.d, p.d.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(p.m, p.m.astype(np.float16).astype(np.float32))
    step = np.repeat(p.d, 32, axis=1)
    err = np.abs(p.dequantize() - ref)
    assert np.all(err <= 0.5 * step * (1 + 1e-3) + 1e-6)
