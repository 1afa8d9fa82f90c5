"""The single-source vector kernels (matmul_tiles.py, elementwise_simd.py, attention_*.py) on
every ISA path this host runs — avx512 (16 lanes), avx2 with vpdpbusd ymm, avx2 with the
vpmaddubsw pair, and generic as the reference: bit for bit the same outputs for every weight
type the backend reads and batches of 1, 3, 4, 5 and 17 rows (the 1-row and 4-row passes, their
mixes, and a batch long enough to split over threads).  NEON runs the same checks under qemu
(tests/arm64_neon_checks.py via tests/test_neon_kernels.py).  Plus: attention's blocks of
four query rows leave each row's bits unchanged, and each ISA's
specialization of a kernel is cached on disk separately."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("numba")
pytest.importorskip("gguf.quants")
import arm64_neon_checks as checks  # noqa: E402
import simd_reference  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402
from localinfer.backends.numba_cpu.dispatch import embed, project  # noqa: E402
from localinfer.backends.numba_cpu.isa import (  # noqa: E402
    REQUIREMENTS,
    Isa,
    host_features,
    host_has_vnni256,
)
from localinfer.backends.numba_cpu.project_q8k import project_q8k  # noqa: E402
from numba import njit  # noqa: E402

BATCHES = (1, 3, 4, 5, 17)


# not cache=True: a cached caller of the dispatch overloads reloaded in a later process
# crashed on x86 (the kernels it calls are cached themselves, so compiling these is quick)
@njit
def run(isa, ws, x, qbuf, out):
    project(isa, ws, 0, x, qbuf, out)


@njit
def run_q8k(isa, ws, x, qbuf, out):
    project_q8k(isa, ws, 0, x, qbuf, out)


@njit
def lookup(isa, ws, tokens, out):
    embed(isa, ws, tokens, out)


def _path(name: str, vnni: bool | None, label: str):
    have = host_features()
    ok = all(f in have for f in REQUIREMENTS[name]) and (not vnni or host_has_vnni256(have))
    return pytest.param((name, vnni), id=label,
                        marks=pytest.mark.skipif(not ok, reason=f"host lacks {label}"))


VECTOR = [_path("avx512", None, "avx512"), _path("avx2", True, "avx2-vnni"),
          _path("avx2", False, "avx2-pair")]


def _weights(name: str, rows: int, cols: int):
    from localinfer.backends.numba_cpu.quants import unpack_tensor
    from localinfer.backends.numba_cpu.weights import stack, stack_tiles

    raw = np.ascontiguousarray(checks.blocks(name, rows, cols, seed=len(name) * 7 + 3))
    p = unpack_tensor("w", int(QT[name]), name, raw.view(np.uint8).reshape(-1), (cols, rows))
    return stack([p]), stack_tiles([p])


@pytest.mark.parametrize("path", VECTOR)
@pytest.mark.parametrize("name", checks.TYPES)
def test_projection_and_embedding_equal_generic_for_every_batch(name, path):
    """q8_0 activations (and q8_K ones for K-quants): the path's quantize + matmul == generic's
    bit for bit; the path's embedding == generic's."""
    from localinfer.backends.numba_cpu.llama import make_buffers

    rows, cols = 70, 256  # 70 rows: a partial last tile (and an empty last half at 8 lanes)
    generic_ws, tiles = _weights(name, rows, cols)
    x = np.random.default_rng(5).standard_normal((max(BATCHES), cols)).astype(np.float32)
    x *= np.random.default_rng(6).uniform(0.1, 30, (len(x), 1)).astype(np.float32)
    isa, gen = Isa(*path), Isa("generic")
    projections = (run, run_q8k) if name in checks.K_QUANTS else (run,)
    for n in BATCHES:
        qbuf = make_buffers(n, cols, 1, 1, cols, cols, 2)[-1]
        for proj in projections:
            want = np.zeros((n, rows), np.float32)
            proj(gen, generic_ws, x[:n].copy(), qbuf, want)
            got = np.full((n, rows), np.nan, np.float32)
            proj(isa, tiles, x[:n].copy(), qbuf, got)
            np.testing.assert_array_equal(got, want, err_msg=f"{n} rows, {proj.py_func.__name__}")
    tokens = np.array([3, 0, 69, 17, 40], np.int64)
    want = np.zeros((len(tokens), cols), np.float32)
    got = np.full((len(tokens), cols), np.nan, np.float32)
    lookup(gen, generic_ws, tokens, want)
    lookup(isa, tiles, tokens, got)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("path", VECTOR)
def test_quantize_and_swiglu_are_exact_for_every_batch(path):
    """Activation codes, scales and sums == kernels/quantize.py's; SwiGLU == the numpy
    replica of its float32 operations (so every width gives the same bits)."""
    from localinfer.backends.numba_cpu.kernels.elementwise_simd import (
        quantize_rows_simd,
        swiglu_simd,
    )
    from localinfer.backends.numba_cpu.kernels.quantize import quantize_rows

    isa = Isa(*path)
    rng = np.random.default_rng(8)
    cols, n_ff = 128, 64
    for n in BATCHES:
        x = (rng.standard_normal((n, cols)) * rng.uniform(0, 50, (n, 1))).astype(np.float32)
        x[0, 32:64] = 0.0  # an all-zero block
        outs = [simd_reference.quantized(run, x)
                for run in (quantize_rows, lambda *a: quantize_rows_simd(isa, *a))]
        for want, got in zip(*outs, strict=True):
            np.testing.assert_array_equal(got, want)
        gu = (rng.standard_normal((n, 2 * n_ff)) * 8).astype(np.float32)
        gu[0, :8] = [-1e4, -100.0, -88.0, 0.0, 88.0, 100.0, 1e4, -1e-30]
        got = np.full((n, n_ff), np.nan, np.float32)
        swiglu_simd(isa, gu, n_ff, got)
        np.testing.assert_array_equal(got, simd_reference.swiglu(gu, n_ff))


@pytest.mark.parametrize("path", [VECTOR[0], VECTOR[2]], ids=["16-lanes", "8-lanes"])
def test_attention_row_blocks_do_not_change_a_row(path):
    """attention_pv.py computes scores and P V in blocks of four query rows (a partial last
    block repeats its last row): a row's bits are the same in a block of five rows as alone,
    and zero probabilities outside a row's keys add nothing.  Both match float64."""
    from localinfer.backends.numba_cpu.kernels.attention_pv import pv, qk_scores

    isa = Isa(*path)
    rng = np.random.default_rng(11)
    rows, hd, bs, n_blocks = 5, 64, 16, 6
    q = rng.standard_normal((rows, hd)).astype(np.float16).astype(np.float32)
    k_pool = rng.standard_normal((n_blocks, 2, hd, bs)).astype(np.float16).view(np.uint16)
    v_pool = rng.standard_normal((n_blocks, 2, bs, hd)).astype(np.float16).view(np.uint16)
    table = rng.permutation(n_blocks).astype(np.int64)
    n = 16 if path[0] == "avx512" else 8
    # chunk from position 0; score vectors of blocks 1..5, keys 16..82 (a partial last block)
    v_lo, v_hi, c1 = 16 // n, (83 + n - 1) // n, 83
    scale = np.float32(0.125)

    def run(qrows, probs=None):
        scores = np.full((len(qrows), n_blocks * bs), np.nan, np.float32)
        qk_scores(isa, qrows, k_pool, table, 1, bs, 0, v_lo, v_hi, scale, scores)
        acc = np.full((len(qrows), hd), np.nan, np.float32)
        p = scores if probs is None else probs
        pv(isa, np.ascontiguousarray(p), v_pool, table, 1, 1, 6, bs, 0, c1, acc)
        return scores[:, 16:v_hi * n], acc

    probs = rng.random((rows, n_blocks * bs)).astype(np.float32)
    probs[:, :16] = 0.0
    s_all, acc_all = run(q, probs)
    for r in range(rows):
        s_one, acc_one = run(q[r:r + 1], probs[r:r + 1])
        np.testing.assert_array_equal(s_one[0], s_all[r])
        np.testing.assert_array_equal(acc_one[0], acc_all[r])
    kf = k_pool.view(np.float16).astype(np.float64)[table, 1].transpose(0, 2, 1).reshape(-1, hd)
    vf = v_pool.view(np.float16).astype(np.float64)[table, 1].reshape(-1, hd)
    np.testing.assert_allclose(s_all[:, :c1 - 16], (q @ kf[16:c1].T) * 0.125, rtol=1e-4,
                               atol=1e-4)
    np.testing.assert_allclose(acc_all, probs[:, 16:c1] @ vf[16:c1], rtol=1e-4, atol=1e-4)
    probs[2, 40:] = 0.0  # a row that sees fewer keys: the same as its keys alone
    _, acc_cut = run(q, probs)
    np.testing.assert_array_equal(acc_cut[[0, 1, 3, 4]], acc_all[[0, 1, 3, 4]])
    np.testing.assert_allclose(acc_cut[2], probs[2, 16:40] @ vf[16:40], rtol=1e-4, atol=1e-4)


