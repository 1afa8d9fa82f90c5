"""model_info.describe / format_info on a tiny generated model and on the real SmolLM2 file."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf_factory import QT, write_tiny_llama

from localinfer.engine.config import DEFAULT_MAX_MODEL_LEN
from localinfer.errors import GGUFError
from localinfer.model_info import DEFAULT_POOL_SEQS, describe, format_info


def test_tiny_llama(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "t.gguf", weight_type=QT.Q4_1, embd_type=QT.Q8_0)
    info = describe(path)
    assert (info.architecture, info.name, info.n_layers, info.n_embd) == (
        "llama", "tiny-llama-test", 2, 64)
    assert (info.n_heads, info.n_kv_heads, info.head_dim, info.n_ff) == (4, 2, 16, 128)
    assert info.n_vocab == 292 and info.tokenizer_model == "gpt2" and info.has_chat_template
    assert set(info.tensor_types) == {"Q4_1", "Q8_0", "F32"}
    assert info.tensor_types["Q8_0"].count == 1
    assert info.tensor_types["F32"].count == 2 * 2 + 1  # two norms per layer + output norm
    per_layer = 64 * 64 * 2 + 64 * 32 * 2 + 64 * 128 * 3 + 64 * 2
    assert info.n_params == 2 * per_layer + 64 * 292 + 64
    assert info.weights_bytes == sum(s.nbytes for s in info.tensor_types.values())
    assert info.weights_bytes < info.file_size
    assert info.n_ctx == 256  # the trained context, below the default cap
    assert info.kv_cache_bytes == DEFAULT_POOL_SEQS * 256 * 2 * 2 * 2 * 16 * 2
    assert info.memory_bytes > info.weights_bytes + info.kv_cache_bytes
    text = format_info(info)
    for needle in ("tiny-llama-test (llama)", "Q4_1 ", "chat template  yes", "292 tokens",
                   "heads 4 (2 KV)", "KV cache"):
        assert needle in text


def test_explicit_context_and_no_template(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "t.gguf", chat_template=None)
    info = describe(path, n_ctx=64)
    assert info.n_ctx == 64 and not info.has_chat_template
    assert "chat template  no" in format_info(info)


def test_bad_file_is_gguf_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGUF\x03\0\0\0")
    with pytest.raises(GGUFError):
        describe(path)


@pytest.mark.slow
def test_real_model(request: pytest.FixtureRequest) -> None:
    try:
        path = Path(request.getfixturevalue("smollm2_path"))
    except Exception as e:
        pytest.skip(f"real model unavailable: {e}")
    info = describe(path)
    assert (info.n_layers, info.n_embd, info.n_heads, info.n_kv_heads) == (30, 576, 9, 3)
    assert info.n_vocab == 49152 and info.context_length == 8192
    assert {k: s.count for k, s in info.tensor_types.items()} == {
        "Q4_1": 210, "F32": 61, "Q8_0": 1}
    assert 130e6 < info.n_params < 140e6
    # f16 K+V: 2 * 30 layers * 3 heads * 64 * 2 bytes = 23040 bytes per token
    assert info.kv_cache_bytes == 23040 * DEFAULT_MAX_MODEL_LEN * DEFAULT_POOL_SEQS
