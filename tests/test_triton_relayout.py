"""relayout(): every GGUF weight type the Triton backend reads, against gguf-py's dequantization.

Blocks come from random bytes (every code and scale pattern, f16 fields set to finite values of
both signs) and, where gguf-py can quantize the type, from quantized Gaussian rows.  Exact types
must equal gguf.quants.dequantize (bit for bit, up to the sign of a zero for the types whose
zero point is folded into the bias); the f16 fallbacks must be gguf's values rounded to f16.
The layout itself is checked by decoding codes straight from w / hi as the spec words it.
"""

from __future__ import annotations

import numpy as np
import pytest

gq = pytest.importorskip("gguf.quants")
from gguf import GGML_QUANT_SIZES  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402
from localinfer.backends.triton_cuda.relayout import (  # noqa: E402
    KIND_FLOAT,
    KIND_INT8,
    KIND_NIBBLE,
    relayout,
)

from localinfer.errors import UnsupportedModelError  # noqa: E402

FLOATS = [QT.F32, QT.F16, QT.BF16]
# bitwise equal, signed zeros included
STRICT = [*FLOATS, QT.Q8_0, QT.Q4_1, QT.Q5_1, QT.Q4_K, QT.Q5_K]
# d * (q - z) folded into d * q + (-z * d): +0.0 where ggml may give -0.0
ZERO_POINT = [QT.Q4_0, QT.Q5_0, QT.Q6_K]
EXACT = STRICT + ZERO_POINT
VIA_F16 = [QT.Q2_K, QT.Q3_K, QT.IQ4_NL, QT.IQ4_XS]
QUANTIZABLE = [*FLOATS, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1]
# byte offsets of each block's f16 fields (d, dmin)
F16_AT = {QT.Q8_0: (0,), QT.Q4_0: (0,), QT.Q4_1: (0, 2), QT.Q5_0: (0,), QT.Q5_1: (0, 2),
          QT.Q2_K: (80, 82), QT.Q3_K: (108,), QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,),
          QT.IQ4_NL: (0,), QT.IQ4_XS: (0,)}
GROUP = {QT.Q6_K: 16}
HI_BITS = {QT.Q5_0: 1, QT.Q5_1: 1, QT.Q5_K: 1, QT.Q6_K: 2}
ROWS, COLS = 4, 512
ids = {"ids": lambda t: t.name}


def random_blocks(qtype: QT, rows: int, cols: int, seed: int) -> np.ndarray:
    """Flat uint8 of random blocks (floats: random values); f16 fields finite, either sign."""
    rng = np.random.default_rng(seed)
    if qtype in FLOATS:
        return quantized(qtype, rows, cols, seed)
    block, size = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for at in F16_AT[qtype]:
        n = b.shape[:2]
        v = rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-4, -1, n)
        b[:, :, at : at + 2] = v.astype(np.float16).view(np.uint8).reshape(*n, 2)
    return b.reshape(-1)


