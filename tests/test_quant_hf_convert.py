"""Hugging Face directories -> GGUF: SmolLM2 rebuilt as an HF directory (de-permuted Q/K,
tokenizer.json from its vocabulary) converts back to the same tensors, tokenizer metadata and
tokenization; a qwen2 directory keeps Q/K order and biases; Gemma 3 rebuilt as an HF
directory (SentencePiece tokenizer.model, norms as w - 1) converts back to the same weights,
metadata and tokenization; `quantize DIR` works; bad
directories fail with one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hf_dirs import (
    hf_dir_from_f16_gguf,
    hf_dir_from_gemma3_gguf,
    sentencepiece_model,
    write_tokenizer,
)
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
    write_safetensors(gemma / "model.safetensors", {"model.norm.weight": ("F32", np.zeros(4))})
    assert_clean_error(cli("quantize", str(gemma), str(out), "--type", "Q8_0"),
                       "config.json", "missing or invalid")
    (gemma / "config.json").write_text(json.dumps(_tiny_gemma3_config()))
    (gemma / "tokenizer.model").write_bytes(b"\x0a\xff\x01")  # a piece longer than the file
    assert_clean_error(cli("quantize", str(gemma), str(out), "--type", "Q8_0"),
                       "tokenizer.model", "not a SentencePiece model")
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


GEMMA3_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
               "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
               "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
               "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
               "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
               "tokenizer.ggml.add_sep_token", "tokenizer.ggml.add_space_prefix",
               "tokenizer.chat_template")
GEMMA3_PROBE = (SAMPLE_TEXT[:600] + " 12345 <start_of_turn>user\nHi! ¿Qué tal? 東京 🙂\t\n  x"
                "<end_of_turn>\n<bos><unused3>   \n\n\n\u2581y")


def _same(a: object, b: object) -> bool:
    if isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), b)
    if isinstance(b, list):
        return list(a) == b  # type: ignore[call-overload]
    return a == b


@pytest.mark.slow
def test_gemma3_round_trip(gemma3_path: Path, tmp_path: Path) -> None:
    """The real Gemma 3 270M (Q5_0/Q4_K/Q6_K/Q8_0 + F32 norms) as an HF directory with a
    SentencePiece tokenizer.model converts back to its dequantized weights (F16, the converter's
    default), the same norms (+1 restored exactly), metadata and token ids."""
    folder = hf_dir_from_gemma3_gguf(gemma3_path, tmp_path / "gemma-3-270m-hf")
    out = convert_hf_dir(folder, tmp_path / "converted.gguf")
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize
    with open_gguf(out) as a, open_gguf(gemma3_path) as b:
        assert a.arch == "gemma3" and sorted(a.tensors) == sorted(b.tensors)
        assert {t.type_name for t in b.tensors.values()} >= {"Q5_0", "Q4_K", "Q6_K", "Q8_0"}
        for name, tb in b.tensors.items():
            ref = dequantize(np.asarray(b.raw(name)), GGMLQuantizationType(tb.ggml_type)) \
                .reshape(tuple(reversed(tb.shape)))
            got = np.asarray(a.array(name))
            assert got.shape == ref.shape, name
            if ref.ndim == 2:
                assert a.tensors[name].type_name == "F16", name
                assert np.array_equal(got, ref.astype(np.float16)), name
            else:  # norms: F32, the checkpoint's (w - 1) + 1 is the original value exactly
                assert a.tensors[name].type_name == "F32", name
                assert np.array_equal(got, ref), name
        ma, mb = a.metadata, b.metadata
        for key, value in mb.items():
            if key.startswith("gemma3."):
                assert _same(ma[key], value), key
        # the one key llama.cpp's current converter adds: the local layers' rope base, which
        # our runtime (and llama.cpp) default to the same 10000 when it is absent
        assert {k for k in ma if k.startswith("gemma3.")} - set(mb) == \
            {"gemma3.rope.freq_base_swa"}
        assert ma["gemma3.rope.freq_base_swa"] == 10000.0
        assert ma["general.file_type"] == 1
        for key in GEMMA3_KEYS:
            assert (key in ma) == (key in mb), key
            if key in mb:
                assert _same(ma[key], mb[key]), key
        ta, tb_ = Tokenizer.from_gguf(ma), Tokenizer.from_gguf(mb)
        for special in (False, True):
            ids = tb_.encode(GEMMA3_PROBE, parse_special=special)
            assert ta.encode(GEMMA3_PROBE, parse_special=special) == ids
            assert len(ids) > 100


def _tiny_gemma3_config() -> dict:
    return {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
            "text_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                            "num_attention_heads": 2, "num_key_value_heads": 1,
                            "head_dim": 16, "sliding_window": 64, "rope_theta": 1e6,
                            "rope_local_base_freq": 1e4, "vocab_size": 8,
                            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
                            "final_logit_softcapping": 30.0},
            "vision_config": {"hidden_size": 16}, "bos_token_id": 2, "eos_token_id": 1}


def test_gemma3_multimodal_directory(tmp_path: Path) -> None:
    """Gemma3ForConditionalGeneration: text_config hyperparameters (defaults where absent),
    language_model.* tensors, vision tensors dropped, F16 norms shifted in F16, the vocabulary
    padded to vocab_size and the embedding trimmed to it, tokens from tokenizer.model with
    added_tokens_decoder overrides."""
    folder = tmp_path / "g3mm"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_tiny_gemma3_config()))
    pieces = [("<pad>", 0.0, 3), ("<eos>", 0.0, 3), ("<bos>", 0.0, 3), ("<unk>", 0.0, 2),
              ("\u2581a", -1.5, 1), ("<0x41>", 0.0, 6), ("<start_of_turn>", 0.0, 4)]
    (folder / "tokenizer.model").write_bytes(sentencepiece_model(pieces))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<bos>",
        "eos_token": {"content": "<eos>"}, "chat_template": "{{ messages }}",
        "added_tokens_decoder": {"6": {"content": "<start_of_turn>", "special": True},
                                 "3": {"content": "<unk>", "special": False}}}))
    rng = np.random.default_rng(3)
    t: dict[str, tuple[str, np.ndarray]] = {
        "language_model.model.embed_tokens.weight": ("F16", rng.standard_normal((10, 32))),
        "language_model.model.norm.weight": ("F16", np.full(32, 0.0004)),
        "vision_tower.vision_model.embeddings.patch_embedding.weight":
            ("F16", np.zeros((4, 4))),
        "multi_modal_projector.mm_input_projection_weight": ("F16", np.zeros((4, 4))),
    }
    p = "language_model.model.layers.0."
    for n, shape in (("self_attn.q_proj", (32, 32)), ("self_attn.k_proj", (16, 32)),
                     ("self_attn.v_proj", (16, 32)), ("self_attn.o_proj", (32, 32)),
                     ("mlp.gate_proj", (64, 32)), ("mlp.up_proj", (64, 32)),
                     ("mlp.down_proj", (32, 64))):
        t[p + n + ".weight"] = ("F16", rng.standard_normal(shape))
    for n, size in (("input_layernorm", 32), ("post_attention_layernorm", 32),
                    ("pre_feedforward_layernorm", 32), ("post_feedforward_layernorm", 32),
                    ("self_attn.q_norm", 16), ("self_attn.k_norm", 16)):
        t[p + n + ".weight"] = ("F16", rng.standard_normal(size))
    write_safetensors(folder / "model.safetensors", t)
    with open_gguf(convert_hf_dir(folder, tmp_path / "g.gguf")) as g:
        m = g.metadata
        assert g.arch == "gemma3" and len(g.tensors) == 1 + 1 + 7 + 6
        assert g.tensors["token_embd.weight"].shape == (32, 8)  # 10 rows trimmed to the vocab
        assert np.array_equal(g.array("token_embd.weight"),
                              t["language_model.model.embed_tokens.weight"][1][:8]
                              .astype(np.float16))
        # F16 + 1 rounds in F16 (0.0004 is below half an F16 step at 1), as llama.cpp's does
        assert np.all(g.array("output_norm.weight") == 1.0)
        q = t[p + "self_attn.q_norm.weight"][1]
        assert np.array_equal(g.array("blk.0.attn_q_norm.weight"),
                              (q.astype(np.float16) + np.float16(1)).astype(np.float32))
        assert "blk.0.post_ffw_norm.weight" in g.tensors and "blk.0.ffn_norm.weight" in g.tensors
        assert m["gemma3.context_length"] == 131072  # the converter's default
        assert m["gemma3.attention.key_length"] == 16 and m["gemma3.attention.head_count"] == 2
        assert m["gemma3.rope.scaling.type"] == "linear" and m["gemma3.rope.scaling.factor"] == 8
        assert m["gemma3.final_logit_softcapping"] == 30.0
        assert m["gemma3.rope.freq_base"] == 1e6 and m["gemma3.rope.freq_base_swa"] == 1e4
        assert m["gemma3.attention.sliding_window"] == 64
        assert m["tokenizer.ggml.model"] == "llama"
        assert list(m["tokenizer.ggml.tokens"]) == [p[0] for p in pieces] + ["[PAD7]"]
        assert m["tokenizer.ggml.token_type"].tolist() == [3, 3, 3, 4, 1, 6, 3, 5]
        assert m["tokenizer.ggml.scores"].tolist() == [0, 0, 0, -1000, -1.5, 0, -1000, -10000]
        # no tokenizer.json: ids come from config.json (text_config's absent ones too)
        assert m["tokenizer.ggml.bos_token_id"] == 2 and m["tokenizer.ggml.eos_token_id"] == 1
        assert "tokenizer.ggml.unknown_token_id" not in m
        assert m["tokenizer.ggml.add_bos_token"] is True
        assert m["tokenizer.ggml.add_space_prefix"] is False
        assert m["tokenizer.chat_template"] == "{{ messages }}"
