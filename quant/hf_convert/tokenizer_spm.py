"""GGUF tokenizer metadata for SentencePiece vocabularies (Gemma 3's tokenizer.model), the way
llama.cpp's convert_hf_to_gguf.py fills it: tokenizer.ggml.model "llama", pieces, scores and types
by id (padded to the config's vocab_size with [PADn] / UNUSED), entries of added_tokens.json and of
tokenizer_config.json's added_tokens_decoder overriding their ids (special or special-looking ->
CONTROL, else USER_DEFINED, score -1000), special token ids looked up by content in tokenizer.json's
added_tokens then taken from config.json, add_bos/add_eos/add_sep from tokenizer.json's
TemplateProcessing and tokenizer_config.json, and the chat template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gguf.constants import GGUFValueType as V

from ..gguf_writer import KV
from .sentencepiece_model import BYTE, CONTROL, UNKNOWN, UNUSED, read_pieces
from .tokenizer_json import NORMAL, USER_DEFINED, _content, _read_json, looks_special

SPECIAL_KINDS = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
# llama.cpp's key spellings ("seperator" sic); it has no key for cls
GGUF_ID_NAME = {"bos": "bos", "eos": "eos", "unk": "unknown", "sep": "seperator",
                "pad": "padding", "mask": "mask"}


def _vocab(folder: Path, vocab_size: int | None,
           tok_cfg: dict[str, Any]) -> tuple[list[str], list[float], list[int]]:
    pieces = read_pieces(folder / "tokenizer.model")
    n = vocab_size or len(pieces)
    tokens = [f"[PAD{i}]" for i in range(n)]
    scores = [-10000.0] * n
    types = [UNUSED] * n
    for i, (piece, score, kind) in enumerate(pieces[:n]):
        tokens[i], scores[i] = piece, score
        # SentencePieceProcessor's predicates: user-defined pieces count as normal here
        types[i] = kind if kind in (UNKNOWN, CONTROL, UNUSED, BYTE) else NORMAL
    added_file = folder / "added_tokens.json"
    if added_file.is_file():
        for text, i in _read_json(added_file).items():
            if isinstance(i, int) and 0 <= i < n:
                tokens[i], scores[i], types[i] = text, -1000.0, USER_DEFINED
    for key, entry in (tok_cfg.get("added_tokens_decoder") or {}).items():
        i, text = int(key), entry.get("content")
        if not 0 <= i < n or not isinstance(text, str):
            continue
        if entry.get("special") or looks_special(text):
            types[i] = CONTROL
        else:
            text = text.replace("\u2581", " ")  # user-defined spaces, pre-normalized
            types[i] = USER_DEFINED
        tokens[i], scores[i] = text, -1000.0
    return tokens, scores, types


def _template_flags(post: Any, tok_cfg: dict[str, Any], add: dict[str, bool]) -> None:
    """add_bos/add_eos/add_sep from a simple TemplateProcessing post-processor."""
    if not isinstance(post, dict):
        return
    bos, eos = _content(tok_cfg.get("bos_token")), _content(tok_cfg.get("eos_token"))
    sep = _content(tok_cfg.get("sep_token"))
    for proc in post.get("processors", [post]):
        if proc.get("type") == "ByteLevel":
            add.setdefault("bos", False)
            add.setdefault("eos", False)
        if proc.get("type") != "TemplateProcessing":
            continue

        def special(item: Any) -> str | None:
            return (item.get("SpecialToken") or {}).get("id") if isinstance(item, dict) else None

        single, pair = proc.get("single") or [], proc.get("pair") or []
        first = special(single[0]) if len(single) > 1 else None
        last = special(single[-1]) if len(single) > 1 else None
        if first:
            add["bos"] = first == bos
        if last:
            add["eos"] = last == eos
        if pair:
            start = 1 if first and special(pair[0]) == first else 0
            stop = len(pair) - 1 if last and special(pair[-1]) == last else len(pair)
            middle = pair[start:stop][1:-1]
            if middle:
                mid = [special(m) for m in middle[:2]]
                add["sep"] = (mid[0] in (sep, eos) and not last) or \
                    (len(mid) == 2 and mid[1] in (sep, eos))


def spm_tokenizer_kvs(folder: Path, cfg: dict[str, Any], vocab_size: int | None) -> list[KV]:
    cfg_path = folder / "tokenizer_config.json"
    tok_cfg = _read_json(cfg_path) if cfg_path.exists() else {}
    tokens, scores, types = _vocab(folder, vocab_size, tok_cfg)
    tok_path = folder / "tokenizer.json"
    tok = _read_json(tok_path) if tok_path.exists() else {}
    added = [t for t in tok.get("added_tokens", []) if isinstance(t, dict)]
    add: dict[str, bool] = {}
    _template_flags(tok.get("post_processor"), tok_cfg, add)
    ids: dict[str, int] = {}
    for kind in SPECIAL_KINDS:
        flag = tok_cfg.get(f"add_{kind}_token")
        if isinstance(flag, bool):
            add.setdefault(kind, flag)  # the post-processor wins, as in llama.cpp
        text = _content(tok_cfg.get(f"{kind}_token"))
        i = next((t.get("id") for t in added if t.get("content") == text), None) \
            if text is not None else None
        if isinstance(i, int) and 0 <= i < len(tokens):
            ids[kind] = i
    text_cfg = cfg.get("text_config") or {}
    for kind in SPECIAL_KINDS:  # config.json only fills what the tokenizer files did not
        i = cfg.get(f"{kind}_token_id", text_cfg.get(f"{kind}_token_id"))
        if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(tokens):
            ids.setdefault(kind, i)
    kvs = [KV("tokenizer.ggml.model", V.STRING, "llama"),
           KV("tokenizer.ggml.pre", V.STRING, "default"),
           KV("tokenizer.ggml.tokens", V.ARRAY, tokens, V.STRING),
           KV("tokenizer.ggml.scores", V.ARRAY, scores, V.FLOAT32),
           KV("tokenizer.ggml.token_type", V.ARRAY, types, V.INT32)]
    kvs += [KV(f"tokenizer.ggml.{GGUF_ID_NAME[k]}_token_id", V.UINT32, i) for k, i in ids.items()
            if k in GGUF_ID_NAME]
    kvs += [KV(f"tokenizer.ggml.add_{k}_token", V.BOOL, v) for k, v in add.items()
            if k in ("bos", "eos", "sep")]
    template = tok_cfg.get("chat_template")
    if template is None:
        for alt in ("chat_template.jinja", "chat_template.json"):
            if (folder / alt).is_file():
                text = (folder / alt).read_text(encoding="utf-8")
                template = text if alt.endswith("jinja") else json.loads(text).get(
                    "chat_template")
                break
    if isinstance(template, list):  # named templates: llama.cpp keeps "default"
        template = next((t.get("template") for t in template if t.get("name") == "default"),
                        None)
    if isinstance(template, str):
        kvs.append(KV("tokenizer.chat_template", V.STRING, template))
    kvs.append(KV("tokenizer.ggml.add_space_prefix", V.BOOL, False))  # Gemma 3's converter
    return kvs