def test_each_isa_caches_its_own_specialization(tmp_path):
    """A kernel taking the IsaType compiles once per ISA and a later process loads both from
    the disk cache (cache=True keyed by the IsaType's name)."""
    from localinfer.backends.numba_cpu.isa import resolve_isa

    isas = ["avx2"] + (["avx512"] if resolve_isa("auto") == "avx512" else [])
    code = textwrap.dedent(f"""
        import numpy as np
        from localinfer.backends.numba_cpu.isa import Isa
        from localinfer.backends.numba_cpu.kernels.elementwise_simd import swiglu_simd
        gu = np.ones((2, 64), np.float32)
        for name in {isas!r}:
            swiglu_simd(Isa(name), gu, 32, np.zeros((2, 32), np.float32))
        s = swiglu_simd.stats
        print(len(s.cache_hits), len(s.cache_misses), len(swiglu_simd.signatures))
    """)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=300) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    n = len(isas)
    assert runs[0].stdout.split() == ["0", str(n), str(n)]  # compiled each, saved
    assert runs[1].stdout.split() == [str(n), "0", str(n)]  # loaded each


@pytest.mark.parametrize("path", VECTOR)
@pytest.mark.parametrize("code", [-128, -127, 127])
@pytest.mark.parametrize("bits", [4, 5])
def test_four_and_five_bit_sums_at_their_bounds_are_exact(path, code, bits):
    """The largest 4- and 5-bit block sums (every code 15 or 31 against activations all -128,
    -127 or 127: |sum| up to 126976 per block) come out exact on every path, in the 1-row and
    the 4-row passes — on the AVX2 pair the products are summed in int16 within a block
    (simd/dot.py vdot4_part: eight groups of 4-bit codes, four of 5-bit ones), whose bounds
    these are."""
    from localinfer.backends.numba_cpu.kernels.matmul_tiles import matmul_tiles
    from localinfer.backends.numba_cpu.quants.packed import KIND_Q4, KIND_Q5
    from localinfer.backends.numba_cpu.quants.tiles import tile_bytes
    from localinfer.backends.numba_cpu.tile_kind import TileKind

    tiles, nb, n = 2, 3, 5
    # both nibbles of every byte 15 and, for 5 bits, every fifth bit of the plane set: 31
    kind = KIND_Q4 if bits == 4 else KIND_Q5
    w = np.full((tiles, nb, tile_bytes(kind)), 0xFF, np.uint8)
    d = np.full((tiles, nb, 16), 0x3C00, np.uint16)  # f16 1.0
    m = np.zeros((0, 0, 0), np.uint16)
    xq = np.full((n, 32 * nb), code, np.int8)
    xd = np.ones((n, nb), np.float32)
    xi = np.full((n, nb), 32 * code, np.int32)
    xs = np.zeros((n, nb), np.float32)
    out = np.full((n, 16 * tiles), np.nan, np.float32)
    matmul_tiles(Isa(*path), TileKind(kind), np.int64(0), w, d, m, xq, xd, xi, xs, out)
    np.testing.assert_array_equal(out, np.float32(nb * (2**bits - 1) * 32 * code))
