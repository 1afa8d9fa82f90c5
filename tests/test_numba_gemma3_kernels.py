"""gemma3's per-token kernels against the plain ones they replace in the step, bit for bit:
the vector f16-table GEGLU (kernels/gelu_simd.py) for every f16 gate, the fused Q/K norm +
RoPE + Q scale (kernels/qk_norm.qk_norm_rope) and the fused post-norm + residual add + next
pre-norm (kernels/elementwise.add_rmsnorm), on batches below and above the threaded size.
Vector paths run where the host has their features (this project's CI host has them all)."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("numba")
from localinfer.backends.numba_cpu.isa import REQUIREMENTS, Isa, host_features  # noqa: E402
from localinfer.backends.numba_cpu.kernels.elementwise import (  # noqa: E402
    PARALLEL_ROWS,
    add_inplace,
    add_rmsnorm,
    rmsnorm,
    rope_neox,
)
from localinfer.backends.numba_cpu.kernels.gelu import geglu, gelu_f16_table  # noqa: E402
from localinfer.backends.numba_cpu.kernels.gelu_simd import geglu_simd, gelu_mul  # noqa: E402
from localinfer.backends.numba_cpu.kernels.qk_norm import (  # noqa: E402
    head_rmsnorm,
    qk_norm_rope,
    scale_columns,
)
from numba import njit  # noqa: E402

ROWS = [3, 2 * PARALLEL_ROWS + 1]  # one thread / split over threads


def _isa_param(name: str):
    ok = all(f in host_features() for f in REQUIREMENTS[name])
    return pytest.param(name, marks=pytest.mark.skipif(not ok, reason=f"host lacks {name}"))


ISAS = [_isa_param("avx512"), _isa_param("avx2"), "generic"]


@njit
def _gelu_mul(isa, gate_up, n_ff, table, out):
    gelu_mul(isa, gate_up, n_ff, table, out)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_table_is_ggml_gelu_in_f16() -> None:
    t = gelu_f16_table()
    x = np.float32([-3.0, -0.5, 0.0, 0.5, 1.0, 3.0])
    bits = x.astype(np.float16).view(np.uint16)
    y = 0.5 * x * (1 + np.tanh(0.7978845608 * x * (1 + 0.044715 * x * x)))
    np.testing.assert_allclose(t[bits], y, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("isa", ISAS)
def test_geglu_matches_scalar_kernel_for_every_f16_gate(isa: str) -> None:
    table = gelu_f16_table()
    rng = np.random.default_rng(0)
    n_ff = 2048
    every = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    special = np.float32([10.0, -10.0, 9.999, -9.999, 10.001, -10.001, 0.0, -0.0, 1e-8, -1e-8,
                          6.1e-5, 3e-6, 65519.0, 65520.0, 1e30, -1e30, np.inf, -np.inf])
    gates = np.concatenate([every.astype(np.float32), special,
                            (rng.standard_normal(4096 - special.size) * 4).astype(np.float32)])
    gates = gates.reshape(-1, n_ff)  # 34 rows: split over threads
    gate_up = np.concatenate([gates, rng.standard_normal(gates.shape).astype(np.float32)], 1)
    want = np.empty_like(gates)
    geglu(gate_up, n_ff, table, want)
    kernels = [] if isa == "generic" else [geglu_simd]
    outs = [np.empty_like(gates) for _ in range(len(kernels) + 1)]
    for k, out in zip(kernels, outs, strict=False):
        k(Isa(isa), gate_up, n_ff, table, out)
    _gelu_mul(Isa(isa), gate_up, n_ff, table, outs[-1])
    nan = np.isnan(want)  # NaN gates: NaN either way (the payload may differ)
    for out in outs:
        assert np.array_equal(np.isnan(out), nan)
        assert _same(out[~nan], want[~nan])
    for n in ROWS[:1]:  # a short batch stays on one thread
        out = np.empty((n, n_ff), np.float32)
        _gelu_mul(Isa(isa), gate_up[:n], n_ff, table, out)
        assert _same(out, want[:n])


@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize(("n_heads", "n_kv", "hd", "rope_dim"), [(4, 1, 256, 256),
                                                                 (6, 2, 64, 32)])
def test_qk_norm_rope_is_norm_then_rope_then_scale(n: int, n_heads: int, n_kv: int, hd: int,
                                                   rope_dim: int) -> None:
    rng = np.random.default_rng(n)
    qkv = (rng.standard_normal((n, (n_heads + 2 * n_kv) * hd)) * 3).astype(np.float32)
    qw = (1 + rng.standard_normal(hd) * 0.2).astype(np.float32)
    kw = (1 + rng.standard_normal(hd) * 0.2).astype(np.float32)
    ang = rng.uniform(0, 6, (n, rope_dim // 2))
    cos_t, sin_t = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    eps, scale = np.float32(1e-6), np.float32(1 / 16)
    want = qkv.copy()
    k_col = n_heads * hd
    head_rmsnorm(want, 0, n_heads, hd, qw, eps)
    head_rmsnorm(want, k_col, n_kv, hd, kw, eps)
    rope_neox(want, 0, n_heads, hd, rope_dim, cos_t, sin_t)
    rope_neox(want, k_col, n_kv, hd, rope_dim, cos_t, sin_t)
    scale_columns(want, k_col, scale)
    got = qkv.copy()
    qk_norm_rope(got, n_heads, n_kv, hd, qw, kw, eps, rope_dim, cos_t, sin_t, scale)
    assert _same(got, want)
    assert _same(got[:, k_col + n_kv * hd:], qkv[:, k_col + n_kv * hd:])  # V untouched


def _rmsnorm_ref(x: np.ndarray, w: np.ndarray, eps: np.float32) -> np.ndarray:
    """ggml's rms_norm in plain Python: squares summed in double, in order."""
    out = np.empty_like(x)
    for i, row in enumerate(x):
        total = 0.0
        for v in row:
            total += float(np.float32(v * v))
        mean = np.float32(total / row.size)
        s = np.float32(1.0) / np.float32(math.sqrt(np.float32(mean + eps)))
        out[i] = (row * s) * w
    return out


