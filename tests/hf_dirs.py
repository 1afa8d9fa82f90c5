"""Hugging Face model directories rebuilt from GGUF files, for the converter's round-trip tests:
weights back in HF names and row order (llama's Q/K de-permuted), tokenizer.json and
tokenizer_config.json from the GGUF vocabulary, merges, special ids and chat template."""

from __future__ import annotations

import json
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