def quantized(qtype: QT, rows: int, cols: int, seed: int) -> np.ndarray:
    """gguf-py's quantization of Gaussian rows with per-row scales, as flat uint8."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, cols)) * rng.uniform(0.001, 0.2, (rows, 1))).astype(np.float32)
    return np.ascontiguousarray(gq.quantize(w, qtype)).view(np.uint8).reshape(-1)


def reference(raw: np.ndarray, qtype: QT, rows: int, cols: int) -> np.ndarray:
    return gq.dequantize(raw, qtype).reshape(rows, cols).astype(np.float32)


def sources(qtype: QT) -> list[np.ndarray]:
    out = [random_blocks(qtype, ROWS, COLS, seed=int(qtype))]
    if qtype in QUANTIZABLE and qtype not in FLOATS:
        out.append(quantized(qtype, ROWS, COLS, seed=100 + int(qtype)))
    return out


def bits(a: np.ndarray, signed_zero: bool = True) -> np.ndarray:
    return (a if signed_zero else a + np.float32(0)).view(np.uint32)


@pytest.mark.parametrize("qtype", EXACT, **ids)
def test_exact_types_equal_gguf(qtype):
    for raw in sources(qtype):
        r = relayout(qtype.name, raw, (COLS, ROWS))
        assert r.exact
        got, ref = r.dequantize(), reference(raw, qtype, ROWS, COLS)
        np.testing.assert_array_equal(got, ref)
        np.testing.assert_array_equal(bits(got, qtype in STRICT), bits(ref, qtype in STRICT))


@pytest.mark.parametrize("qtype", VIA_F16, **ids)
def test_other_types_are_gguf_rounded_to_f16(qtype):
    raw = random_blocks(qtype, ROWS, COLS, seed=int(qtype))
    r = relayout(qtype.name, raw, (COLS, ROWS))
    ref = reference(raw, qtype, ROWS, COLS)
    assert (r.kind, r.float_dtype, r.exact, r.w.dtype) == (KIND_FLOAT, "float16", False, np.float16)
    np.testing.assert_array_equal(r.w, ref.astype(np.float16))
    # f16 rounding: 2^-11 relative, half of f16's smallest subnormal (2^-24) absolute
    np.testing.assert_allclose(r.dequantize(), ref, rtol=2.0**-11, atol=2.0**-25)


@pytest.mark.parametrize("qtype", FLOATS, **ids)
def test_float_types_keep_their_bits(qtype):
    raw = random_blocks(qtype, ROWS, COLS, seed=1)
    r = relayout(qtype.name, raw, (COLS, ROWS))
    want, name = {QT.F32: (np.float32, "float32"), QT.F16: (np.float16, "float16"),
                  QT.BF16: (np.uint16, "bfloat16")}[qtype]
    assert (r.kind, r.group, r.hi_bits, r.float_dtype, r.exact) == (KIND_FLOAT, 0, 0, name, True)
    assert r.w.dtype == want and r.w.shape == (ROWS, COLS)
    np.testing.assert_array_equal(r.w.reshape(-1).view(np.uint8), raw)
    assert r.scale.shape == r.bias.shape == r.hi.shape == (ROWS, 0)


def codes_per_spec(r, row: int, k: int) -> int:
    """Element k's code, read from w / hi exactly as the layout is specified."""
    if r.kind == KIND_INT8:
        return int(r.w[row, k])
    code = (int(r.w[row, k // 2]) >> (4 * (k % 2))) & 15
    if r.hi_bits == 1:
        code |= ((int(r.hi[row, k // 8]) >> (k % 8)) & 1) << 4
    elif r.hi_bits == 2:
        code |= ((int(r.hi[row, k // 4]) >> (2 * (k % 4))) & 3) << 4
    return code


@pytest.mark.parametrize("qtype", [t for t in EXACT if t not in FLOATS], **ids)
def test_layout_shapes_and_element_order(qtype):
    raw = random_blocks(qtype, ROWS, COLS, seed=7)
    r = relayout(qtype.name, raw, (COLS, ROWS))
    group, hi_bits = GROUP.get(qtype, 32), HI_BITS.get(qtype, 0)
    int8 = qtype == QT.Q8_0
    assert (r.kind, r.rows, r.cols, r.group, r.hi_bits, r.float_dtype) == (
        KIND_INT8 if int8 else KIND_NIBBLE, ROWS, COLS, group, hi_bits, "")
    assert r.w.dtype == (np.int8 if int8 else np.uint8)
    assert r.w.shape == (ROWS, COLS if int8 else COLS // 2)
    assert r.hi.dtype == np.uint8 and r.hi.shape == (ROWS, COLS * hi_bits // 8)
    assert r.scale.dtype == r.bias.dtype == np.float32
    assert r.scale.shape == r.bias.shape == (ROWS, COLS // group)
    if int8:
        assert not r.bias.any()
    ref = reference(raw, qtype, ROWS, COLS)
    top = (1 << (4 + hi_bits)) - 1
    for row in range(ROWS):
        for k in range(0, COLS, 3):
            code, g = codes_per_spec(r, row, k), k // group
            assert int8 or 0 <= code <= top
            s, b = r.scale[row, g], r.bias[row, g]
            assert np.float32(s * np.float32(code)) + b == ref[row, k]
            if s != 0:  # the code gguf's value implies
                assert (ref[row, k] - b) / s == pytest.approx(code, abs=1e-3)


def test_q4_0_hand_built_block():
    """Element i < 16 is qs[i]'s low nibble, 16 + i its high one; w pairs elements 2j, 2j+1."""
    qs = np.arange(16, dtype=np.uint8) | ((15 - np.arange(16, dtype=np.uint8)) << 4)
    raw = np.concatenate([np.array([0.5], np.float16).view(np.uint8), qs])
    r = relayout("Q4_0", raw, (32,))
    codes = np.concatenate([np.arange(16), 15 - np.arange(16)])
    np.testing.assert_array_equal(r.w[0], codes[0::2] | (codes[1::2] << 4))
    assert (r.scale[0, 0], r.bias[0, 0]) == (0.5, -4.0)
    np.testing.assert_array_equal(r.dequantize()[0], 0.5 * (codes - 8))


def test_k_quant_scales_folded():
    """Q4_K: all six-bit scales 1 and mins 2 (packed), d = 0.25, dmin = 0.5."""
    b = np.zeros(144, np.uint8)
    b[0:4] = np.array([0.25, 0.5], np.float16).view(np.uint8)
    b[4:8], b[8:12], b[12:16] = 1, 2, 0x21  # sc 0..3, m 0..3 low six bits; 4..7 in nibbles
    r = relayout("Q4_K", b, (256,))
    np.testing.assert_array_equal(r.scale, np.full((1, 8), 0.25, np.float32))
    np.testing.assert_array_equal(r.bias, np.full((1, 8), -1.0, np.float32))
    np.testing.assert_array_equal(r.dequantize(), reference(b, QT.Q4_K, 1, 256))


@pytest.mark.parametrize("qtype", [QT.F32, QT.BF16, QT.Q8_0, QT.Q5_0, QT.Q4_K, QT.Q6_K, QT.Q3_K],
                         **ids)
def test_one_dimensional_tensor(qtype):
    raw = random_blocks(qtype, 1, 512, seed=3)
    r = relayout(qtype.name, raw, (512,))
    assert (r.rows, r.cols) == (1, 512)
    np.testing.assert_allclose(r.dequantize(), reference(raw, qtype, 1, 512), rtol=2.0**-11,
                               atol=2.0**-25)


def test_trailing_dims_fold_into_rows():
    raw = random_blocks(QT.Q6_K, 6, 256, seed=4)
    r = relayout("Q6_K", raw, (256, 2, 3))
    assert (r.rows, r.cols) == (6, 256)
    np.testing.assert_array_equal(r.dequantize(), reference(raw, QT.Q6_K, 6, 256))


def test_many_rows_span_chunks(monkeypatch):
    """Row chunks are stitched back in order (a tiny chunk forces many of them)."""
    import localinfer.backends.triton_cuda.relayout as mod

    monkeypatch.setattr(mod, "_CHUNK", 3 * 256)
    for qtype in (QT.Q6_K, QT.Q8_0, QT.Q2_K):
        raw = random_blocks(qtype, 10, 256, seed=5)
        r = relayout(qtype.name, raw, (256, 10))
        np.testing.assert_allclose(r.dequantize(), reference(raw, qtype, 10, 256),
                                   rtol=2.0**-11, atol=2.0**-25)


@pytest.mark.parametrize("name", ["IQ2_XXS", "TQ1_0", "Q8_1", "NOT_A_TYPE"])
def test_unsupported_type_is_named(name):
    with pytest.raises(UnsupportedModelError, match=name):
        relayout(name, np.zeros(66 * 4, np.uint8), (256, 4))


def test_wrong_size_or_shape_rejected():
    with pytest.raises(ValueError, match="bytes"):
        relayout("Q8_0", np.zeros(34 * 3, np.uint8), (32, 4))
    with pytest.raises(ValueError, match="multiple"):
        relayout("Q4_K", np.zeros(144, np.uint8), (128, 2))
    with pytest.raises(ValueError, match="bytes"):
        relayout("F16", np.zeros(10, np.uint8), (4, 2))
