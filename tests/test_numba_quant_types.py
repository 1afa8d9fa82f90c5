"""Every GGUF weight type the Numba backend reads, against gguf-py's reference dequantization.

Blocks come from two sources: random bytes (every code and scale pattern, f16 fields set to
finite values) and llama.cpp's own quantizer on Gaussian rows (ggml_ref).  Exact mappings must
equal gguf.quants.dequantize bit for bit; Q4_K / Q5_K / IQ4_XS (per-32 scales rounded to f16)
and Q2_K / Q6_K (requantized to 8 bits) within their stated bounds.  On AVX-512 hosts the tiled
layout must give the generic path's results bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")
gq = pytest.importorskip("gguf.quants")
import ggml_ref  # noqa: E402
from gguf import GGML_QUANT_SIZES  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402
from localinfer.backends.numba_cpu.isa import resolve_isa  # noqa: E402
from localinfer.backends.numba_cpu.linear import embed_rows, linear  # noqa: E402
from localinfer.backends.numba_cpu.llama import make_buffers  # noqa: E402
from localinfer.backends.numba_cpu.quants import FORMATS, unpack_tensor  # noqa: E402
from localinfer.backends.numba_cpu.quants.requant import (  # noqa: E402
    dequantize_q2_k,
    dequantize_q6_k,
)
from localinfer.backends.numba_cpu.weights import stack  # noqa: E402

from localinfer.errors import UnsupportedModelError  # noqa: E402

EXACT = [QT.BF16, QT.Q5_0, QT.Q5_1, QT.Q3_K, QT.IQ4_NL]
F16_SCALES = [QT.Q4_K, QT.Q5_K, QT.IQ4_XS]
REQUANT = [QT.Q2_K, QT.Q6_K]
NEW = EXACT + F16_SCALES + REQUANT
ALL = [QT.F32, QT.F16, QT.Q4_0, QT.Q4_1, QT.Q8_0, *NEW]
# byte offsets of each block's f16 fields (scales and mins)
F16_AT = {QT.Q4_0: (0,), QT.Q4_1: (0, 2), QT.Q5_0: (0,), QT.Q5_1: (0, 2), QT.IQ4_NL: (0,),
          QT.IQ4_XS: (0,), QT.Q2_K: (80, 82), QT.Q3_K: (108,), QT.Q4_K: (0, 2),
          QT.Q5_K: (0, 2), QT.Q6_K: (208,)}
native = pytest.mark.skipif(resolve_isa("auto") != "avx512", reason="host lacks AVX-512 VNNI")
ids = {"ids": lambda t: t.name}


def random_blocks(qtype: QT, rows: int, cols: int, seed: int, f16: float | None = None
                  ) -> np.ndarray:
    """(rows, row_bytes) uint8 of random blocks; f16 fields random finite (or all `f16`)."""
    rng = np.random.default_rng(seed)
    if qtype == QT.BF16:
        w = rng.standard_normal((rows, cols)).astype(np.float32) * 10.0 ** rng.integers(-4, 3)
        return gq.quantize(w, qtype)
    block, size = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for at in F16_AT[qtype]:
        n = b.shape[:2]
        v = (rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-4, -1, n) if f16 is None
             else np.full(n, f16))
        b[:, :, at : at + 2] = v.astype(np.float16).view(np.uint8).reshape(*n, 2)
    return b.reshape(rows, -1)


def llama_blocks(qtype: QT, rows: int, cols: int, seed: int) -> np.ndarray:
    """llama.cpp's quantization of Gaussian rows with per-row scales (real-looking blocks)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, cols)) * rng.uniform(0.001, 0.2, (rows, 1))).astype(np.float32)
    if qtype in (QT.F32, QT.F16, QT.BF16):
        return gq.quantize(w, qtype) if qtype != QT.F32 else w.view(np.uint8)
    return ggml_ref.ggml_quantize(w, int(qtype))


def unpack(raw: np.ndarray, qtype: QT, rows: int, cols: int):
    return unpack_tensor("w", int(qtype), qtype.name, np.ascontiguousarray(raw).reshape(-1),
                         (cols, rows))


