"""The explicit-SIMD kernels (one source each; AVX-512 VNNI, AVX2 with and without VNNI) against gguf-py's
references, the generic kernels and exact attention, and the ISA selection.  Each vector path
runs where the host has its features (this project's CI host has them all)."""

from __future__ import annotations

import numpy as np
import pytest
import simd_reference

pytest.importorskip("numba")
gq = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType as QT  # noqa: E402
from localinfer.backends.numba_cpu import isa as isa_mod  # noqa: E402
from localinfer.backends.numba_cpu.isa import Isa, host_features, resolve_isa  # noqa: E402
from localinfer.backends.numba_cpu.kernels.attention_split import TILE_TOKENS  # noqa: E402

from localinfer.errors import InvalidRequestError  # noqa: E402

QUANTS = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0]
native = pytest.mark.skipif(resolve_isa("auto") != "avx512", reason="host lacks AVX-512 VNNI")


def _vector_isa(name: str, vnni: bool | None, needs: tuple[str, ...]):
    have = host_features()
    ok = all(f in have for f in isa_mod.REQUIREMENTS[name] + needs)
    label = name if vnni is None else f"{name}-{'vnni' if vnni else 'novnni'}"
    return pytest.param((name, vnni), id=label,
                        marks=pytest.mark.skipif(not ok, reason=f"host lacks {label}"))


# every vector path: avx512, avx2 with vpdpbusd ymm, avx2 with the vpmaddubsw pair
VECTOR = [_vector_isa("avx512", None, ()), _vector_isa("avx2", True, ("avxvnni",)),
          _vector_isa("avx2", False, ())]
# the attention kernels do not depend on the dot-product flavour
ATTENTION = [_vector_isa("avx512", None, ()), _vector_isa("avx2", None, ())]


def test_token_group_per_path():
    """The vpdpbusd paths take speculative guesses in groups of 4 tokens, the others one
    by one (ModelRunner.token_group)."""
    assert Isa("avx512").token_group == 4
    assert Isa("avx2", vnni=True).token_group == 4
    assert Isa("avx2", vnni=False).token_group == 1
    assert Isa("neon").token_group == Isa("generic").token_group == 1


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
    with pytest.raises(InvalidRequestError, match="fma"):
        resolve_isa("avx2")  # needs avx2, fma, f16c
    monkeypatch.setattr(isa_mod, "host_features", lambda: {"avx2", "fma", "f16c"})
    assert resolve_isa() == "generic"  # LOCALINFER_ISA=generic still set
    assert resolve_isa("avx2") == "avx2"
    monkeypatch.delenv("LOCALINFER_ISA")
    assert resolve_isa() == "avx2"  # auto: avx512 > avx2 > generic
    assert not isa_mod.host_has_vnni256({"avx2", "fma", "f16c"})
    assert isa_mod.host_has_vnni256({"avx2", "avxvnni"})
    assert isa_mod.host_has_vnni256({"avx512vnni", "avx512vl"})
    monkeypatch.setattr(isa_mod, "host_features", lambda: {"avx2"})
    assert resolve_isa() == "generic"  # auto on a host with neither path


def packed(qtype: QT, rows: int, cols: int, seed: int):
    from localinfer.backends.numba_cpu.quants import unpack_tensor

    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 2.0, (rows, 1))).astype(np.float32)
    raw = np.ascontiguousarray(gq.quantize(w, qtype))
    ref = gq.dequantize(raw, qtype).reshape(rows, cols).astype(np.float32)
    return unpack_tensor("w", int(qtype), qtype.name, raw.reshape(-1), (cols, rows)), ref


