"""The NEON kernel checks, runnable without pytest on an AArch64 Python (native, or the arm64
python under qemu that tools/arm64_qemu.sh builds).  tests/test_neon_kernels.py runs them:
in-process on an aarch64 host, else in one emulated subprocess:

    ROOT/bin/python tests/arm64_neon_checks.py [NAME ...]

prints one JSON line per check ({"name", "ok", "error", "value", "seconds"}; value: what a
check hands back for the caller to compare, else null).  The same mirror of the
x86 tests (tests/test_numba_simd.py, tests/test_numba_quant_types.py): every weight type
against gguf.quants.dequantize and bit for bit against the generic path, the SDOT and f16
instructions in the code, quantization / SwiGLU / attention against the generic kernels and
exact attention, and a greedy decode of a tiny model (compared with the generic path's by the
caller).
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
ISA = "neon"


def use_repo() -> None:
    """Import localinfer (and localinfer.backends, .quant) from this checkout when it is not
    installed (the arm64 root has only third-party wheels): setup.py maps backends/ and quant/
    into the package, so the checkout's root joins its search path."""
    for p in (str(REPO / "tests"), str(REPO)):
        if p not in sys.path:
            sys.path.insert(0, p)
    import localinfer

    try:
        import localinfer.backends  # noqa: F401  (installed: nothing to do)
    except ImportError:
        localinfer.__path__.append(str(REPO))


# ---- weights --------------------------------------------------------------------------------

# byte offsets of each block's f16 fields (scales, mins), set to finite values in random blocks
F16_AT = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
          "IQ4_NL": (0,), "IQ4_XS": (0,), "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2),
          "Q5_K": (0, 2), "Q6_K": (208,)}
FLOATS = ("F32", "F16", "BF16")
TYPES = (*FLOATS, *F16_AT)
K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")
BATCHES = (1, 3, 4, 5, 17)  # the 1- and 4-row passes, their mixes, a batch split over threads


def blocks(name: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """(rows, row bytes) of one weight type: gguf-py's quantization of Gaussian rows
    where it has one, else random blocks (every code pattern) with finite f16 fields."""
    import gguf.quants as gq
    from gguf import GGML_QUANT_SIZES
    from gguf import GGMLQuantizationType as QT

    qtype = QT[name]
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 2.0, (rows, 1))).astype(np.float32)
    if name == "F32":
        return w.view(np.uint8)
    if name in ("F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        return gq.quantize(w, qtype)
    block, size = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for at in F16_AT[name]:
        n = b.shape[:2]
        v = rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-3, -1, n)
        b[:, :, at : at + 2] = v.astype(np.float16).view(np.uint8).reshape(*n, 2)
    return b.reshape(rows, -1)


def check_weight_type(name: str) -> None:
    """Tiles == the unpacked matrix; generic matmul ~ x @ gguf's dequantization; the NEON
    projection (q8_0 activations, and q8_K ones for K-quants) and embedding == generic's bit
    for bit, one row alone == the same row in a batch of four, and batches of BATCHES rows
    == generic's (as tests/test_numba_simd_paths.py checks the x86 paths)."""
    import gguf.quants as gq
    from gguf import GGMLQuantizationType as QT
    from localinfer.backends.numba_cpu.isa import Isa
    from localinfer.backends.numba_cpu.linear import embed_rows, linear
    from localinfer.backends.numba_cpu.llama import make_buffers
    from localinfer.backends.numba_cpu.quants import unpack_tensor
    from localinfer.backends.numba_cpu.quants.tiles import tile_dequantize
    from localinfer.backends.numba_cpu.weights import stack, stack_tiles

    run, run_q8k, lookup = _jitted()
    rows, cols, n = 70, 256 if name in K_QUANTS else 160, 9  # 70 rows: a partial last tile
    raw = np.ascontiguousarray(blocks(name, rows, cols, seed=len(name) * 7 + ord(name[-1])))
    p = unpack_tensor("w", int(QT[name]), name, raw.view(np.uint8).reshape(-1), (cols, rows))
    ref = gq.dequantize(raw, QT[name]).reshape(rows, cols).astype(np.float32)
    generic_ws, tiles = stack([p]), stack_tiles([p])
    kind, zero, w, d, m, _ = tiles
    if name not in FLOATS:
        np.testing.assert_array_equal(tile_dequantize(kind.kind, zero[0], w[0], d[0], m[0], rows),
                                      p.dequantize())
    x = np.random.default_rng(2).standard_normal((n, cols)).astype(np.float32)
    qbuf = make_buffers(n, cols, 1, 1, cols, cols, 2)[-1]
    isa, gen = Isa(ISA), Isa("generic")
    expect = x @ ref.T
    for project in (run, run_q8k) if name in K_QUANTS else (run,):
        generic = np.zeros((n, rows), np.float32)
        project(gen, generic_ws, x, qbuf, generic)
        err = np.abs(generic - expect).max() / np.abs(expect).max()
        assert err < (1e-5 if name in FLOATS else 3e-2), f"generic vs gguf: {err}"
        fast = np.zeros((n, rows), np.float32)
        project(isa, tiles, x, qbuf, fast)
        np.testing.assert_array_equal(fast, generic)
        for i in (0, 4, 8):  # one row alone (the 1-row path) == the same row in a 4-row group
            alone = np.zeros((1, rows), np.float32)
            project(isa, tiles, x[i : i + 1].copy(), qbuf, alone)
            np.testing.assert_array_equal(alone[0], fast[i])
        xb = np.random.default_rng(5).standard_normal((max(BATCHES), cols)).astype(np.float32)
        for b in BATCHES:
            qb = make_buffers(b, cols, 1, 1, cols, cols, 2)[-1]
            want, got = np.zeros((b, rows), np.float32), np.zeros((b, rows), np.float32)
            project(gen, generic_ws, xb[:b].copy(), qb, want)
            project(isa, tiles, xb[:b].copy(), qb, got)
            np.testing.assert_array_equal(got, want, err_msg=f"{b} rows")
    if name == "Q4_0":  # the generic path on this machine, against its own linear()
        direct = np.zeros((n, rows), np.float32)
        linear(generic_ws, 0, x, qbuf, direct)
        np.testing.assert_array_equal(direct, generic)
    tokens = np.array([3, 0, 69, 17], np.int64)
    e_generic = np.zeros((4, cols), np.float32)
    e_fast = np.zeros((4, cols), np.float32)
    embed_rows(generic_ws, tokens, e_generic)
    lookup(isa, tiles, tokens, e_fast)
    np.testing.assert_array_equal(e_fast, e_generic)
    np.testing.assert_allclose(e_fast, p.dequantize()[tokens], rtol=1e-6, atol=1e-7)


