"""The explicit-SIMD (AVX-512 VNNI) kernels against gguf-py's references and the generic kernels,
and the ISA selection.  Kernel tests skip on hosts without AVX-512 VNNI."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")
gq = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType as QT  # noqa: E402
from localinfer.backends.numba_cpu import isa as isa_mod  # noqa: E402
from localinfer.backends.numba_cpu.isa import resolve_isa  # noqa: E402

from localinfer.errors import InvalidRequestError  # noqa: E402

QUANTS = [QT.Q4_0, QT.Q4_1, QT.Q8_0]
native = pytest.mark.skipif(resolve_isa("auto") != "avx512", reason="host lacks AVX-512 VNNI")


def test_forced_isa_names(monkeypatch):
    assert resolve_isa("generic") == "generic"
    monkeypatch.setenv("LOCALINFER_ISA", "generic")
    assert resolve_isa() == "generic"
    assert resolve_isa("auto") in isa_mod.REQUIREMENTS
    with pytest.raises(InvalidRequestError, match="unknown ISA"):
        resolve_isa("sse9")
    monkeypatch.setattr(isa_mod, "host_features", lambda: {"avx2"})
    with pytest.raises(InvalidRequestError, match="avx512vnni"):
        resolve_isa("avx512")
    monkeypatch.delenv("LOCALINFER_ISA")
    assert resolve_isa() == "generic"  # auto on a host without AVX-512


def packed(qtype: QT, rows: int, cols: int, seed: int):
    from localinfer.backends.numba_cpu.quants import unpack_tensor

    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 2.0, (rows, 1))).astype(np.float32)
    raw = np.ascontiguousarray(gq.quantize(w, qtype))
    ref = gq.dequantize(raw, qtype).reshape(rows, cols).astype(np.float32)
    return unpack_tensor("w", int(qtype), qtype.name, raw.reshape(-1), (cols, rows)), ref


@native
@pytest.mark.parametrize("qtype", QUANTS, ids=lambda t: t.name)
def test_tiled_matmul_equals_generic_bit_for_bit(qtype):
    from localinfer.backends.numba_cpu.dispatch import embed, project
    from localinfer.backends.numba_cpu.isa import Isa
    from localinfer.backends.numba_cpu.linear import embed_rows, linear
    from localinfer.backends.numba_cpu.llama import make_buffers
    from localinfer.backends.numba_cpu.quants.tiles import tile_dequantize
    from localinfer.backends.numba_cpu.weights import stack, stack_tiles
    from numba import njit

    @njit
    def run(isa, ws, x, qbuf, out):
        project(isa, ws, 0, x, qbuf, out)

    @njit
    def lookup(isa, ws, tokens, out):
        embed(isa, ws, tokens, out)

    rows, cols, n = 70, 160, 9  # 70 rows: a partial last tile
    p, ref = packed(qtype, rows, cols, seed=1)
    tiles = stack_tiles([p])
    kind, zero, w, d, m, _ = tiles
    np.testing.assert_array_equal(tile_dequantize(kind, zero[0], w[0], d[0], m[0], rows), ref)
    x = np.random.default_rng(2).standard_normal((n, cols)).astype(np.float32)
    qbuf = make_buffers(n, cols, 1, 1, cols, cols, 2)[-1]
    generic = np.zeros((n, rows), np.float32)
    linear(stack([p]), 0, x, qbuf, generic)
    fast = np.zeros((n, rows), np.float32)
    run(Isa("avx512"), tiles, x, qbuf, fast)
    np.testing.assert_array_equal(fast, generic)
    for i in (0, 4, 8):  # one row alone (the 1-row path) == the same row in a 4-row group
        alone = np.zeros((1, rows), np.float32)
        run(Isa("avx512"), tiles, x[i : i + 1].copy(), qbuf, alone)
        np.testing.assert_array_equal(alone[0], fast[i])
    tokens = np.array([3, 0, 69, 17], np.int64)
    e_generic = np.zeros((4, cols), np.float32)
    e_fast = np.zeros((4, cols), np.float32)
    embed_rows(stack([p]), tokens, e_generic)
    lookup(Isa("avx512"), tiles, tokens, e_fast)
    np.testing.assert_array_equal(e_fast, e_generic)
    np.testing.assert_allclose(e_fast, ref[tokens], rtol=1e-6, atol=1e-7)


@native
def test_matmul_uses_vnni():
    from localinfer.backends.numba_cpu.kernels.matmul_avx512 import matmul_tiles
    from numba import njit

    fresh = njit(parallel=True)(matmul_tiles.py_func)  # cached code has no asm to inspect
    w = np.zeros((2, 1, 256), np.uint8)
    d = np.zeros((2, 1, 16), np.uint16)
    xq = np.zeros((5, 32), np.int8)
    xf = np.zeros((5, 1), np.float32)
    fresh(True, 0, w, d, d, xq, xf, np.zeros((5, 1), np.int32), xf, np.zeros((5, 32), np.float32))
    asm = fresh.inspect_asm(fresh.signatures[0])
    assert "vpdpbusd" in asm and "vcvtph2ps" in asm


@native
def test_quantize_and_swiglu_match_generic():
    from localinfer.backends.numba_cpu.kernels.elementwise import swiglu
    from localinfer.backends.numba_cpu.kernels.elementwise_avx512 import (
        quantize_rows_avx512,
        swiglu_avx512,
    )
    from localinfer.backends.numba_cpu.kernels.quantize import quantize_rows

    rng = np.random.default_rng(3)
    n, cols = 11, 96
    x = (rng.standard_normal((n, cols)) * rng.uniform(0, 50, (n, 1))).astype(np.float32)
    x[2, :32] = 0.0  # an all-zero block
    outs = []
    for fn in (quantize_rows, quantize_rows_avx512):
        bufs = (np.zeros((n, cols), np.int8), np.zeros((n, 3), np.float32),
                np.zeros((n, 3), np.int32), np.zeros((n, 3), np.float32))
        fn(x, *bufs)
        outs.append(bufs)
    for a, b in zip(*outs, strict=True):
        np.testing.assert_array_equal(a, b)
    gu = (rng.standard_normal((n, 64)) * 8).astype(np.float32)
    gu[0, :8] = [-1e4, -100.0, -88.0, 0.0, 88.0, 100.0, 1e4, -1e-30]
    ref, got = np.zeros((n, 32), np.float32), np.zeros((n, 32), np.float32)
    swiglu(gu, 32, ref)
    swiglu_avx512(gu, 32, got)
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-30)


@native
@pytest.mark.parametrize("start,n_tok", [(0, 37), (16, 1), (300, 2)])
def test_attention_matches_generic(start, n_tok):
    from localinfer.backends.numba_cpu.kernels.attention import attention, write_kv
    from localinfer.backends.numba_cpu.kernels.attention_avx512 import (
        attention_avx512,
        write_kv_avx512,
    )

    n_heads, n_kv, hd, bs, n_blocks = 6, 2, 32, 16, 24
    rng = np.random.default_rng(start)
    table = rng.permutation(n_blocks)[None, :].astype(np.int64)
    pos = np.arange(start + n_tok, dtype=np.int64)
    slots = table[0, pos // bs] * bs + pos % bs
    qkv = rng.standard_normal((len(pos), (n_heads + 2 * n_kv) * hd)).astype(np.float32)
    seq = np.zeros(len(pos), np.int64)
    kg = np.zeros((n_blocks, bs, n_kv, hd), np.uint16)
    vg = np.zeros_like(kg)
    kt = np.zeros((n_blocks, n_kv, hd, bs), np.uint16)
    vt = np.zeros((n_blocks, n_kv, bs, hd), np.uint16)
    write_kv(qkv, n_heads * hd, (n_heads + n_kv) * hd, n_kv, hd, slots, bs, kg, vg)
    write_kv_avx512(qkv, n_heads, n_kv, hd, slots, bs, kt, vt)
    np.testing.assert_array_equal(kt, kg.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(vt, vg.transpose(0, 2, 1, 3))
    new = slice(start, start + n_tok)
    scale = np.float32(hd**-0.5)
    ref = np.zeros((n_tok, n_heads * hd), np.float32)
    attention(qkv[new], n_heads, n_kv, hd, pos[new], seq[new], table, bs, kg, vg, scale, ref)
    got = np.zeros_like(ref)
    scratch = np.zeros((2, n_heads // n_kv, 2 * hd + n_blocks * bs), np.float32)
    attention_avx512(qkv[new], n_heads, n_kv, hd, pos[new], seq[new], table, bs, kt, vt, scale,
                     scratch, got)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    for i in range(n_tok):  # each token alone: bit-identical
        one = np.zeros((1, n_heads * hd), np.float32)
        row = slice(start + i, start + i + 1)
        attention_avx512(qkv[row], n_heads, n_kv, hd, pos[row], seq[row], table, bs, kt, vt,
                         scale, scratch, one)
        np.testing.assert_array_equal(one[0], got[i])
