"""SplitStack (backends/numba_cpu/split_stack.py): a role whose layers have different weight
types is stored as two TileStacks, each layer in its own kind, and projects bit for bit as the
generic path (which stores the role whole in its widest kind)."""

from __future__ import annotations

import dataclasses

import ggml_ref
import numpy as np
import pytest

pytest.importorskip("numba")
from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf import quants  # noqa: E402
from gguf_factory import build_gguf, tiny_llama_parts  # noqa: E402
from localinfer.backends.numba_cpu.isa import Isa, host_features  # noqa: E402
from localinfer.backends.numba_cpu.llama import make_buffers  # noqa: E402
from localinfer.backends.numba_cpu.project_q8k import project_as  # noqa: E402
from localinfer.backends.numba_cpu.quants import KIND_Q4, KIND_Q5, KIND_Q8  # noqa: E402
from localinfer.backends.numba_cpu.tile_kind import with_markers  # noqa: E402
from localinfer.backends.numba_cpu.weights import LlamaWeights  # noqa: E402

from localinfer.gguf_file import open_gguf  # noqa: E402
from localinfer.model_config import ModelConfig  # noqa: E402

N_EMBD = N_FF = 256  # K-quant rows are 256 wide
PATHS = [pytest.param(("avx512", None), id="avx512",
                      marks=pytest.mark.skipif("avx512vnni" not in host_features(),
                                               reason="host lacks AVX-512 VNNI")),
         pytest.param(("avx2", False), id="avx2-pair",
                      marks=pytest.mark.skipif("avx2" not in host_features(),
                                               reason="host lacks AVX2"))]


def _quantize(values: np.ndarray, qtype: QT) -> bytes:
    if qtype in (QT.Q4_K, QT.Q6_K):  # gguf-py has no K-quant quantizer: llama.cpp's own
        if not ggml_ref.available():
            pytest.skip("llama-cpp-python's libggml-base is not installed")
        return ggml_ref.ggml_quantize(values, int(qtype)).tobytes()
    return quants.quantize(values, qtype).tobytes()


def _mixed_model(tmp_path, base: QT, wide: dict[str, QT]):
    """Two layers of `base` weights, except layer 0's tensors in `wide` (name -> type)."""
    kvs, tensors = tiny_llama_parts(n_embd=N_EMBD, n_ff=N_FF)  # f32, quantized here
    rng = np.random.default_rng(5)
    for i, t in enumerate(tensors):
        if not t.name.startswith("blk.") or t.name.endswith("norm.weight"):
            continue
        role = t.name.split(".")[2]
        qtype = wide.get(role, base) if t.name.startswith("blk.0.") else base
        values = (rng.standard_normal(tuple(reversed(t.shape))) * 0.02).astype(np.float32)
        tensors[i] = dataclasses.replace(t, ggml_type=qtype, data=_quantize(values, qtype))
    path = tmp_path / "mixed.gguf"
    path.write_bytes(build_gguf(kvs, tensors))
    g = open_gguf(path)
    return g, ModelConfig.from_gguf(g)


CASES = {
    # qwen2.5-coder-0.5b: Q5_0, with Q8_0 attn_v on every other layer
    "q5_0+q8_0": (QT.Q5_0, {"attn_v": QT.Q8_0, "ffn_down": QT.Q8_0}, KIND_Q5, False),
    # Q4_K_M files: Q4_K, with Q6_K ffn_down and attn_v on every other layer (both with mins)
    "q4_k+q6_k": (QT.Q4_K, {"attn_v": QT.Q6_K, "ffn_down": QT.Q6_K}, KIND_Q4, True),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CASES)
def test_mixed_roles_split_by_kind_and_project_as_the_generic_path(tmp_path, case, path):
    from numba import njit

    base, wide, narrow_kind, mins = CASES[case]
    g, c = _mixed_model(tmp_path, base, wide)
    tiled = LlamaWeights.load(g, c, tiled=True)
    generic = LlamaWeights.load(g, c, tiled=False)

    for role in ("wqkv", "wdown"):  # layer 0 of the wide kind, layer 1 narrow
        ws, narrow, where = getattr(tiled, role)
        assert (ws[0].kind, narrow[0].kind, narrow[0].mins) == (KIND_Q8, narrow_kind, mins)
        assert where.tolist() == [0, -1]
        assert ws[2].shape[0] == narrow[2].shape[0] == 1  # each layer stored once
    assert len(tiled.wgu) == 6 and tiled.wgu[0].kind == narrow_kind  # one kind: not split
    # split, the Q4_K layers keep 4-bit tiles: fewer bytes than the role stored whole in 8 bits
    assert tiled.nbytes() < generic.nbytes()

    @njit
    def run(isa, ws, layer, x, qbuf, out, q8k, role):
        project_as(isa, ws, layer, x, qbuf, out, q8k, role)

    fast_w = with_markers(tiled)
    isa, ref_isa = Isa(*path), Isa("generic")
    n = 21  # 5-bit codes decoded once per part (16+ rows), then 4-row groups and one row
    qbuf = make_buffers(n, N_FF, 1, 1, N_FF, N_FF, 2)[-1]
    x = np.random.default_rng(2).standard_normal((n, N_FF)).astype(np.float32)
    for r, role in enumerate(("wqkv", "wo", "wgu", "wdown")):
        rows = {"wqkv": 256 + 2 * 128, "wgu": 2 * N_FF}.get(role, N_EMBD)
        for layer in range(c.n_layers):
            want = np.zeros((n, rows), np.float32)
            got = np.zeros((n, rows), np.float32)
            run(ref_isa, getattr(generic, role), layer, x, qbuf, want, generic.q8k, r)
            run(isa, getattr(fast_w, role), layer, x, qbuf, got, fast_w.q8k, r)
            np.testing.assert_array_equal(got, want, err_msg=f"{role} layer {layer}")
            assert np.abs(want).max() > 0