def _jitted():
    import arm64_neon_jit as jit

    return jit.run, jit.run_q8k, jit.lookup


def check_isa_auto() -> None:
    """An AArch64 host with dotprod picks neon; forcing x86 paths there fails clearly."""
    from localinfer.backends.numba_cpu.isa import host_features, resolve_isa

    from localinfer.errors import InvalidRequestError

    assert {"neon", "dotprod"} <= host_features(), host_features()
    assert resolve_isa("auto") == ISA
    assert resolve_isa("generic") == "generic"
    try:
        resolve_isa("avx2")
    except InvalidRequestError as e:
        assert "avx2" in str(e)
    else:
        raise AssertionError("avx2 resolved on an arm64 host")


def check_instructions() -> None:
    """The vector primitives compiled for neon (8 lanes) give SDOT (both byte dot products), fcvtl /
    fcvtn (f16 to and from f32) and prfm (prefetch): a small fresh function, as cached code
    has no assembly."""
    from localinfer.backends.numba_cpu.isa import Isa
    from localinfer.backends.numba_cpu.simd.dot import vdot_q8, vdpbusd
    from localinfer.backends.numba_cpu.simd.prefetch import prefetch
    from localinfer.backends.numba_cpu.simd.vectors import (
        vbcast4,
        vload_bytes,
        vload_f16,
        vsplat_f32,
        vstore_f16,
    )
    from localinfer.backends.numba_cpu.simd.vmath import vadd, vhsum_i32
    from numba import njit

    @njit
    def probe(isa, w, x, h):
        prefetch(w, 64)
        acc = vdpbusd(isa, vdot_q8(isa, vbcast4(isa, x, 0), vload_bytes(isa, w, 0),
                                   vbcast4(isa, x, 4)),
                      vload_bytes(isa, w, 32), vbcast4(isa, x, 8))
        half = vload_f16(isa, h, 0)
        vstore_f16(h, 8, vadd(half, vsplat_f32(isa, np.float32(1e-3))))
        return vhsum_i32(acc)

    w = np.arange(64, dtype=np.uint8)
    x = np.arange(-6, 6, dtype=np.int8)
    h = np.zeros(16, np.uint16)
    h[:8] = np.arange(8, dtype=np.float16).view(np.uint16)
    got = probe(Isa(ISA), w, x, h)
    # the same sums in numpy: 8-bit weights are w - 128, 4-bit codes w as they are
    lanes_x = [x[0:4], x[4:8], x[8:12]]
    q8 = ((w[:32].astype(np.int64) - 128).reshape(8, 4) * lanes_x[1]).sum()
    q4 = (w[32:].astype(np.int64).reshape(8, 4) * lanes_x[2]).sum()
    start = 8 * int(x[:4].view(np.int32)[0])  # the accumulator's start: x bytes 0..3, 8 lanes
    assert got == np.int32(start + q8 + q4), (got, start + q8 + q4)
    np.testing.assert_array_equal(h[8:].view(np.float16), (np.arange(8) + np.float32(1e-3)).astype(np.float16))
    asm = probe.inspect_asm(probe.signatures[0])
    for op in ("sdot", "fcvtl", "fcvtn", "prfm"):
        assert op in asm, f"no {op} in the code"


