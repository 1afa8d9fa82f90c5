"""Hugging Face model directories rebuilt from GGUF files, for the converter's round-trip tests:
weights back in HF names and row order (llama's Q/K de-permuted), tokenizer.json and
tokenizer_config.json from the GGUF vocabulary, merges, special ids and chat template; Gemma 3
with a SentencePiece tokenizer.model written by a small protobuf encoder."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
from localinfer.quant.hf_convert.safetensors import write_safetensors
from localinfer.quant.hf_convert.tensor_map import gguf_name, unpermute_qk

from localinfer.gguf_file import open_gguf

QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
               r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
              "use_regex": False}
PRE = {  # tokenizer.ggml.pre -> the pre_tokenizer these families ship in tokenizer.json
    "smollm": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, {**BYTE_LEVEL, "use_regex": True}]},
    "qwen2": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated",
         "invert": False}, BYTE_LEVEL]},
}
HF_NAMES = {  # gguf name pattern -> HF name
    "token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
HF_LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
            "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
            "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
            "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def hf_name(name: str) -> str:
    if name in HF_NAMES:
        return HF_NAMES[name]
    _, i, role, kind = name.split(".")
    return f"model.layers.{i}.{HF_LAYER[role]}.{kind}"


def write_tokenizer(meta: dict, folder: Path, pair_merges: bool = True) -> None:
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"].tolist()
    vocab = {t: i for i, (t, ty) in enumerate(zip(tokens, types, strict=True)) if ty == 1}
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": ty == 3}
             for i, (t, ty) in enumerate(zip(tokens, types, strict=True)) if ty in (3, 4)]
    merges = list(meta["tokenizer.ggml.merges"])
    tok = {"version": "1.0", "added_tokens": added, "normalizer": None,
           "pre_tokenizer": PRE[meta["tokenizer.ggml.pre"]],
           "model": {"type": "BPE", "dropout": None, "unk_token": None,
                     "byte_fallback": False, "vocab": vocab,
                     "merges": [m.split(" ") for m in merges] if pair_merges else merges}}
    (folder / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), "utf-8")
    cfg: dict = {"add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False))}
    for key, name in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
                      ("pad_token", "padding")):
        if f"tokenizer.ggml.{name}_token_id" in meta:
            cfg[key] = tokens[meta[f"tokenizer.ggml.{name}_token_id"]]
    cfg["bos_token"] = {"content": cfg["bos_token"], "special": True}  # both spellings occur
    cfg["chat_template"] = meta["tokenizer.chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False), "utf-8")


def hf_dir_from_f16_gguf(src: Path, folder: Path, shards: int = 2) -> Path:
    """An HF directory holding exactly src's weights (F16 matrices, F32 norms)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open_gguf(src) as g:
        meta, arch = g.metadata, g.arch
        n_head = meta[f"{arch}.attention.head_count"]
        n_kv = meta[f"{arch}.attention.head_count_kv"]
        config = {
            "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[arch]],
            "hidden_size": meta[f"{arch}.embedding_length"],
            "intermediate_size": meta[f"{arch}.feed_forward_length"],
            "num_hidden_layers": meta[f"{arch}.block_count"],
            "num_attention_heads": n_head, "num_key_value_heads": n_kv,
            "max_position_embeddings": meta[f"{arch}.context_length"],
            "rope_theta": meta[f"{arch}.rope.freq_base"],
            "rms_norm_eps": meta[f"{arch}.attention.layer_norm_rms_epsilon"],
            "vocab_size": len(meta["tokenizer.ggml.tokens"]),
            "tie_word_embeddings": "output.weight" not in g.tensors,
        }
        tensors = {}
        for name, info in g.tensors.items():
            arr = np.array(g.array(name)).reshape(tuple(reversed(info.shape)))
            if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
                arr = unpermute_qk(arr, n_head if ".attn_q." in name else n_kv)
            assert gguf_name(hf_name(name)) == name
            tensors[hf_name(name)] = ("F16" if arr.dtype == np.float16 else "F32", arr)
        names = sorted(tensors)
        for k in range(shards):  # sharded like real checkpoints
            part = {n: tensors[n] for n in names[k::shards]}
            write_safetensors(folder / f"model-{k + 1:05d}-of-{shards:05d}.safetensors", part)
        write_tokenizer(meta, folder)
    (folder / "config.json").write_text(json.dumps(config), "utf-8")
    return folder


# --- Gemma 3: SentencePiece tokenizer.model, norms stored as (w - 1) ---------------------------