@pytest.mark.parametrize("path", VECTOR)
@pytest.mark.parametrize("qtype", QUANTS, ids=lambda t: t.name)
def test_tiled_matmul_equals_generic_bit_for_bit(qtype, path):
    from localinfer.backends.numba_cpu.dispatch import embed, project
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

    # 70 rows: a partial last tile; 21 activation rows: 5-bit codes decoded once per part
    # (matmul_tiles.DECODE_ROWS), then 4-row groups and one row; fewer rows alone take the
    # per-group unpacking
    rows, cols, n = 70, 160, 21
    p, ref = packed(qtype, rows, cols, seed=1)
    tiles = stack_tiles([p])
    kind, zero, w, d, m, _ = tiles
    np.testing.assert_array_equal(tile_dequantize(kind.kind, zero[0], w[0], d[0], m[0], rows), ref)
    x = np.random.default_rng(2).standard_normal((n, cols)).astype(np.float32)
    qbuf = make_buffers(n, cols, 1, 1, cols, cols, 2)[-1]
    generic = np.zeros((n, rows), np.float32)
    linear(stack([p]), 0, x, qbuf, generic)
    np.testing.assert_allclose(generic, x @ ref.T, rtol=0.05, atol=0.05 * np.abs(generic).max())
    isa = Isa(*path)
    fast = np.zeros((n, rows), np.float32)
    run(isa, tiles, x, qbuf, fast)
    np.testing.assert_array_equal(fast, generic)
    # fewer rows than a group of four, remainders of 1-3 after 4-row passes (18, 19 decoded)
    for k in (2, 3, 5, 6, 7, 9, 18, 19):
        few = np.zeros((k, rows), np.float32)
        run(isa, tiles, x[:k].copy(), qbuf, few)
        np.testing.assert_array_equal(few, generic[:k])
    for i in (0, 4, 8):  # one row alone (the 1-row path) == the same row in a 4-row group
        alone = np.zeros((1, rows), np.float32)
        run(isa, tiles, x[i : i + 1].copy(), qbuf, alone)
        np.testing.assert_array_equal(alone[0], fast[i])
    tokens = np.array([3, 0, 69, 17], np.int64)
    e_generic = np.zeros((4, cols), np.float32)
    e_fast = np.zeros((4, cols), np.float32)
    embed_rows(stack([p]), tokens, e_generic)
    lookup(isa, tiles, tokens, e_fast)
    np.testing.assert_array_equal(e_fast, e_generic)
    np.testing.assert_allclose(e_fast, ref[tokens], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("path", VECTOR)
def test_matmul_uses_the_dot_product_instructions(path):
    from localinfer.backends.numba_cpu.kernels.matmul_tiles import matmul_tiles
    from localinfer.backends.numba_cpu.quants.packed import KIND_Q4
    from localinfer.backends.numba_cpu.tile_kind import TileKind
    from numba import njit

    w = np.zeros((2, 1, 256), np.uint8)
    d = np.zeros((2, 1, 16), np.uint16)
    xq = np.zeros((5, 32), np.int8)
    xf = np.zeros((5, 1), np.float32)
    args = (Isa(*path), TileKind(KIND_Q4, mins=True), 0, w, d, d, xq, xf, np.zeros((5, 1), np.int32), xf,
            np.zeros((5, 32), np.float32))
    fresh = njit(parallel=True)(matmul_tiles.py_func)  # cached code has no asm to inspect
    fresh(*args)
    asm = fresh.inspect_asm(fresh.signatures[0])
    assert "vcvtph2ps" in asm
    assert "prefetcht0" in asm  # batched passes ask for the next weight tile ahead
    if path == ("avx2", False):
        assert "vpmaddubsw" in asm and "vpdpbusd" not in asm
    else:
        assert "vpdpbusd" in asm
    if path[0] == "avx2":
        assert "ymm" in asm
    else:
        assert "zmm" in asm


@pytest.mark.parametrize("path", ATTENTION)
def test_quantize_and_swiglu_match_generic(path):
    from localinfer.backends.numba_cpu.kernels.elementwise import swiglu
    from localinfer.backends.numba_cpu.kernels.elementwise_simd import (
        quantize_rows_simd,
        swiglu_simd,
    )
    from localinfer.backends.numba_cpu.kernels.quantize import quantize_rows

    isa = Isa(*path)

    def quantize_fast(*args):
        quantize_rows_simd(isa, *args)

    def swiglu_fast(*args):
        swiglu_simd(isa, *args)
    rng = np.random.default_rng(3)
    n, cols = 11, 96
    x = (rng.standard_normal((n, cols)) * rng.uniform(0, 50, (n, 1))).astype(np.float32)
    x[2, :32] = 0.0  # an all-zero block
    outs = [simd_reference.quantized(fn, x) for fn in (quantize_rows, quantize_fast)]
    for a, b in zip(*outs, strict=True):
        np.testing.assert_array_equal(a, b)
    xq, xd = outs[1][0], outs[1][1]  # codes * scale reproduce x to int8 precision
    approx = xq.reshape(n, 3, 32) * xd[:, :, None]
    np.testing.assert_allclose(approx.reshape(n, cols), x, atol=np.abs(x).max() / 100)
    gu = (rng.standard_normal((n, 64)) * 8).astype(np.float32)
    gu[0, :8] = [-1e4, -100.0, -88.0, 0.0, 88.0, 100.0, 1e4, -1e-30]
    ref, got = np.zeros((n, 32), np.float32), np.zeros((n, 32), np.float32)
    swiglu(gu, 32, ref)
    swiglu_fast(gu, 32, got)
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-30)


def _attention_kernels(path):
    """write_kv and attention of the vector kernels, bound to the path's IsaType."""
    from localinfer.backends.numba_cpu.kernels.attention_simd import attention_simd, write_kv_simd

    isa = Isa(*path)

    def write_fast(*args):
        write_kv_simd(isa, *args)

    def attend_fast(*args):
        attention_simd(isa, *args)
    return write_fast, attend_fast