def check_quantize_and_swiglu() -> None:
    import simd_reference
    from localinfer.backends.numba_cpu.isa import Isa
    from localinfer.backends.numba_cpu.kernels.elementwise import swiglu
    from localinfer.backends.numba_cpu.kernels.elementwise_simd import (
        quantize_rows_simd,
        swiglu_simd,
    )
    from localinfer.backends.numba_cpu.kernels.quantize import quantize_rows

    isa = Isa(ISA)

    def quantize_rows_neon(*args):
        quantize_rows_simd(isa, *args)

    rng = np.random.default_rng(3)
    n, cols = 11, 96
    x = (rng.standard_normal((n, cols)) * rng.uniform(0, 50, (n, 1))).astype(np.float32)
    x[2, :32] = 0.0  # an all-zero block
    outs = [simd_reference.quantized(fn, x) for fn in (quantize_rows, quantize_rows_neon)]
    for a, b in zip(*outs, strict=True):
        np.testing.assert_array_equal(a, b)
    gu = (rng.standard_normal((n, 64)) * 8).astype(np.float32)
    gu[0, :8] = [-1e4, -100.0, -88.0, 0.0, 88.0, 100.0, 1e4, -1e-30]
    ref, got = np.zeros((n, 32), np.float32), np.zeros((n, 32), np.float32)
    swiglu(gu, 32, ref)
    swiglu_simd(isa, gu, 32, got)
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-30)
    np.testing.assert_array_equal(got, simd_reference.swiglu(gu, 32))  # the x86 paths' bits