@pytest.mark.parametrize("n", ROWS)
def test_rmsnorm_rows(n: int) -> None:
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((n, 64)) * 5).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    eps = np.float32(1e-6)
    out = np.empty_like(x)
    rmsnorm(x, w, eps, out)
    assert _same(out, _rmsnorm_ref(x, w, eps))
    rmsnorm(x, w, eps, x)  # in place
    assert _same(x, out)


@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("with_next", [True, False])
def test_add_rmsnorm_is_norm_add_norm(n: int, with_next: bool) -> None:
    rng = np.random.default_rng(n)
    dim = 640
    x = (rng.standard_normal((n, dim)) * 4).astype(np.float32)
    y = (rng.standard_normal((n, dim)) * 40).astype(np.float32)
    w = (1 + rng.standard_normal(dim) * 0.3).astype(np.float32)
    nw = (1 + rng.standard_normal(dim) * 0.3).astype(np.float32) if with_next else w[:0]
    eps = np.float32(1e-6)
    want_x, want_y = x.copy(), y.copy()
    rmsnorm(want_y, w, eps, want_y)
    add_inplace(want_x, want_y)
    if with_next:
        rmsnorm(want_x, nw, eps, want_y)
    y0 = y.copy()
    add_rmsnorm(x, y, w, eps, nw, y)  # out = y, as the step calls it
    assert _same(x, want_x)
    assert _same(y, want_y if with_next else y0)  # no next norm: out is left alone


@pytest.mark.parametrize("isa", ["generic", _isa_param("avx512"), _isa_param("avx2")])
def test_step_gives_the_same_logits_for_any_rows_requested(tmp_path, isa: str) -> None:
    """The step carries only the requested rows past the last attention: their logits must be
    those of a step that returns every row (two sequences, rows asked out of order)."""
    from gguf_factory import write_tiny_gemma3
    from localinfer.backends.numba_cpu.runner import NumbaModelRunner
    from test_numba_parity import make_batch

    from localinfer.gguf_file import open_gguf
    from localinfer.model_config import ModelConfig

    g = open_gguf(write_tiny_gemma3(tmp_path / "g.gguf", n_layers=3))
    runner = NumbaModelRunner(g, ModelConfig.from_gguf(g), num_blocks=8, block_size=16,
                              threads=2, isa=isa)
    try:
        rng = np.random.default_rng(0)
        a, b = rng.integers(3, 200, 20).tolist(), rng.integers(3, 200, 13).tolist()
        seqs = [(a, 0, [0, 1]), (b, 0, [2])]
        full = runner.execute(make_batch(seqs))
        for rows in ([19, 32], [32, 5, 19], [7]):
            batch = make_batch(seqs)
            batch.logits_indices = rows
            assert _same(runner.execute(batch), full[rows])
    finally:
        runner.close()
        g.close()


def _q8k_ref(x: np.ndarray):
    """ggml's quantize_row_q8_K in numpy: per 256 values, iscale = -127 / (the value of largest
    magnitude, first on ties), codes min(127, round-half-even(iscale * x)), d = 1 / iscale."""
    n, cols = x.shape
    q = np.zeros((n, cols), np.int8)
    d = np.zeros((n, cols // 32), np.float32)
    for i in range(n):
        for b in range(cols // 256):
            blk = x[i, 256 * b:256 * (b + 1)]
            mx = blk[np.argmax(np.abs(blk))]
            if mx == 0:
                continue
            iscale = np.float32(-127.0) / mx
            q[i, 256 * b:256 * (b + 1)] = np.minimum(127, np.rint(iscale * blk))
            d[i, 8 * b:8 * (b + 1)] = np.float32(1.0) / iscale
    return q, d


@pytest.mark.parametrize("n", ROWS)
def test_q8k_quantization_matches_ggml(n: int) -> None:
    from localinfer.backends.numba_cpu.kernels.quantize_q8k import quantize_rows_q8k

    rng = np.random.default_rng(n)
    cols = 1024
    x = (rng.standard_normal((n, cols)) * 3).astype(np.float32)
    x[0, :256] = 0.0  # an all-zero block
    x[1, 300], x[1, 400] = -9.0, 9.0  # a tie: the first one sets the sign
    xq = np.empty((n, cols), np.int8)
    xd = np.empty((n, cols // 32), np.float32)
    xi = np.empty((n, cols // 32), np.int32)
    xs = np.empty((n, cols // 32), np.float32)
    quantize_rows_q8k(x, xq, xd, xi, xs)
    q, d = _q8k_ref(x)
    np.testing.assert_array_equal(xq, q)
    assert _same(xd, d)
    np.testing.assert_array_equal(xi, q.reshape(n, -1, 32).astype(np.int32).sum(2))
    assert _same(xs, d * xi.astype(np.float32))
