"""The Triton backend's dequantizing matmul (GEMV and tl.dot paths) and embedding gather, for
every weight type it reads, against gguf.quants.dequantize — under the interpreter without a
GPU (tiny shapes), on the GPU when there is one."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as QT
from localinfer.backends.triton_cuda.linear import embed, linear, project
from localinfer.backends.triton_cuda.relayout import relayout
from localinfer.backends.triton_cuda.weights import (
    SUPPORTED_TYPES,
    GpuWeight,
    TritonWeights,
    merge_rows,
)
from test_triton_relayout import random_blocks, reference
from triton_env import DEVICE

from localinfer.errors import UnsupportedModelError

TYPES = [QT[name] for name in SUPPORTED_TYPES]
ROWS, COLS = 40, 256  # rows not a multiple of any tile; K-quants need 256 columns


def weight(qtype: QT, rows: int = ROWS, cols: int = COLS, seed: int = 0):
    raw = random_blocks(qtype, rows, cols, seed=seed + int(qtype))
    r = relayout(qtype.name, raw, (cols, rows))
    return GpuWeight.upload(r, DEVICE), torch.from_numpy(reference(raw, qtype, rows, cols))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 3, 20])  # GEMV widths 1 and 4 (3 padded), the tl.dot path
def test_linear_matches_dequantized_matmul(qtype, m):
    w, ref = weight(qtype)
    if qtype.name in ("Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"):
        ref = ref.half().float()  # read through f16 (relayout.py)
    x = torch.randn(m, COLS)
    out = torch.full((m, ROWS), float("nan"), device=DEVICE)
    linear(x.to(DEVICE), w, out)
    want = x.double() @ ref.double().T
    # the GEMV path is f32 FMA; tl.dot may take tf32 inputs on a GPU
    tol = 1e-4 if m <= 8 or DEVICE.type == "cpu" else 2e-3
    scale = want.abs().max().item() + 1e-30
    assert (out.cpu().double() - want).abs().max().item() <= tol * scale


def test_linear_bias_and_column_slices():
    w, ref = weight(QT.Q4_K)
    x = torch.randn(5, 2 * COLS)[:, COLS:]  # a row stride wider than the row
    bias = torch.randn(ROWS)
    out = torch.zeros(5, ROWS + 10, device=DEVICE)
    linear(x.to(DEVICE), w, out[:, 3: 3 + ROWS], bias.to(DEVICE))
    out = out.cpu()
    torch.testing.assert_close(out[:, 3: 3 + ROWS], x @ ref.T + bias, atol=1e-4, rtol=1e-4)
    assert out[:, :3].abs().sum() == 0 and out[:, 3 + ROWS:].abs().sum() == 0


def test_parts_of_different_formats_merge_only_when_equal():
    # a Q4_K_M-style Q|K|V: Q and K share a format and merge into one matrix, V stays apart
    raws = [(QT.Q4_K, 32), (QT.Q4_K, 16), (QT.Q6_K, 16)]
    parts, refs = [], []
    for i, (qt, rows) in enumerate(raws):
        raw = random_blocks(qt, rows, COLS, seed=i)
        parts.append(relayout(qt.name, raw, (COLS, rows)))
        refs.append(torch.from_numpy(reference(raw, qt, rows, COLS)))
    merged = merge_rows(parts)
    assert [(first, r.rows) for first, r in merged] == [(0, 48), (48, 16)]
    proj = [(first, GpuWeight.upload(r, DEVICE)) for first, r in merged]
    x = torch.randn(2, COLS)
    out = torch.empty(2, 64, device=DEVICE)
    project(x.to(DEVICE), proj, out)
    torch.testing.assert_close(out.cpu(), x @ torch.cat(refs).T, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("qtype", [QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q5_1, QT.Q6_K,
                                   QT.Q5_K], ids=lambda t: t.name)
def test_embedding_rows(qtype):
    w, ref = weight(qtype)
    tokens = torch.tensor([3, 0, 39, 3, 17], dtype=torch.int32)
    out = torch.empty(5, COLS, device=DEVICE)
    embed(tokens.to(DEVICE), w, out, scale=2.0)
    torch.testing.assert_close(out.cpu(), ref[tokens.long()] * 2.0, atol=0, rtol=0)


def test_unknown_weight_type_is_refused_naming_it(tmp_path):
    from gguf import GGML_QUANT_SIZES
    from gguf_factory import TensorSpec, build_gguf, tiny_llama_parts

    from localinfer.gguf_file import open_gguf
    from localinfer.model_config import ModelConfig

    kvs, tensors = tiny_llama_parts(n_ff=256)
    block, size = GGML_QUANT_SIZES[QT.IQ2_XXS]
    tensors = [TensorSpec(t.name, t.shape, QT.IQ2_XXS, bytes(64 * size * 256 // block))
               if t.name == "blk.1.ffn_down.weight" else t for t in tensors]
    path = tmp_path / "m.gguf"
    path.write_bytes(build_gguf(kvs, tensors))
    with open_gguf(path) as g, pytest.raises(UnsupportedModelError,
                                             match="blk.1.ffn_down.weight.*IQ2_XXS"):
        TritonWeights.load(g, ModelConfig.from_gguf(g), DEVICE)