def _exact_attention(qkv, pos, n_heads, n_kv, hd, table, bs, kg, vg, scale):
    """float64 attention over the f16 cache and f16-rounded queries (the kernels' inputs)."""
    k = kg.view(np.float16).astype(np.float64)
    v = vg.view(np.float16).astype(np.float64)
    out = np.zeros((len(pos), n_heads * hd))
    group = n_heads // n_kv
    for t, p in enumerate(pos):
        keys = np.arange(p + 1)
        ks, vs = k[table[keys // bs], keys % bs], v[table[keys // bs], keys % bs]
        for h in range(n_heads):
            q = qkv[t, h * hd:(h + 1) * hd].astype(np.float16).astype(np.float64)
            s = ks[:, h // group] @ q * float(scale)
            e = np.exp(s - s.max())
            out[t, h * hd:(h + 1) * hd] = (e / e.sum()) @ vs[:, h // group]
    return out


def check_attention(start: int, n_tok: int, threads: int) -> None:
    """The NEON KV write == the generic one (transposed); attention as close to exact as the
    generic kernel; a token alone == the same token in the batch, for any thread count."""
    from localinfer.backends.numba_cpu.isa import Isa
    from localinfer.backends.numba_cpu.kernels.attention import attention, write_kv
    from localinfer.backends.numba_cpu.kernels.attention_simd import attention_simd, write_kv_simd

    isa = Isa(ISA)

    n_heads, n_kv, hd, bs, n_blocks = 6, 2, 32, 16, 40
    rng = np.random.default_rng(start)
    table = rng.permutation(n_blocks)[None, :].astype(np.int64)
    pos = np.arange(start + n_tok, dtype=np.int64)
    slots = table[0, pos // bs] * bs + pos % bs
    qkv = rng.standard_normal((len(pos), (n_heads + 2 * n_kv) * hd)).astype(np.float32)
    qkv[:, : n_heads * hd] *= 3  # peakier attention than random
    seq = np.zeros(len(pos), np.int64)
    kg = np.zeros((n_blocks, bs, n_kv, hd), np.uint16)
    vg = np.zeros_like(kg)
    kt = np.zeros((n_blocks, n_kv, hd, bs), np.uint16)
    vt = np.zeros((n_blocks, n_kv, bs, hd), np.uint16)
    write_kv(qkv, n_heads * hd, (n_heads + n_kv) * hd, n_kv, hd, slots, bs, kg, vg)
    write_kv_simd(isa, qkv, n_heads, n_kv, hd, slots, bs, kt, vt)
    np.testing.assert_array_equal(kt, kg.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(vt, vg.transpose(0, 2, 1, 3))
    new = slice(start, start + n_tok)
    scale = np.float32(hd**-0.5)
    ref = np.zeros((n_tok, n_heads * hd), np.float32)
    attention(qkv[new], n_heads, n_kv, hd, pos[new], seq[new], table, bs, kg, vg, scale, ref)
    exact = _exact_attention(qkv[new], pos[new], n_heads, n_kv, hd, table[0], bs, kg, vg, scale)
    outs = []
    for t in range(1, threads + 1):
        got = np.zeros_like(ref)
        scratch = np.zeros((t, n_heads // n_kv, 2 * hd + n_blocks * bs), np.float32)
        attention_simd(isa, qkv[new], n_heads, n_kv, hd, pos[new], seq[new], table, bs, kt,
                       vt, scale, scratch, got)
        assert np.abs(got - exact).max() <= 2 * np.abs(ref - exact).max()
        outs.append(got)
    for got in outs[1:]:
        np.testing.assert_array_equal(got, outs[0])
    for i in range(n_tok):  # each token alone: bit-identical
        one = np.zeros((1, n_heads * hd), np.float32)
        row = slice(start + i, start + i + 1)
        scratch = np.zeros((1, n_heads // n_kv, 2 * hd + n_blocks * bs), np.float32)
        attention_simd(isa, qkv[row], n_heads, n_kv, hd, pos[row], seq[row], table, bs, kt,
                       vt, scale, scratch, one)
        np.testing.assert_array_equal(one[0], outs[0][i])


PROMPT = [5, 60, 61, 62, 9, 100, 7]
DECODE_STEPS = 8


def greedy_decode(isa: str) -> dict:
    """A tiny Q4_1 llama (tests/gguf_factory.py; Q8_0 embedding, untied head) prefilled with
    PROMPT, then decoded greedily through the runner on `isa`: the tokens and their logits."""
    import tempfile

    from gguf import GGMLQuantizationType as QT
    from gguf_factory import write_tiny_llama
    from localinfer.backends.numba_cpu.runner import NumbaModelRunner

    from localinfer.gguf_file import open_gguf
    from localinfer.model_config import ModelConfig

    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_llama(Path(tmp) / "tiny.gguf", weight_type=QT.Q4_1,
                                embd_type=QT.Q8_0, tied=False)
        g = open_gguf(path)
        r = NumbaModelRunner(g, ModelConfig.from_gguf(g), num_blocks=8, block_size=16,
                             threads=2, isa=isa)
        assert r.isa == isa
        tokens, logits = _greedy(r, PROMPT, DECODE_STEPS)
        r.close()
        g.close()
    return {"tokens": tokens, "logits": logits.tolist()}


def check_greedy_decode() -> dict:
    """The NEON run; the caller compares it with the generic path's (test_neon_kernels.py
    computes that natively: compiling a second step under emulation would double the time)."""
    return greedy_decode(ISA)


def _greedy(runner, prompt: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """Prefill `prompt` in one step, then `steps` greedy decode steps; one sequence."""
    from localinfer.engine.batch import ScheduledBatch

    table, bs = list(range(8)), runner.block_size

    def step(toks: list[int], start: int) -> np.ndarray:
        pos = list(range(start, start + len(toks)))
        return runner.execute(ScheduledBatch(
            seq_ids=[0], token_ids=toks, positions=pos, seq_starts=[0, len(toks)],
            context_lens=[start + len(toks)], block_tables=[table],
            slot_mapping=[table[p // bs] * bs + p % bs for p in pos],
            logits_indices=[len(toks) - 1], block_size=bs))[-1]

    logits, n, out, rows = step(list(prompt), 0), len(prompt), [], []
    for _ in range(steps):
        rows.append(logits.copy())
        out.append(int(np.argmax(logits)))
        logits = step([out[-1]], n)
        n += 1
    return out, np.array(rows)


CHECKS: dict[str, Callable[[], dict | None]] = {
    "isa_auto": check_isa_auto,
    "instructions": check_instructions,
    **{f"weights_{t}": (lambda t=t: check_weight_type(t)) for t in TYPES},
    "quantize_and_swiglu": check_quantize_and_swiglu,
    # within one key chunk; several chunks (split over threads for one token); a batch
    "attention_short": lambda: check_attention(0, 37, 1),
    "attention_split": lambda: check_attention(600, 1, 3),
    "attention_batch": lambda: check_attention(300, 3, 2),
    "greedy_decode": check_greedy_decode,
}


def run(names: list[str]) -> list[dict]:
    use_repo()
    results = []
    for name in names:
        t0 = time.perf_counter()
        value = error = None
        try:
            value = CHECKS[name]()
        except Exception:
            error = traceback.format_exc()
        results.append({"name": name, "ok": error is None, "error": error, "value": value,
                        "seconds": round(time.perf_counter() - t0, 1)})
        print(json.dumps(results[-1]), flush=True)
    return results


if __name__ == "__main__":
    run(sys.argv[1:] or list(CHECKS))
