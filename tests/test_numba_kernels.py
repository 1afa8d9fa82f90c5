"""Numba backend kernels against gguf-py's reference (de)quantization and numpy."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")
gq = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType as QT  # noqa: E402
from localinfer.backends.numba_cpu.kernels.elementwise import rope_inplace, rope_tables  # noqa: E402
from localinfer.backends.numba_cpu.kernels.f16 import (  # noqa: E402
    f16_bits,
    f16_row_to_f32,
    round_f16,
)
from localinfer.backends.numba_cpu.linear import embed_rows, linear  # noqa: E402
from localinfer.backends.numba_cpu.llama import make_buffers  # noqa: E402
from localinfer.backends.numba_cpu.quants import concat_rows, unpack_tensor  # noqa: E402
from localinfer.backends.numba_cpu.weights import stack  # noqa: E402

from localinfer.errors import UnsupportedModelError  # noqa: E402

TYPES = [QT.F32, QT.F16, QT.Q4_0, QT.Q4_1, QT.Q8_0]


def quantized(qtype: QT, rows: int, cols: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random weights -> (raw bytes (rows, row_bytes), gguf-py dequantized (rows, cols))."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 2.0, (rows, 1))).astype(np.float32)
    if qtype == QT.F32:
        raw = w.view(np.uint8)
    elif qtype == QT.F16:
        raw = w.astype(np.float16).view(np.uint8)
    else:
        raw = gq.quantize(w, qtype)
    ref = gq.dequantize(raw, qtype).reshape(rows, cols).astype(np.float32)
    return np.ascontiguousarray(raw), ref


def packed(qtype: QT, rows: int, cols: int, seed: int = 0):
    raw, ref = quantized(qtype, rows, cols, seed)
    return unpack_tensor("w", int(qtype), qtype.name, raw.reshape(-1), (cols, rows)), ref


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf(qtype):
    p, ref = packed(qtype, 37, 96)
    np.testing.assert_allclose(p.dequantize(), ref, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_matmul_close_to_float_and_batch_invariant(qtype):
    rows, cols, n = 70, 160, 9
    p, ref = packed(qtype, rows, cols, seed=1)
    ws = stack([p])
    x = np.random.default_rng(2).standard_normal((n, cols)).astype(np.float32)
    bufs = make_buffers(n, cols, 1, 1, cols, cols, 2)
    out = np.zeros((n, rows), np.float32)
    linear(ws, 0, x, bufs[-1], out)
    expect = x @ ref.T
    err = np.abs(out - expect).max() / np.abs(expect).max()
    assert err < (1e-5 if qtype in (QT.F32, QT.F16) else 2e-2)
    for i in (0, 5, 8):  # each row alone gives bit-identical results
        alone = np.zeros((1, rows), np.float32)
        linear(ws, 0, x[i : i + 1].copy(), bufs[-1], alone)
        np.testing.assert_array_equal(alone[0], out[i])


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_embed_rows(qtype):
    p, ref = packed(qtype, 20, 64, seed=3)
    tokens = np.array([3, 0, 19, 3], np.int64)
    out = np.zeros((4, 64), np.float32)
    embed_rows(stack([p]), tokens, out)
    np.testing.assert_allclose(out, ref[tokens], rtol=1e-6, atol=1e-7)


def test_mixed_kinds_widen_exactly():
    a, ra = packed(QT.Q4_0, 8, 64, seed=4)
    b, rb = packed(QT.Q4_1, 8, 64, seed=5)
    c, rc = packed(QT.Q8_0, 8, 64, seed=6)
    both = concat_rows([a, b, c])
    np.testing.assert_allclose(both.dequantize(), np.concatenate([ra, rb, rc]), rtol=1e-6)
    layers = stack([a, c])  # layers of one role in different kinds
    assert layers[0] == c.kind


def test_unsupported_type_names_tensor():
    with pytest.raises(UnsupportedModelError, match=r"blk\.0\.ffn_down\.weight.*IQ2_XXS"):
        unpack_tensor("blk.0.ffn_down.weight", int(QT.IQ2_XXS), "IQ2_XXS", np.zeros(66, np.uint8),
                      (256, 1))


def test_f16_conversions_match_numpy():
    rng = np.random.default_rng(7)
    values = np.concatenate([
        rng.standard_normal(2000) * 10.0 ** rng.integers(-9, 6, 2000),
        [0.0, -0.0, 65504.0, 65519.0, 65520.0, 1e6, -1e6, 6.1e-5, 5.96e-8, 2.9e-8, 3e-8],
    ]).astype(np.float32)
    with np.errstate(over="ignore"):
        expect = values.astype(np.float16)
    got = np.array([f16_bits(v) for v in values], np.uint16)
    np.testing.assert_array_equal(got, expect.view(np.uint16))
    rounded = np.array([round_f16(v) for v in values], np.float32)
    np.testing.assert_array_equal(rounded, expect.astype(np.float32))
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    finite = np.isfinite(bits.view(np.float16))
    out = np.zeros(65536, np.float32)
    f16_row_to_f32(bits, np.zeros(65536, np.uint32), out)
    np.testing.assert_array_equal(out[finite], bits.view(np.float16)[finite].astype(np.float32))


def test_rope_adjacent_pairs():
    pos = np.array([0, 1, 7, 300], np.int64)
    dim, base = 8, 10000.0
    cos_t = np.zeros((4, dim // 2), np.float32)
    sin_t = np.zeros((4, dim // 2), np.float32)
    rope_tables(pos, dim, base, cos_t, sin_t)
    x = np.random.default_rng(8).standard_normal((4, 2 * dim)).astype(np.float32)
    y = x.copy()
    rope_inplace(y, 0, 2, dim, dim, cos_t, sin_t)
    theta = pos[:, None] * base ** (-np.arange(0, dim, 2) / dim)  # (4, dim/2)
    for h in range(2):
        x0, x1 = x[:, h * dim : (h + 1) * dim : 2], x[:, h * dim + 1 : (h + 1) * dim : 2]
        np.testing.assert_allclose(y[:, h * dim : (h + 1) * dim : 2],
                                   x0 * np.cos(theta) - x1 * np.sin(theta), atol=2e-4)
        np.testing.assert_allclose(y[:, h * dim + 1 : (h + 1) * dim : 2],
                                   x0 * np.sin(theta) + x1 * np.cos(theta), atol=2e-4)
