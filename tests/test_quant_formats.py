"""Each block format, bit for bit: quantize against llama.cpp's ggml_quantize_chunk (ctypes into
the libggml-base llama-cpp-python ships) and gguf-py's reference quantizers; dequantize against
gguf-py's dequantizers; the f16 rounding helper against numpy."""

from __future__ import annotations

import ggml_ref
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants
from localinfer.quant.formats import BY_NAME, FORMATS
from localinfer.quant.formats.numerics import fp16_to_fp32, fp32_to_fp16

ALL = sorted(BY_NAME)
GGUF_PY_QUANTIZE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "BF16")


def sample_rows(n: int = 1024, seed: int = 0) -> np.ndarray:
    """Gaussian rows at scales from 1e-3 to 10 plus hard cases: zeros, constants, -0.0,
    subnormal-sized values, an outlier, a lone nonzero, mixed-sign runs."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((24, n)) * rng.uniform(1e-3, 10, (24, 1))).astype(np.float32)
    x[0] = 0
    x[1] = 1.5
    x[2] = -0.0
    x[3] = rng.standard_normal(n).astype(np.float32) * 1e-6
    x[4, 7] = 1e4
    x[5] = 0
    x[5, 100] = -2.0
    x[6, :16] = -3
    x[7] = np.abs(x[7])
    x[8] = -np.abs(x[8])
    x[9] = rng.uniform(-1, 1, n).astype(np.float32) * 65000
    return x


def test_registry_is_consistent() -> None:
    for ggml_type, fmt in FORMATS.items():
        assert T(ggml_type).name == fmt.name


@pytest.mark.skipif(not ggml_ref.available(), reason="llama-cpp-python not installed")
@pytest.mark.parametrize("name", ALL)
def test_quantize_matches_llama_cpp(name: str) -> None:
    fmt = BY_NAME[name]
    x = sample_rows()
    assert np.array_equal(fmt.quantize(x), ggml_ref.ggml_quantize(x, fmt.ggml_type))


@pytest.mark.parametrize("name", GGUF_PY_QUANTIZE)
def test_quantize_matches_gguf_py(name: str) -> None:
    # gguf-py turns a -0.0 block's scale into +0.0 (ggml keeps -0.0): compare ordinary rows
    x = sample_rows(seed=1)[10:]
    ours = BY_NAME[name].quantize(x)
    assert np.array_equal(ours, quants.quantize(x, T[name]).view(np.uint8).reshape(ours.shape))


@pytest.mark.parametrize("name", ALL)
def test_dequantize_matches_gguf_py(name: str) -> None:
    fmt = BY_NAME[name]
    x = sample_rows()
    q = fmt.quantize(x)
    ours = fmt.dequantize(q, x.shape[1])
    ref = quants.dequantize(q, T[name]).astype(np.float32)
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("name", ALL)
def test_shapes_and_errors(name: str) -> None:
    fmt = BY_NAME[name]
    x = sample_rows(512)[10:14].reshape(2, 2, 512)
    q = fmt.quantize(x)
    assert q.shape == (2, 2, fmt.row_bytes(512))
    assert fmt.dequantize(q, 512).shape == (2, 2, 512)
    if fmt.block_size > 1:
        with pytest.raises(ValueError, match="multiple"):
            fmt.quantize(np.zeros((1, fmt.block_size + 1), np.float32))


def test_fp16_rounding_matches_numpy() -> None:
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    v = bits.view(np.float32)
    v = v[np.isfinite(v)]
    specials = np.array([0.0, -0.0, 65504, 65519.996, 65520, 6.1035156e-05, 6.1035153e-05,
                         5.9604645e-08, 2.9802322e-08, 2.9802326e-08, 1e-40, -1e-40, np.inf,
                         -np.inf], np.float32)
    v = np.concatenate([v, specials, (rng.standard_normal(100_000) * 1e-5).astype(np.float32)])
    ours = np.array([fp32_to_fp16(np.float32(f)) for f in v], dtype=np.uint16)
    with np.errstate(over="ignore"):
        assert np.array_equal(ours, v.astype(np.float16).view(np.uint16))
    h = np.arange(0, 65536, 97, dtype=np.uint16)
    back = np.array([fp16_to_fp32(int(b)) for b in h], dtype=np.float32)
    ref = h.view(np.float16).astype(np.float32)
    assert np.array_equal(back.view(np.uint32)[~np.isnan(ref)],
                          ref.view(np.uint32)[~np.isnan(ref)])