def reference(raw: np.ndarray, qtype: QT, rows: int, cols: int) -> np.ndarray:
    return gq.dequantize(raw, qtype).reshape(rows, cols).astype(np.float32)


def blocks_for(qtype: QT, rows: int, cols: int, seed: int) -> list[np.ndarray]:
    out = [random_blocks(qtype, rows, cols, seed)]
    if ggml_ref.available():
        out.append(llama_blocks(qtype, rows, cols, seed + 1))
    return out


@pytest.mark.parametrize("qtype", EXACT, **ids)
def test_exact_types_equal_gguf(qtype):
    rows, cols = 13, 512
    for raw in blocks_for(qtype, rows, cols, seed=10):
        np.testing.assert_array_equal(unpack(raw, qtype, rows, cols).dequantize(),
                                      reference(raw, qtype, rows, cols))


def test_q3_k_extreme_product_fits_int8():
    """Scale -32 times code -4 = 128, one past int8: the mapping negates both sides."""
    b = np.zeros((1, 110), np.uint8)  # all scales -32, all hmask bits 0 -> codes -4
    b[0, 108:110] = np.array([0.01], np.float16).view(np.uint8)
    p = unpack(b, QT.Q3_K, 1, 256)
    assert p.q.min() == -128
    np.testing.assert_array_equal(p.dequantize(), reference(b, QT.Q3_K, 1, 256))
    assert p.dequantize()[0, 0] == np.float32(np.float16(0.01)) * 128


@pytest.mark.parametrize("qtype", F16_SCALES, **ids)
def test_f16_scaled_types_exact_when_scales_fit_f16(qtype):
    """With a power-of-two d and dmin, d * sc and dmin * mn are f16 values: then bit-exact."""
    rows, cols = 7, 512
    raw = random_blocks(qtype, rows, cols, seed=20, f16=2.0**-10)
    np.testing.assert_array_equal(unpack(raw, qtype, rows, cols).dequantize(),
                                  reference(raw, qtype, rows, cols))