def _exact_attention(qkv, pos, n_heads, n_kv, hd, table, bs, kg, vg, scale, window=0):
    """float64 attention over the f16 cache and f16-rounded queries (the kernels' inputs)."""
    k = kg.view(np.float16).astype(np.float64)
    v = vg.view(np.float16).astype(np.float64)
    out = np.zeros((len(pos), n_heads * hd))
    group = n_heads // n_kv
    for t, p in enumerate(pos):
        lo = max(0, p + 1 - window) if window else 0
        keys = np.arange(lo, p + 1)
        ks, vs = k[table[keys // bs], keys % bs], v[table[keys // bs], keys % bs]
        for h in range(n_heads):
            q = qkv[t, h * hd:(h + 1) * hd].astype(np.float16).astype(np.float64)
            s = ks[:, h // group] @ q * float(scale)
            w = np.exp(s - s.max())
            out[t, h * hd:(h + 1) * hd] = (w / w.sum()) @ vs[:, h // group]
    return out


@pytest.mark.parametrize("path", ATTENTION)
@pytest.mark.parametrize("start,n_tok,extra", [(0, 37, 0), (16, 1, 0), (300, 2, 0),
                                               (700, 5, 0), (1000, 1, 0), (1000, 2, -600)])
def test_attention_matches_generic(path, start, n_tok, extra):
    """As close to exact attention as the generic kernel is, for contexts within one key chunk
    and for longer ones (split into chunks, over threads when the step has few items).  Either way a token's result is the same alone or in
    a batch.  extra < 0: a scratch too narrow for the split mode."""
    from localinfer.backends.numba_cpu.kernels.attention import attention, write_kv

    write_fast, attend_fast = _attention_kernels(path)
    n_heads, n_kv, hd, bs, n_blocks = 6, 2, 32, 16, 72
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
    write_fast(qkv, n_heads, n_kv, hd, slots, bs, kt, vt)
    np.testing.assert_array_equal(kt, kg.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(vt, vg.transpose(0, 2, 1, 3))
    new = slice(start, start + n_tok)
    scale = np.float32(hd**-0.5)
    ref = np.zeros((n_tok, n_heads * hd), np.float32)
    attention(qkv[new], n_heads, n_kv, hd, pos[new], seq[new], table, bs, kg, vg, scale, ref)
    got = np.zeros_like(ref)
    scratch = np.zeros((2, TILE_TOKENS * (n_heads // n_kv), 2 * hd + n_blocks * bs + extra),
                       np.float32)
    attend_fast(qkv[new], n_heads, n_kv, hd, pos[new], seq[new], table, bs, kt, vt, scale,
                scratch, got)
    exact = _exact_attention(qkv[new], pos[new], n_heads, n_kv, hd, table[0], bs, kg, vg, scale)
    err_ref = np.abs(ref - exact).max()  # f16 probabilities: ~1e-4 of |V| here
    assert np.abs(got - exact).max() <= 2 * err_ref
    for i in range(n_tok):  # each token alone: bit-identical
        one = np.zeros((1, n_heads * hd), np.float32)
        row = slice(start + i, start + i + 1)
        attend_fast(qkv[row], n_heads, n_kv, hd, pos[row], seq[row], table, bs, kt, vt,
                    scale, scratch, one)
        np.testing.assert_array_equal(one[0], got[i])


@pytest.mark.parametrize("path", ATTENTION)
@pytest.mark.parametrize("window", [0, 40])
def test_attention_tiles_equal_each_token_alone(path, window):
    """A batch mixing two sequences' prefill runs (tiles of consecutive tokens sharing K / V
    loads, cut at the sequence change and at a position gap) and decode tokens: every token's
    output is bit for bit what it gets alone, and as close to exact attention as the generic
    kernel's — with and without a sliding window."""
    from localinfer.backends.numba_cpu.kernels.attention import attention, write_kv

    write_fast, attend_fast = _attention_kernels(path)
    n_heads, n_kv, hd, bs, n_blocks = 6, 2, 32, 16, 64
    rng = np.random.default_rng(window + 5)
    perm = rng.permutation(n_blocks).astype(np.int64)
    tables = np.stack([perm[:32], perm[32:]])
    # (sequence, positions): a 9-token run of A, a decode of B, a 6-token run of B that
    # continues past a gap, and A's next token
    plan = [(0, range(291, 300)), (1, range(150, 151)), (1, range(160, 166)), (0, range(300, 301))]
    seq = np.array([s for s, ps in plan for _ in ps], np.int64)
    pos = np.array([p for _, ps in plan for p in ps], np.int64)
    n_tok = len(pos)
    qkv_all = {s: rng.standard_normal((400, (n_heads + 2 * n_kv) * hd)).astype(np.float32)
               for s in (0, 1)}
    kg = np.zeros((n_blocks, bs, n_kv, hd), np.uint16)
    vg = np.zeros_like(kg)
    kt = np.zeros((n_blocks, n_kv, hd, bs), np.uint16)
    vt = np.zeros((n_blocks, n_kv, bs, hd), np.uint16)
    for s, last in ((0, 301), (1, 166)):  # every key up to each sequence's last position
        ps = np.arange(last, dtype=np.int64)
        slots = tables[s, ps // bs] * bs + ps % bs
        write_kv(qkv_all[s][:last], n_heads * hd, (n_heads + n_kv) * hd, n_kv, hd, slots, bs,
                 kg, vg)
        write_fast(qkv_all[s][:last], n_heads, n_kv, hd, slots, bs, kt, vt)
    qkv = np.stack([qkv_all[s][p] for s, p in zip(seq, pos, strict=True)])
    scale = np.float32(hd**-0.5)
    scratch = np.zeros((2, TILE_TOKENS * (n_heads // n_kv), 3 * hd + 4 + 512), np.float32)
    got = np.zeros((n_tok, n_heads * hd), np.float32)
    attend_fast(qkv, n_heads, n_kv, hd, pos, seq, tables, bs, kt, vt, scale, scratch, got,
                window)
    ref = np.zeros_like(got)
    attention(qkv, n_heads, n_kv, hd, pos, seq, tables, bs, kg, vg, scale, ref, window)
    for i in range(n_tok):
        one = np.zeros((1, n_heads * hd), np.float32)
        attend_fast(qkv[i:i + 1], n_heads, n_kv, hd, pos[i:i + 1], seq[i:i + 1], tables, bs,
                    kt, vt, scale, scratch, one, window)
        np.testing.assert_array_equal(one[0], got[i])
        exact = _exact_attention(qkv[i:i + 1], pos[i:i + 1], n_heads, n_kv, hd, tables[seq[i]],
                                 bs, kg, vg, scale, window)
        assert np.abs(got[i] - exact).max() <= 2 * np.abs(ref[i] - exact).max() + 1e-6


@pytest.mark.parametrize("path", ATTENTION)
def test_attention_split_over_threads_is_exact_for_any_thread_count(path):
    """One long-context token (the single-stream decode case): its key chunks go to threads
    (flash-decoding) and merge in order, so 1, 2 or 3 threads' scratch give identical bits,
    all as close to exact attention as the generic kernel."""
    from localinfer.backends.numba_cpu.kernels.attention import attention, write_kv

    write_fast, attend_fast = _attention_kernels(path)
    n_heads, n_kv, hd, bs, n_blocks = 9, 3, 64, 16, 80
    p = 1200
    rng = np.random.default_rng(7)
    table = rng.permutation(n_blocks)[None, :].astype(np.int64)
    pos = np.arange(p + 1, dtype=np.int64)
    slots = table[0, pos // bs] * bs + pos % bs
    qkv = rng.standard_normal((p + 1, (n_heads + 2 * n_kv) * hd)).astype(np.float32)
    qkv[:, : n_heads * hd] *= 3  # peakier attention than random
    kg = np.zeros((n_blocks, bs, n_kv, hd), np.uint16)
    vg = np.zeros_like(kg)
    kt = np.zeros((n_blocks, n_kv, hd, bs), np.uint16)
    vt = np.zeros((n_blocks, n_kv, bs, hd), np.uint16)
    write_kv(qkv, n_heads * hd, (n_heads + n_kv) * hd, n_kv, hd, slots, bs, kg, vg)
    write_fast(qkv, n_heads, n_kv, hd, slots, bs, kt, vt)
    last, seq = slice(p, p + 1), np.zeros(1, np.int64)
    scale = np.float32(hd**-0.5)
    ref = np.zeros((1, n_heads * hd), np.float32)
    attention(qkv[last], n_heads, n_kv, hd, pos[last], seq, table, bs, kg, vg, scale, ref)
    exact = _exact_attention(qkv[last], pos[last], n_heads, n_kv, hd, table[0], bs, kg, vg,
                             scale)
    outs = []
    for threads in (1, 2, 3):
        out = np.zeros_like(ref)
        scratch = np.zeros((threads, n_heads // n_kv, 2 * hd + n_blocks * bs), np.float32)
        attend_fast(qkv[last], n_heads, n_kv, hd, pos[last], seq, table, bs, kt, vt, scale,
                    scratch, out)
        outs.append(out)
    np.testing.assert_array_equal(outs[1], outs[0])
    np.testing.assert_array_equal(outs[2], outs[0])
    assert np.abs(outs[0] - exact).max() <= 2 * np.abs(ref - exact).max()
