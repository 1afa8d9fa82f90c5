"""Semantic checks (RELIABILITY case 7) on tiny llama files: ModelConfig and the vocab checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf_factory import QT, VT, build_gguf, tiny_llama_parts, write_tiny_llama

from localinfer.errors import GGUFError, UnsupportedModelError
from localinfer.gguf_file import open_gguf
from localinfer.model_config import ModelConfig


def _with(tmp_path: Path, replace: dict[str, tuple | None], drop_tensor: str | None = None,
          **kw) -> Path:
    """A tiny llama whose KV entries named in replace are swapped (or removed when None)."""
    kvs, tensors = tiny_llama_parts(**kw)
    out = []
    for item in kvs:
        if item[0] in replace:
            if replace[item[0]] is not None:
                out.append((item[0], *replace.pop(item[0])))
        else:
            out.append(item)
    out += [(k, *v) for k, v in replace.items() if v is not None]
    tensors = [t for t in tensors if t.name != drop_tensor]
    path = tmp_path / "m.gguf"
    path.write_bytes(build_gguf(out, tensors))
    return path


@pytest.mark.parametrize("weight_type", [QT.F32, QT.F16, QT.Q8_0, QT.Q4_1])
def test_tiny_llama_is_valid(tmp_path: Path, weight_type: int) -> None:
    path = write_tiny_llama(tmp_path / "t.gguf", weight_type=weight_type, tied=False)
    with open_gguf(path) as g:
        cfg = ModelConfig.from_gguf(g)
        cfg.check_tensors(g)
        assert (cfg.n_layers, cfg.n_embd, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (
            2, 64, 4, 2, 16)
        assert cfg.n_vocab == len(g.metadata["tokenizer.ggml.tokens"])
        assert not cfg.tied_embeddings
        q = g.array("blk.0.attn_q.weight")
        assert q.shape[0] == 64


def _tokens_len(n: int) -> tuple:
    kvs, _ = tiny_llama_parts()
    tokens = next(item[2] for item in kvs if item[0] == "tokenizer.ggml.tokens")
    return (VT.ARRAY, tokens[:n], VT.STRING)


SEMANTIC: dict[str, tuple[dict, str]] = {
    "tokens shorter than embedding": ({"tokenizer.ggml.tokens": _tokens_len(100)}, "100 tokens"),
    "tokens not strings": ({"tokenizer.ggml.tokens": (VT.ARRAY, [1, 2], VT.INT32)},
                           "array of string"),
    "tokens scalar": ({"tokenizer.ggml.tokens": (VT.UINT32, 5)}, "array of string"),
    "token_type uint8": ({"tokenizer.ggml.token_type": (VT.ARRAY, [1] * 292, VT.UINT8)},
                         "array of int32"),
    "token_type short": ({"tokenizer.ggml.token_type": (VT.ARRAY, [1] * 10, VT.INT32)},
                         "10 entries"),
    "scores float64": ({"tokenizer.ggml.scores": (VT.ARRAY, [0.0] * 292, VT.FLOAT64)},
                       "array of float32"),
    "scores long": ({"tokenizer.ggml.scores": (VT.ARRAY, [0.0] * 300, VT.FLOAT32)},
                    "300 entries"),
    "merges ints": ({"tokenizer.ggml.merges": (VT.ARRAY, [1], VT.INT32)}, "array of string"),
    "bos out of vocab": ({"tokenizer.ggml.bos_token_id": (VT.UINT32, 292)}, "outside"),
    "eot negative": ({"tokenizer.ggml.eot_token_id": (VT.INT32, -1)}, "outside"),
    "eos string": ({"tokenizer.ggml.eos_token_id": (VT.STRING, "2")}, "must be an integer"),
    "model not string": ({"tokenizer.ggml.model": (VT.UINT32, 1)}, "must be a string"),
    "add_bos not bool": ({"tokenizer.ggml.add_bos_token": (VT.UINT8, 1)}, "must be a bool"),
    "head count 0": ({"llama.attention.head_count": (VT.UINT32, 0)}, "out of range"),
    "kv heads not dividing": ({"llama.attention.head_count_kv": (VT.UINT32, 3)}, "inconsistent"),
    "layers huge": ({"llama.block_count": (VT.UINT64, 1 << 40)}, "out of range"),
    "embedding float": ({"llama.embedding_length": (VT.FLOAT32, 64.0)}, "must be a number"),
    "block_count string": ({"llama.block_count": (VT.STRING, "2")}, "must be a number"),
    "rope base nan": ({"llama.rope.freq_base": (VT.FLOAT32, float("nan"))}, "not finite"),
    "rms eps zero": ({"llama.attention.layer_norm_rms_epsilon": (VT.FLOAT32, 0.0)}, "epsilon"),
    "missing embedding length": ({"llama.embedding_length": None}, "missing metadata"),
    "architecture missing": ({"general.architecture": None}, "general.architecture"),
}


@pytest.mark.parametrize("case", list(SEMANTIC))
def test_semantic(tmp_path: Path, case: str) -> None:
    replace, message = SEMANTIC[case]
    with open_gguf(_with(tmp_path, dict(replace))) as g, pytest.raises(GGUFError, match=message):
        ModelConfig.from_gguf(g).check_tensors(g)


def test_unsupported_architecture(tmp_path: Path) -> None:
    path = _with(tmp_path, {"general.architecture": (VT.STRING, "mamba")})
    with open_gguf(path) as g, pytest.raises(UnsupportedModelError):
        ModelConfig.from_gguf(g)


def test_missing_tensor(tmp_path: Path) -> None:
    with open_gguf(_with(tmp_path, {}, drop_tensor="blk.1.ffn_up.weight")) as g:
        cfg = ModelConfig.from_gguf(g)
        with pytest.raises(GGUFError, match="missing tensor blk.1.ffn_up.weight"):
            cfg.check_tensors(g)


def test_wrong_shape(tmp_path: Path) -> None:
    # 2 KV heads in the metadata, but the K/V weights were built for 4
    kvs, tensors = tiny_llama_parts(n_kv_heads=4)
    kvs = [(k, *rest) if k != "llama.attention.head_count_kv" else (k, VT.UINT32, 2)
           for k, *rest in kvs]
    path = tmp_path / "m.gguf"
    path.write_bytes(build_gguf(kvs, tensors))
    with open_gguf(path) as g, pytest.raises(GGUFError, match="attn_k.weight has shape"):
        ModelConfig.from_gguf(g).check_tensors(g)
