"""Quality report (`localinfer eval`, `quantize --eval`): perplexities, KL(A‖B) and top-1
agreement computed with our engine on SmolLM2 F16 and its quantization; bad inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf_factory import write_tiny_llama
from localinfer.quant.quality import compare, read_text, windows
from localinfer.quant.sample_text import SAMPLE_TEXT
from quant_fixtures import shared_f16
from test_cli import assert_clean_error, cli

from localinfer.errors import InvalidRequestError

TEXT = SAMPLE_TEXT[:1400]  # ~300 tokens: enough positions, quick on two cores


@pytest.fixture(scope="module")
def f16(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_f16(smollm2_path, tmp_path_factory.getbasetemp())


def test_windows_lead_with_bos_and_cover_every_token() -> None:
    ws = windows(list(range(10)), 4, bos=99)
    assert ws == [[99, 0, 1, 2], [99, 3, 4, 5], [99, 6, 7, 8], [99, 9]]
    assert windows(list(range(5)), 4, bos=None) == [[0, 1, 2, 3]]  # a lone last token: nothing


@pytest.mark.slow
def test_model_against_itself(f16: Path) -> None:
    r = compare(f16, f16, TEXT, ctx=128, threads=2, progress=False)
    assert r.backend == "numba" and r.n_windows >= 2 and r.n_tokens > 200
    assert r.kl_mean == 0.0 and r.kl_max == 0.0
    assert r.top1 == 1.0
    assert r.ppl_a == r.ppl_b and 2 < r.ppl_a < 200


@pytest.mark.slow
def test_quantize_with_eval_reports_small_drift(f16: Path, tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "q4km.gguf"
    proc = cli("quantize", str(f16), str(out), "--type", "Q4_K_M", "--no-progress",
               "--eval", str(text), "--eval-ctx", "128")
    assert proc.returncode == 0, proc.stderr
    assert "quality of Q4_K_M against source" in proc.stdout
    r = compare(f16, out, TEXT, ctx=128, threads=2, progress=False)
    assert 0 < r.kl_mean < 0.2 and r.kl_max < 3
    assert r.top1 > 0.75
    assert 0.95 < r.ppl_b / r.ppl_a < 1.2
    assert f"{r.kl_mean:.6f}" in proc.stdout  # the command printed the same numbers


def test_builtin_text_and_missing_file(tmp_path: Path) -> None:
    assert read_text(None) == SAMPLE_TEXT
    with pytest.raises(InvalidRequestError, match="not found"):
        read_text(tmp_path / "nope.txt")
    tiny = write_tiny_llama(tmp_path / "t.gguf")
    assert_clean_error(cli("eval", str(tiny), str(tiny), str(tmp_path / "nope.txt")),
                       "text file not found", "nope.txt")
    assert_clean_error(cli("eval", str(tmp_path / "missing.gguf"), str(tiny)), "missing.gguf")


def test_empty_text_is_refused(tmp_path: Path) -> None:
    tiny = write_tiny_llama(tmp_path / "t.gguf")
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    assert_clean_error(cli("eval", str(tiny), str(tiny), str(empty), "--no-progress"),
                       "text is empty")


def test_different_vocabularies_are_refused(smollm2_path: Path, tmp_path: Path) -> None:
    tiny = write_tiny_llama(tmp_path / "t.gguf")
    with pytest.raises(InvalidRequestError, match="different vocabularies"):
        compare(smollm2_path, tiny, TEXT, progress=False)


@pytest.mark.slow
def test_falls_back_to_llama_cpp(f16: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model the Numba backend cannot run (architecture or tensor type) is evaluated with
    llama.cpp, both models alike, and says so."""
    from localinfer.quant import quality

    monkeypatch.setattr(quality, "numba_can_run", lambda path: False)
    notes: list[str] = []
    r = compare(f16, f16, TEXT[:500], ctx=64, threads=2, progress=False, note=notes.append)
    assert r.backend == "llamacpp" and notes and "llama.cpp" in notes[0]
    assert r.kl_mean < 1e-6 and r.top1 == 1.0