@pytest.mark.parametrize("qtype", F16_SCALES, **ids)
def test_f16_scaled_types_within_scale_rounding(qtype):
    """Otherwise each weight is off by at most the f16 rounding of its block's scale and min:
    2^-11 relative (subnormal f16s: half of 2^-24 absolute) times the code."""
    rows, cols = 11, 1024
    for raw in blocks_for(qtype, rows, cols, seed=30):
        got = unpack(raw, qtype, rows, cols).dequantize()
        ref = reference(raw, qtype, rows, cols)
        blocks = raw.reshape(rows, cols // 256, -1)
        d = blocks[:, :, 0:2].copy().view(np.float16).astype(np.float32)  # (rows, ns, 1)
        if qtype == QT.IQ4_XS:
            dl, ml, top = np.abs(d) * 32, np.zeros_like(d), 127
        else:
            sc, mn = gq.Q4_K.get_scale_min(blocks[:, :, 4:16].reshape(-1, 12))
            dmin = blocks[:, :, 2:4].copy().view(np.float16).astype(np.float32)
            dl = np.abs(d) * sc.reshape(rows, -1, 8).astype(np.float32)
            ml = np.abs(dmin) * mn.reshape(rows, -1, 8).astype(np.float32)
            top = 15 if qtype == QT.Q4_K else 31
        tol = (2.0**-11 * (dl * top + ml) + 2.0**-25 * (top + 1)) * 1.0001
        err = np.abs(got - ref).reshape(rows, cols // 256, -1, 32).max(axis=-1)
        assert (err <= tol).all(), float((err - tol).max())
        # the scale rounding is far below the format's own step
        assert np.abs(got - ref).max() <= 1e-3 * np.abs(ref).max()


@pytest.mark.parametrize("qtype", REQUANT, **ids)
def test_requantized_types_within_half_a_step(qtype):
    rows, cols = 11, 1024
    dequantize = dequantize_q2_k if qtype == QT.Q2_K else dequantize_q6_k
    for raw in blocks_for(qtype, rows, cols, seed=40):
        ref = reference(raw, qtype, rows, cols)
        # our load-time dequantization is gguf's, bit for bit
        np.testing.assert_array_equal(dequantize(raw.reshape(rows, cols // 256, -1)), ref)
        got = unpack(raw, qtype, rows, cols).dequantize()
        b = ref.reshape(rows, -1, 32)
        lo, hi = b.min(axis=2, keepdims=True), b.max(axis=2, keepdims=True)
        step = (hi - lo) / 254 * (1 + 2.0**-10) + 2.0**-11 * np.maximum(-lo, hi) + 1e-30
        assert (np.abs(got.reshape(rows, -1, 32) - b) <= step).all()


@pytest.mark.parametrize("qtype", NEW, **ids)
def test_matmul_and_embedding(qtype):
    rows, cols, n = 40, 512, 6
    raw = llama_blocks(qtype, rows, cols, seed=50) if ggml_ref.available() else random_blocks(
        qtype, rows, cols, seed=50)
    p = unpack(raw, qtype, rows, cols)
    ref = reference(raw, qtype, rows, cols)
    ws = stack([p])
    x = np.random.default_rng(51).standard_normal((n, cols)).astype(np.float32)
    qbuf = make_buffers(n, cols, 1, 1, cols, cols, 2)[-1]
    out = np.zeros((n, rows), np.float32)
    linear(ws, 0, x, qbuf, out)
    expect = x @ ref.T
    assert np.abs(out - expect).max() / np.abs(expect).max() < (1e-5 if qtype == QT.BF16
                                                               else 2e-2)
    tokens = np.array([3, 0, 39, 3], np.int64)
    emb = np.zeros((4, cols), np.float32)
    embed_rows(ws, tokens, emb)
    np.testing.assert_array_equal(emb, p.dequantize()[tokens])


@native
@pytest.mark.parametrize("qtype", NEW, **ids)
def test_tiled_path_equals_generic_bit_for_bit(qtype):
    from localinfer.backends.numba_cpu.dispatch import embed, project
    from localinfer.backends.numba_cpu.isa import Isa
    from localinfer.backends.numba_cpu.quants.tiles import tile_dequantize
    from localinfer.backends.numba_cpu.weights import stack_tiles
    from numba import njit

    @njit
    def run(isa, ws, x, qbuf, out):
        project(isa, ws, 0, x, qbuf, out)

    @njit
    def lookup(isa, ws, tokens, out):
        embed(isa, ws, tokens, out)

    rows, cols, n = 70, 512, 9  # 70 rows: a partial last tile
    p = unpack(random_blocks(qtype, rows, cols, seed=60), qtype, rows, cols)
    tiles = stack_tiles([p])
    kind, zero, w, d, m, wf = tiles
    if qtype != QT.BF16:
        np.testing.assert_array_equal(tile_dequantize(kind.kind, zero[0], w[0], d[0], m[0], rows),
                                      p.dequantize())
    x = np.random.default_rng(61).standard_normal((n, cols)).astype(np.float32)
    qbuf = make_buffers(n, cols, 1, 1, cols, cols, 2)[-1]
    generic = np.zeros((n, rows), np.float32)
    linear(stack([p]), 0, x, qbuf, generic)
    fast = np.zeros((n, rows), np.float32)
    run(Isa("avx512"), tiles, x, qbuf, fast)
    np.testing.assert_array_equal(fast, generic)
    tokens = np.array([3, 0, 69, 17], np.int64)
    e_generic = np.zeros((4, cols), np.float32)
    e_fast = np.zeros((4, cols), np.float32)
    embed_rows(stack([p]), tokens, e_generic)
    lookup(Isa("avx512"), tiles, tokens, e_fast)
    np.testing.assert_array_equal(e_fast, e_generic)


def test_every_format_matches_ggml_sizes():
    for ggml_type, fmt in FORMATS.items():
        assert QT(ggml_type).name == fmt.name
        assert GGML_QUANT_SIZES[QT(ggml_type)] == (fmt.block_size, fmt.type_size)
    assert {QT(t) for t in FORMATS} == set(ALL)


@pytest.mark.parametrize("qtype", [QT.IQ2_XXS, QT.IQ3_S, QT.TQ1_0], **ids)
def test_unsupported_type_names_tensor_and_type(qtype):
    block, size = GGML_QUANT_SIZES[qtype]
    with pytest.raises(UnsupportedModelError, match=rf"blk\.3\.attn_q\.weight.*{qtype.name}"):
        unpack_tensor("blk.3.attn_q.weight", int(qtype), qtype.name,
                      np.zeros(size, np.uint8), (block, 1))


def test_k_quant_rows_must_hold_whole_super_blocks():
    with pytest.raises(UnsupportedModelError, match="row length 288"):
        unpack_tensor("w", int(QT.Q4_K), "Q4_K", np.zeros(144, np.uint8), (288, 1))


@pytest.mark.parametrize("qtype", [QT.IQ4_NL, QT.Q3_K, QT.Q4_K, QT.IQ4_XS], **ids)
def test_row_chunks_stack_to_the_whole(qtype, monkeypatch):
    from localinfer.backends.numba_cpu.quants import blocks

    raw = random_blocks(qtype, 11, 512, seed=70)
    whole = unpack(raw, qtype, 11, 512)
    monkeypatch.setattr(blocks, "ROW_CHUNK", 4)
    parts = unpack(raw, qtype, 11, 512)
    assert parts.kind == whole.kind
    np.testing.assert_array_equal(parts.dequantize(), whole.dequantize())


def test_five_bit_roles_stay_five_bit_in_tiles():
    """Q5_0 / Q5_1 keep 5 bits a code in the tiles (5/8 of the 8-bit tiles' weight bytes, the
    file's size in all), every code pattern round-trips through the tile layout, and merged
    matrices take 5 bits only where the zeros agree (Q4_1 / Q4_K next to Q5_1: fifth bits 0;
    Q4_0 or Q4_1 next to Q5_0: 8 bits)."""
    from localinfer.backends.numba_cpu.quants import KIND_Q5, KIND_Q8, concat_rows
    from localinfer.backends.numba_cpu.quants.tiles import tile_dequantize
    from localinfer.backends.numba_cpu.weights import stack_tiles

    rows, cols = 70, 512
    raw = {q: random_blocks(q, rows, cols, seed=80)
           for q in (QT.Q4_0, QT.Q4_1, QT.Q4_K, QT.Q5_0, QT.Q5_1)}
    packed = {q: unpack(r, q, rows, cols) for q, r in raw.items()}
    for q in (QT.Q5_0, QT.Q5_1):
        p = packed[q]
        assert p.kind == KIND_Q5
        kind, zero, w, d, m, _ = stack_tiles([p])
        assert kind.kind == KIND_Q5 and zero[0] == (16 if q == QT.Q5_0 else 0)
        np.testing.assert_array_equal(tile_dequantize(KIND_Q5, zero[0], w[0], d[0], m[0], rows),
                                      reference(raw[q], q, rows, cols))
        wide = stack_tiles([p.to_kind(KIND_Q8)])
        assert w.nbytes * 8 == wide[2].nbytes * 5
        # codes, scales and (Q5_1) mins: the file's bytes for the rows padded to whole tiles
        padded = -(-rows // 16) * 16
        assert w.nbytes + d.nbytes + m.nbytes == GGML_QUANT_SIZES[q][1] * padded * cols // 32
    for other, q5, kind in [(QT.Q4_1, QT.Q5_1, KIND_Q5), (QT.Q4_K, QT.Q5_1, KIND_Q5),
                            (QT.Q4_0, QT.Q5_0, KIND_Q8), (QT.Q4_1, QT.Q5_0, KIND_Q8)]:
        merged = concat_rows([packed[other], packed[q5]])
        assert merged.kind == kind, (other.name, q5.name)
        np.testing.assert_array_equal(merged.dequantize(), np.concatenate(
            [packed[other].dequantize(), packed[q5].dequantize()]))
        stacked = stack_tiles([packed[other], packed[q5]])
        assert stacked[0].kind == kind
