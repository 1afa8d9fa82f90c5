"""GGUF tokenizer metadata from a Hugging Face tokenizer.json + tokenizer_config.json, the way
llama.cpp's convert_hf_to_gguf.py fills it for byte-level BPE vocabularies (tokenizer.ggml.model
"gpt2"): tokens by id (gaps padded with [PADn], type UNUSED), token types (added special tokens
CONTROL, other added tokens USER_DEFINED, the rest NORMAL), merges as "a b", the pre-tokenizer
name, special token ids, add_bos/add_eos and the chat template.

The pre-tokenizer name is read from tokenizer.json's pre_tokenizer structure (llama.cpp hashes
the HF tokenizer's output on a probe text instead; we recognise the structures of the families
we convert and fall back to "default" with a warning).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gguf.constants import GGUFValueType as V

from localinfer.errors import UnsupportedModelError

from ..gguf_writer import KV

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def looks_special(s: str) -> bool:
    """Added tokens llama.cpp treats as control even when not marked special."""
    return (s in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (s.startswith("<|") and s.endswith("|>"))
            or (s.startswith("<\uff5c") and s.endswith("\uff5c>"))
            or (s.startswith("<unused") and s.endswith(">")))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UnsupportedModelError(f"{path.parent}: missing {path.name}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UnsupportedModelError(f"{path}: invalid JSON: {exc}") from None


def _content(v: Any) -> str | None:
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


def _pretokenizers(pre: Any) -> list[dict[str, Any]]:
    if not isinstance(pre, dict):
        return []
    if pre.get("type") == "Sequence":
        return [p for p in pre.get("pretokenizers", []) if isinstance(p, dict)]
    return [pre]


def pre_tokenizer_name(tok: dict[str, Any]) -> str | None:
    """llama.cpp's tokenizer.ggml.pre for the pre-tokenizer structures we know, else None."""
    parts = _pretokenizers(tok.get("pre_tokenizer"))
    kinds = [p.get("type") for p in parts]
    if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits") \
            and parts[1].get("use_regex", True):
        return "smollm"
    if kinds == ["ByteLevel"] and parts[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Split", "ByteLevel"]:
        pattern = parts[0].get("pattern", {})
        regex = pattern.get("Regex", "") if isinstance(pattern, dict) else ""
        if r"\p{N}{1,3}" in regex and r"[^\r\n\p{L}\p{N}]?\p{L}+" in regex:
            return "llama-bpe"
        if r"\p{N}|" in regex and r"[^\r\n\p{L}\p{N}]?\p{L}+" in regex:
            return "qwen2"
    return None


def tokenizer_kvs(folder: Path, vocab_size: int | None, arch: str,
                  warn: Callable[[str], None]) -> list[KV]:
    tok = _read_json(folder / "tokenizer.json")
    cfg_path = folder / "tokenizer_config.json"
    cfg = _read_json(cfg_path) if cfg_path.exists() else {}
    model = tok.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        raise UnsupportedModelError(
            f"{folder}: only byte-level BPE tokenizers (tokenizer.json model type BPE) are "
            "converted from tokenizer.json; SentencePiece vocabularies are read from "
            "tokenizer.model for Gemma 3 only")
    vocab: dict[str, int] = dict(model.get("vocab") or {})
    added = {int(t["id"]): t for t in tok.get("added_tokens", []) if "id" in t}
    for i, t in added.items():
        vocab.setdefault(t["content"], i)
    by_id = {i: s for s, i in vocab.items()}
    n = max(vocab_size or 0, max(by_id) + 1)
    tokens: list[str] = []
    types: list[int] = []
    for i in range(n):
        s = by_id.get(i)
        if s is None:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        elif i in added:
            tokens.append(s)
            special = added[i].get("special") or looks_special(s)
            types.append(CONTROL if special else USER_DEFINED)
        else:
            tokens.append(s)
            types.append(NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    pre = pre_tokenizer_name(tok)
    if pre is None:
        warn("unrecognised pre-tokenizer in tokenizer.json; using llama.cpp's 'default'")
        pre = "default"
    kvs = [KV("tokenizer.ggml.model", V.STRING, "gpt2"),
           KV("tokenizer.ggml.pre", V.STRING, pre),
           KV("tokenizer.ggml.tokens", V.ARRAY, tokens, V.STRING),
           KV("tokenizer.ggml.token_type", V.ARRAY, types, V.INT32),
           KV("tokenizer.ggml.merges", V.ARRAY, merges, V.STRING)]
    for key, name in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
                      ("pad_token", "padding")):
        text = _content(cfg.get(key))
        if text is not None and text in vocab:
            kvs.append(KV(f"tokenizer.ggml.{name}_token_id", V.UINT32, vocab[text]))
    for key in ("add_bos_token", "add_eos_token"):
        if isinstance(cfg.get(key), bool):
            kvs.append(KV(f"tokenizer.ggml.{key}", V.BOOL, cfg[key]))
    if arch == "llama":  # llama.cpp writes it for llama-architecture BPE vocabularies
        kvs.append(KV("tokenizer.ggml.add_space_prefix", V.BOOL, False))
    template = cfg.get("chat_template")
    if isinstance(template, list):  # named templates: llama.cpp keeps "default"
        template = next((t.get("template") for t in template if t.get("name") == "default"),
                        None)
    if isinstance(template, str):
        kvs.append(KV("tokenizer.chat_template", V.STRING, template))
    return kvs