GEMMA3_LAYER = {**HF_LAYER, "post_attention_norm": "post_attention_layernorm",
                "ffn_norm": "pre_feedforward_layernorm",
                "post_ffw_norm": "post_feedforward_layernorm",
                "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    if wire == 2:
        payload = _varint(len(payload)) + payload
    return _varint(number << 3 | wire) + payload


def sentencepiece_model(pieces: list[tuple[str, float, int]]) -> bytes:
    """A ModelProto with the given (piece, score, type) entries, a trainer_spec (model_type BPE,
    byte_fallback) and a normalizer_spec (identity, no dummy prefix) like Gemma's."""
    out = bytearray()
    for piece, score, kind in pieces:
        body = _field(1, 2, piece.encode()) + _field(2, 5, struct.pack("<f", score))
        if kind != 1:  # NORMAL is the proto default and is left out, as protobuf does
            body += _field(3, 0, _varint(kind))
        out += _field(1, 2, body)
    out += _field(2, 2, _field(3, 0, _varint(2)) + _field(35, 0, _varint(1)))
    out += _field(3, 2, _field(1, 2, b"identity") + _field(3, 0, _varint(0)))
    return bytes(out)


def write_spm_tokenizer(meta: dict, folder: Path) -> None:
    """tokenizer.model from a GGUF's llama-style vocabulary, with the added/special tokens
    (score -1000 in llama.cpp's output) listed in tokenizer_config.json's added_tokens_decoder
    and tokenizer.json's added_tokens, as in Gemma 3's repository."""
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"].tolist()
    scores = meta["tokenizer.ggml.scores"].tolist()
    (folder / "tokenizer.model").write_bytes(sentencepiece_model(
        list(zip(tokens, scores, types, strict=True))))
    added = {i: {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": ty == 3}
             for i, (t, ty, s) in enumerate(zip(tokens, types, scores, strict=True))
             if ty in (3, 4) and s == -1000.0}
    cfg: dict = {"add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
                 "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
                 "added_tokens_decoder": {str(i): a for i, a in added.items()}}
    for key, name in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
                      ("pad_token", "padding")):
        if f"tokenizer.ggml.{name}_token_id" in meta:
            cfg[key] = tokens[meta[f"tokenizer.ggml.{name}_token_id"]]
    if "tokenizer.chat_template" in meta:
        cfg["chat_template"] = meta["tokenizer.chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False), "utf-8")
    bos = {"SpecialToken": {"id": cfg["bos_token"], "type_id": 0}}
    tok = {"added_tokens": [{"id": i, **a} for i, a in added.items()],
           "post_processor": {"type": "TemplateProcessing",
                              "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
                              "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, bos,
                                       {"Sequence": {"id": "B", "type_id": 1}}]},
           "model": {"type": "BPE", "byte_fallback": True, "vocab": {}, "merges": []}}
    (folder / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), "utf-8")


def hf_dir_from_gemma3_gguf(src: Path, folder: Path) -> Path:
    """Gemma 3 as its HF checkpoint holds it: every tensor dequantized (matrices F16, norms
    un-shifted to w - 1 in BF16 when exact, as Google ships them, else F32), one shard."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    folder.mkdir(parents=True, exist_ok=True)
    with open_gguf(src) as g:
        meta = g.metadata
        a = "gemma3"
        config = {
            "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
            "hidden_size": meta[f"{a}.embedding_length"],
            "intermediate_size": meta[f"{a}.feed_forward_length"],
            "num_hidden_layers": meta[f"{a}.block_count"],
            "num_attention_heads": meta[f"{a}.attention.head_count"],
            "num_key_value_heads": meta[f"{a}.attention.head_count_kv"],
            "head_dim": meta[f"{a}.attention.key_length"],
            "max_position_embeddings": meta[f"{a}.context_length"],
            "rope_theta": meta[f"{a}.rope.freq_base"], "rope_local_base_freq": 10000.0,
            "rope_scaling": None, "rms_norm_eps": meta[f"{a}.attention.layer_norm_rms_epsilon"],
            "sliding_window": meta[f"{a}.attention.sliding_window"],
            "attn_logit_softcapping": None, "final_logit_softcapping": None,
            "query_pre_attn_scalar": 256, "vocab_size": len(meta["tokenizer.ggml.tokens"]),
            "bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0,
            "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        }
        tensors = {}
        for name, info in g.tensors.items():
            qtype = GGMLQuantizationType(info.ggml_type)
            arr = dequantize(np.asarray(g.raw(name)), qtype).reshape(tuple(reversed(info.shape)))
            if name in HF_NAMES:
                hf = HF_NAMES[name]
            else:
                _, i, role, kind = name.split(".")
                hf = f"model.layers.{i}.{GEMMA3_LAYER[role]}.{kind}"
            if arr.ndim == 2:
                tensors[hf] = ("F16", arr.astype(np.float16))
                continue
            w = arr.astype(np.float32) - np.float32(1)
            bits = w.view(np.uint32)
            tensors[hf] = ("BF16", bits >> 16) if not (bits & 0xFFFF).any() else ("F32", w)
        write_safetensors(folder / "model.safetensors", tensors)
        write_spm_tokenizer(meta, folder)
    (folder / "config.json").write_text(json.dumps(config), "utf-8")
    return folder
