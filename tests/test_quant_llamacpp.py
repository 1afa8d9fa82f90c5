"""The quantizer against llama.cpp (llama_cpp.llama_model_quantize, default params): for every
file type, each tensor has the same ggml type and bytes, the metadata is equivalent, and in fact
the whole file is byte-identical. Inputs: tiny generated llama models (fast, 256-wide rows so no
fallbacks, untied output) and an F16 SmolLM2 written once per session (576-wide rows: fallbacks)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf_factory import QT, write_tiny_llama
from localinfer.quant.mixes import ALIASES, FTYPES, NEEDS_IMATRIX
from localinfer.quant.quantizer import quantize_file
from quant_fixtures import llama_quantize, write_f16_gguf

from localinfer.gguf_file import open_gguf

pytest.importorskip("llama_cpp")

TYPES = [t for t in FTYPES if t not in NEEDS_IMATRIX]


def assert_same_model(ours: Path, ref: Path) -> None:
    with open_gguf(ours) as a, open_gguf(ref) as b:
        assert list(a.tensors) == list(b.tensors)
        for name, tb in b.tensors.items():
            ta = a.tensors[name]
            assert (ta.type_name, ta.shape) == (tb.type_name, tb.shape), name
            assert bytes(a.raw(name)) == bytes(b.raw(name)), name
        assert list(a.metadata) == list(b.metadata)
        assert a.kv_types == b.kv_types
        for key, value in b.metadata.items():
            assert str(a.metadata[key]) == str(value), key
        assert a.metadata["general.file_type"] == b.metadata["general.file_type"]
    assert ours.read_bytes() == ref.read_bytes()


@pytest.fixture(scope="module")
def tiny_f32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tinyq")
    return write_tiny_llama(folder / "tiny-f32.gguf", n_layers=8, n_embd=256, n_heads=4,
                            n_kv_heads=1, n_ff=512, tied=False)


@pytest.mark.parametrize("ftype", TYPES)
def test_tiny_model_matches_llama_cpp(tiny_f32: Path, tmp_path: Path, ftype: str) -> None:
    ref, ours = tmp_path / "ref.gguf", tmp_path / "ours.gguf"
    llama_quantize(tiny_f32, ref, FTYPES[ftype][0])
    quantize_file(tiny_f32, ours, ftype, progress=False)
    assert_same_model(ours, ref)


@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q2_K", "Q6_K"])
def test_tiny_model_pure_matches_llama_cpp(tiny_f32: Path, tmp_path: Path, ftype: str) -> None:
    ref, ours = tmp_path / "ref.gguf", tmp_path / "ours.gguf"
    llama_quantize(tiny_f32, ref, FTYPES[ftype][0], pure=True)
    quantize_file(tiny_f32, ours, ftype, pure=True, progress=False)
    assert_same_model(ours, ref)


def test_aliases_and_quantized_input(tmp_path: Path) -> None:
    src = write_tiny_llama(tmp_path / "q.gguf", n_embd=256, n_ff=512, weight_type=QT.Q4_1,
                           embd_type=QT.Q8_0)
    warnings: list[str] = []
    quantize_file(src, tmp_path / "ours.gguf", "q4_k", progress=False, warn=warnings.append)
    assert warnings and "dequantized" in warnings[0]
    llama_quantize(src, tmp_path / "ref.gguf", FTYPES[ALIASES["Q4_K"]][0], allow_requantize=True)
    assert_same_model(tmp_path / "ours.gguf", tmp_path / "ref.gguf")


@pytest.fixture(scope="session")
def smollm2_f16(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("smollm2f16") / "smollm2-f16.gguf"
    write_f16_gguf(smollm2_path, path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("ftype", TYPES)
def test_smollm2_f16_matches_llama_cpp(smollm2_f16: Path, tmp_path: Path, ftype: str) -> None:
    ref, ours = tmp_path / "ref.gguf", tmp_path / "ours.gguf"
    llama_quantize(smollm2_f16, ref, FTYPES[ftype][0])
    report = quantize_file(smollm2_f16, ours, ftype, progress=False)
    assert_same_model(ours, ref)
    if ftype.startswith("Q") and "_K" in ftype:  # 576-wide rows cannot hold 256-blocks
        assert report.fallbacks > 0


@pytest.mark.slow
def test_smollm2_requantized_q4_1_input(smollm2_path: Path, tmp_path: Path) -> None:
    ref, ours = tmp_path / "ref.gguf", tmp_path / "ours.gguf"
    llama_quantize(smollm2_path, ref, FTYPES["Q4_K_M"][0], allow_requantize=True)
    quantize_file(smollm2_path, ours, "Q4_K_M", progress=False, warn=lambda m: None)
    assert_same_model(ours, ref)
