"""Importance matrices: the numpy reference forward agrees with the engine, `localinfer imatrix`
writes llama.cpp's GGUF imatrix format, and `quantize --imatrix` is byte-identical to
llama_model_quantize given the same imatrix (passed through its C API)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf_factory import write_tiny_llama
from localinfer.quant import imatrix
from localinfer.quant.formats import format_for
from localinfer.quant.formats.weighted import WEIGHTED
from localinfer.quant.mixes import FTYPES
from localinfer.quant.quality import log_softmax
from localinfer.quant.quantizer import quantize_file
from localinfer.quant.reference_forward import forward
from localinfer.quant.sample_text import SAMPLE_TEXT
from quant_fixtures import llama_quantize, shared_f16
from test_cli import assert_clean_error, cli
from test_quant_llamacpp import assert_same_model

from localinfer.errors import InvalidRequestError
from localinfer.gguf_file import open_gguf

pytest.importorskip("llama_cpp")

WEIGHTED_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q2_K_S", "Q3_K_S", "Q3_K_M",
                  "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tinyim")
    return write_tiny_llama(folder / "tiny.gguf", n_layers=8, n_embd=256, n_heads=4,
                            n_kv_heads=1, n_ff=512, tied=False)


def synthetic_imatrix(model: Path, path: Path) -> imatrix.Imatrix:
    """Skewed positive sums for every block matrix, as llama-imatrix would store them."""
    rng = np.random.default_rng(7)
    im = imatrix.Imatrix(chunk_size=64, chunk_count=2, datasets=["synthetic"])
    with open_gguf(model) as g:
        for name, t in g.tensors.items():
            if name.startswith("blk.") and len(t.shape) == 2:
                im.sums[name] = rng.lognormal(0, 1.5, t.shape[0]) * 128
                im.counts[name] = 128
    imatrix.save(im, path)
    return im


@pytest.mark.parametrize("ftype", WEIGHTED_TYPES)
def test_tiny_with_imatrix_matches_llama_cpp(tiny: Path, tmp_path: Path, ftype: str) -> None:
    im = synthetic_imatrix(tiny, tmp_path / "im.gguf")
    ref, ours = tmp_path / "ref.gguf", tmp_path / "ours.gguf"
    llama_quantize(tiny, ref, FTYPES[ftype][0], imatrix=im.weights())
    report = quantize_file(tiny, ours, ftype, imatrix=tmp_path / "im.gguf", progress=False)
    assert_same_model(ours, ref)
    assert report.imatrix_used == (0 if ftype == "Q8_0" else 8 * 7)


def test_imatrix_changes_codes_and_lowers_weighted_error() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 512)).astype(np.float32)
    qw = rng.lognormal(0, 2, 512).astype(np.float32)
    for name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"):
        fmt = next(f for f in (format_for(t) for t in WEIGHTED) if f.name == name)
        plain = fmt.quantize(x)
        weighted = np.empty_like(plain)
        WEIGHTED[fmt.ggml_type](x, weighted, qw)
        assert not np.array_equal(plain, weighted), name

        def err(q: np.ndarray, fmt=fmt) -> float:
            return float((qw * (fmt.dequantize(q, 512) - x) ** 2).sum())

        assert err(weighted) < 0.97 * err(plain), name


def test_imatrix_refusals(tiny: Path, tmp_path: Path) -> None:
    im = synthetic_imatrix(tiny, tmp_path / "im.gguf")
    with pytest.raises(InvalidRequestError, match="needs an importance matrix"):
        quantize_file(tiny, tmp_path / "o.gguf", "Q2_K_S", progress=False)
    del im.sums["blk.3.ffn_up.weight"], im.counts["blk.3.ffn_up.weight"]
    imatrix.save(im, tmp_path / "partial.gguf")  # llama.cpp: "Missing importance matrix"
    with pytest.raises(InvalidRequestError, match="no entry for blk.3.ffn_up.weight"):
        quantize_file(tiny, tmp_path / "o.gguf", "Q2_K_S", imatrix=tmp_path / "partial.gguf",
                      progress=False)
    other = write_tiny_llama(tmp_path / "small.gguf")  # 64-wide rows
    assert_clean_error(cli("quantize", str(other), str(tmp_path / "o.gguf"), "--type", "Q4_0",
                           "--imatrix", str(tmp_path / "im.gguf")), "imatrix size")
    assert_clean_error(cli("quantize", str(tiny), str(tmp_path / "o.gguf"), "--type", "Q4_0",
                           "--imatrix", str(tiny)), "not an imatrix")
    assert_clean_error(cli("quantize", str(tiny), str(tmp_path / "o.gguf"), "--type", "Q4_0",
                           "--imatrix", str(tmp_path / "none.gguf")), "imatrix file not found")
    assert not (tmp_path / "o.gguf").exists()


@pytest.mark.slow
def test_reference_forward_agrees_with_engine(smollm2_path: Path) -> None:
    from localinfer.llm import LLM

    with LLM(smollm2_path, threads=2) as llm:
        ids = llm.tokenizer.encode(SAMPLE_TEXT[:400], add_special=True)[:64]
        engine = log_softmax(llm.score(ids))
    with open_gguf(smollm2_path) as g:
        ours = log_softmax(forward(g, np.array([ids]), want_logits=True)[0])
    assert (ours.argmax(1) == engine.argmax(1)).mean() > 0.9
    p = np.exp(ours)
    assert float((p * (ours - engine)).sum(1).mean()) < 0.02  # KL(ours || engine)


@pytest.mark.slow
def test_imatrix_command_and_llama_cpp_parity(smollm2_path: Path, tmp_path: Path,
                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    f16 = shared_f16(smollm2_path, tmp_path_factory.getbasetemp())
    text = tmp_path / "calib.txt"
    text.write_text(SAMPLE_TEXT, encoding="utf-8")
    out = tmp_path / "smol.imatrix"
    proc = cli("imatrix", str(f16), str(text), "-o", str(out), "--chunk", "256",
               "--no-progress")
    assert proc.returncode == 0, proc.stderr
    r = GGUFReader(out)  # what llama.cpp's loader reads
    assert bytes(r.fields["general.type"].parts[-1]).decode() == "imatrix"
    assert int(r.fields["imatrix.chunk_size"].parts[-1][0]) == 256
    n_chunks = int(r.fields["imatrix.chunk_count"].parts[-1][0])
    names = [t.name for t in r.tensors]  # per matrix in name order: in_sum2, then counts
    bases = [n.removesuffix(".in_sum2") for n in names[0::2]]
    assert bases == sorted(bases) and len(bases) == 30 * 7
    assert names[1::2] == [f"{b}.counts" for b in bases]
    counts = {t.name: float(t.data[0]) for t in r.tensors if t.name.endswith(".counts")}
    assert set(counts.values()) == {256.0 * n_chunks}
    im = imatrix.load(out)
    q = im.weights()["blk.0.attn_q.weight"]
    assert q.shape == (576,) and (q > 0).all()
    assert im.weights()["blk.0.attn_q.weight"].tolist() == \
        im.weights()["blk.0.attn_k.weight"].tolist()  # the same input

    ref, ours = tmp_path / "ref.gguf", tmp_path / "ours.gguf"
    llama_quantize(f16, ref, FTYPES["Q4_K_M"][0], imatrix=im.weights())
    report = quantize_file(f16, ours, "Q4_K_M", imatrix=out, progress=False)
    assert report.fallbacks > 0 and report.imatrix_used > 0
    assert_same_model(ours, ref)
    plain = tmp_path / "plain.gguf"
    quantize_file(f16, plain, "Q4_K_M", progress=False)
    assert plain.read_bytes() != ours.read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("ftype, pure, kquant", [("Q2_K", True, "Q2_K"),
                                                 ("Q3_K_S", False, "Q3_K")])
def test_smollm2_q23k_with_imatrix_matches_llama_cpp(smollm2_path: Path, tmp_path: Path,
                                                      tmp_path_factory: pytest.TempPathFactory,
                                                      ftype: str, pure: bool,
                                                      kquant: str) -> None:
    """Real weights: SmolLM2's 1536-wide ffn_down rows are the K-quant tensors (the 576-wide
    ones fall back to Q4_0); --pure makes them Q2_K instead of the Q2_K mix's Q3_K."""
    f16 = shared_f16(smollm2_path, tmp_path_factory.getbasetemp())
    im = synthetic_imatrix(f16, tmp_path / "im.gguf")
    ref, ours = tmp_path / "ref.gguf", tmp_path / "ours.gguf"
    llama_quantize(f16, ref, FTYPES[ftype][0], pure=pure, imatrix=im.weights())
    report = quantize_file(f16, ours, ftype, pure=pure, imatrix=tmp_path / "im.gguf",
                           progress=False)
    assert_same_model(ours, ref)
    assert report.imatrix_used == 30 * 7
    assert {t[2] for t in report.tensors if "ffn_down" in t[0]} == {kquant}
