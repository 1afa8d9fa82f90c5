"""Hugging Face directories -> GGUF: SmolLM2 rebuilt as an HF directory (de-permuted Q/K,
tokenizer.json from its vocabulary) converts back to the same tensors, tokenizer metadata and
tokenization; a qwen2 directory keeps Q/K order and biases; `quantize DIR` works; bad
directories fail with one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hf_dirs import hf_dir_from_f16_gguf, write_tokenizer
from localinfer.quant.hf_convert import convert_hf_dir
from localinfer.quant.hf_convert.safetensors import SafetensorsFile, write_safetensors
from localinfer.quant.hf_convert.tensor_map import permute_qk, unpermute_qk
from localinfer.quant.quantizer import quantize_file
from localinfer.quant.sample_text import SAMPLE_TEXT
from quant_fixtures import shared_f16
from test_cli import assert_clean_error, cli

from localinfer.gguf_file import open_gguf
from localinfer.tokenizer import Tokenizer

TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                  "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                  "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                  "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
                  "tokenizer.chat_template")
PROBE = SAMPLE_TEXT[:600] + " 12345 <|im_start|>user\nHi! ¿Qué tal? 東京 🙂\t\n  x"


def assert_same_tokenizer(a: dict, b: dict) -> None:
    for key in TOKENIZER_KEYS:
        if key in b:
            assert str(a[key]) == str(b[key]) if not isinstance(b[key], np.ndarray) \
                else a[key].tolist() == b[key].tolist(), key
    ta, tb = Tokenizer.from_gguf(a), Tokenizer.from_gguf(b)
    for special in (False, True):
        assert ta.encode(PROBE, parse_special=special) == tb.encode(PROBE, parse_special=special)


def test_permutation_round_trip() -> None:
    w = np.arange(8 * 64 * 3, dtype=np.float32).reshape(8 * 64, 3)
    assert np.array_equal(unpermute_qk(permute_qk(w, 8), 8), w)
    assert not np.array_equal(permute_qk(w, 8), w)
    # row 1 of a head is the first row of the head's second half in HF order
    assert np.array_equal(permute_qk(w, 8)[1], w[32])


def test_safetensors_reader(tmp_path: Path) -> None:
    a = np.arange(12, dtype=np.float16).reshape(3, 4)
    b = np.array([1.5, -2.0], np.float32)
    write_safetensors(tmp_path / "m.safetensors", {"a": ("F16", a), "b": ("F32", b)})
    st = SafetensorsFile(tmp_path / "m.safetensors")
    assert st.dtype("a") == "F16" and np.array_equal(st.array("a"), a)
    assert np.array_equal(st.array("b"), b)
    raw = bytearray((tmp_path / "m.safetensors").read_bytes())
    raw[0:8] = (10**9).to_bytes(8, "little")
    (tmp_path / "bad.safetensors").write_bytes(raw)
    from localinfer.errors import GGUFError
    with pytest.raises(GGUFError, match="header length"):
        SafetensorsFile(tmp_path / "bad.safetensors")


@pytest.mark.slow
def test_smollm2_round_trip(smollm2_path: Path, tmp_path: Path,
                            tmp_path_factory: pytest.TempPathFactory) -> None:
    f16 = shared_f16(smollm2_path, tmp_path_factory.getbasetemp())
    folder = hf_dir_from_f16_gguf(f16, tmp_path / "SmolLM2-hf")
    out = convert_hf_dir(folder, tmp_path / "converted.gguf")
    with open_gguf(out) as a, open_gguf(f16) as b:
        assert sorted(a.tensors) == sorted(b.tensors)
        for name, tb in b.tensors.items():
            assert a.tensors[name].type_name == tb.type_name, name
            assert bytes(a.raw(name)) == bytes(b.raw(name)), name
        for key, value in b.metadata.items():
            if key.startswith("llama."):
                assert a.metadata[key] == value, key
        assert a.metadata["general.file_type"] == 1
        assert_same_tokenizer(a.metadata, b.metadata)

    # quantize straight from the directory: the tensors of quantizing the original GGUF
    q_dir, q_ref = tmp_path / "from-dir.gguf", tmp_path / "from-gguf.gguf"
    proc = cli("quantize", str(folder), str(q_dir), "--type", "Q4_K_M", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    quantize_file(f16, q_ref, "Q4_K_M", progress=False)
    with open_gguf(q_dir) as a, open_gguf(q_ref) as b:
        assert [(n, t.type_name) for n, t in a.tensors.items()] == \
            [(n, t.type_name) for n, t in b.tensors.items()]
        assert all(bytes(a.raw(n)) == bytes(b.raw(n)) for n in b.tensors)
    assert sorted(p.name for p in tmp_path.iterdir()) == \
        ["SmolLM2-hf", "converted.gguf", "from-dir.gguf", "from-gguf.gguf"]


def test_qwen2_directory(qwen2_path: Path, tmp_path: Path) -> None:
    """Random tiny weights with Qwen 2.5's real tokenizer: Q/K keep HF order, biases kept."""
    rng = np.random.default_rng(5)
    folder = tmp_path / "qwen-tiny"
    folder.mkdir()
    with open_gguf(qwen2_path) as g:
        meta = dict(g.metadata)
    n_vocab, e, ff, heads, kv = len(meta["tokenizer.ggml.tokens"]), 64, 128, 4, 2
    cfg = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": e, "intermediate_size": ff,
           "num_hidden_layers": 2, "num_attention_heads": heads, "num_key_value_heads": kv,
           "max_position_embeddings": 4096, "rope_theta": 1e6, "rms_norm_eps": 1e-6,
           "vocab_size": n_vocab, "tie_word_embeddings": True}
    (folder / "config.json").write_text(json.dumps(cfg))
    t: dict[str, tuple[str, np.ndarray]] = {
        "model.embed_tokens.weight": ("BF16", rng.integers(0, 1 << 16, (n_vocab, e))),
        "model.norm.weight": ("BF16", np.full(e, 0x3F80)),
    }
    hd = e // heads
    for i in range(2):
        p = f"model.layers.{i}."
        for n, shape in (("self_attn.q_proj", (e, e)), ("self_attn.k_proj", (kv * hd, e)),
                         ("self_attn.v_proj", (kv * hd, e)), ("self_attn.o_proj", (e, e)),
                         ("mlp.gate_proj", (ff, e)), ("mlp.up_proj", (ff, e)),
                         ("mlp.down_proj", (e, ff))):
            t[p + n + ".weight"] = ("BF16", rng.integers(0, 1 << 16, shape))
        for n, size in (("q_proj", e), ("k_proj", kv * hd), ("v_proj", kv * hd)):
            t[p + f"self_attn.{n}.bias"] = ("BF16", rng.integers(0, 1 << 16, size))
        t[p + "input_layernorm.weight"] = ("BF16", np.full(e, 0x3F80))
        t[p + "post_attention_layernorm.weight"] = ("BF16", np.full(e, 0x3F80))
        t[p + "self_attn.rotary_emb.inv_freq"] = ("F32", np.ones(hd // 2))
    write_safetensors(folder / "model.safetensors", t)
    write_tokenizer(meta, folder, pair_merges=False)
    out = convert_hf_dir(folder, tmp_path / "q.gguf")
    with open_gguf(out) as g:
        assert g.arch == "qwen2" and g.metadata["general.file_type"] == 32
        assert "output.weight" not in g.tensors and "qwen2.vocab_size" not in g.metadata
        q = t["model.layers.0.self_attn.q_proj.weight"][1].astype(np.uint16)
        assert g.tensors["blk.0.attn_q.weight"].type_name == "BF16"
        assert bytes(g.raw("blk.0.attn_q.weight")) == q.tobytes()  # not permuted
        bias = t["model.layers.1.self_attn.k_proj.bias"][1].astype(np.uint16)
        got = (bias.astype(np.uint32) << 16).view(np.float32)
        assert np.array_equal(g.array("blk.1.attn_k.bias"), got)  # F32, exact
        assert_same_tokenizer(g.metadata, meta)


def test_bad_directories(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "o.gguf"
    assert_clean_error(cli("quantize", str(empty), str(out), "--type", "Q8_0"), "config.json")
    gemma = tmp_path / "gemma"
    gemma.mkdir()
    (gemma / "config.json").write_text('{"architectures": ["Gemma3ForCausalLM"]}')
    assert_clean_error(cli("quantize", str(gemma), str(out), "--type", "Q8_0"), "gemma3")
    other = tmp_path / "phi"
    other.mkdir()
    (other / "config.json").write_text('{"architectures": ["PhiForCausalLM"]}')
    assert_clean_error(cli("quantize", str(other), str(out), "--type", "Q8_0"),
                       "PhiForCausalLM", "not supported")
    nosafe = tmp_path / "nosafe"
    nosafe.mkdir()
    (nosafe / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert_clean_error(cli("quantize", str(nosafe), str(out), "--type", "Q8_0"),
                       "no *.safetensors")
    assert not out.exists() and not list(tmp_path.glob(".*"))
