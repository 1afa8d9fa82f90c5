"""Semantic checks on GGUF tokenizer metadata (RELIABILITY.md case 7).

These guard llama.cpp as much as us (case 8): llama.cpp reads tokenizer.ggml.scores and
tokenizer.ggml.token_type as raw float/int32 pointers over n_tokens entries, so a shorter array or
one of another element type would be read out of bounds there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from localinfer.errors import GGUFError
from localinfer.ggml_types import GGUFValueType

if TYPE_CHECKING:
    from localinfer.gguf_file import GGUFFile

_INT_TYPES = frozenset({
    GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
    GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64,
})

# key -> (value type, element type): what llama.cpp expects to find there.
_VOCAB_ARRAYS = {
    "tokenizer.ggml.tokens": GGUFValueType.STRING,
    "tokenizer.ggml.scores": GGUFValueType.FLOAT32,
    "tokenizer.ggml.token_type": GGUFValueType.INT32,
    "tokenizer.ggml.merges": GGUFValueType.STRING,
}
_PER_TOKEN = ("tokenizer.ggml.scores", "tokenizer.ggml.token_type")
_STRINGS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.chat_template")
_BOOLS = ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
          "tokenizer.ggml.add_space_prefix")


def special_token_keys(metadata: dict) -> list[str]:
    """Every tokenizer.ggml.*_token_id key present (bos, eos, eot, eom, pad, fim_*, ...)."""
    return [k for k in metadata if k.startswith("tokenizer.ggml.") and k.endswith("_token_id")]


def check_vocab(g: GGUFFile, n_vocab: int | None = None) -> None:
    """Raise GGUFError if the tokenizer metadata is inconsistent.

    n_vocab is the number of rows of the token embedding when the caller knows it; the token
    list must then have exactly that many entries.
    """
    meta, types = g.metadata, g.kv_types
    for key, etype in _VOCAB_ARRAYS.items():
        if key in meta and types[key] != (GGUFValueType.ARRAY, etype):
            raise GGUFError(f"{g.path}: {key} must be an array of {etype.name.lower()}, "
                            f"found {_type_str(types[key])}")
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is not None:
        if n_vocab is not None and len(tokens) != n_vocab:
            raise GGUFError(f"{g.path}: vocabulary has {len(tokens)} tokens but "
                            f"token_embd.weight has {n_vocab} rows")
        n_vocab = len(tokens)
        for key in _PER_TOKEN:
            if key in meta and len(meta[key]) != n_vocab:
                raise GGUFError(f"{g.path}: {key} has {len(meta[key])} entries but the "
                                f"vocabulary has {n_vocab} tokens")
    elif any(k in meta for k in _PER_TOKEN):
        raise GGUFError(f"{g.path}: tokenizer scores or token types without tokenizer.ggml.tokens")
    for key in _STRINGS:
        if key in meta and types[key][0] != GGUFValueType.STRING:
            raise GGUFError(f"{g.path}: {key} must be a string, found {_type_str(types[key])}")
    for key in _BOOLS:
        if key in meta and types[key][0] != GGUFValueType.BOOL:
            raise GGUFError(f"{g.path}: {key} must be a bool, found {_type_str(types[key])}")
    for key in special_token_keys(meta):
        if types[key][0] not in _INT_TYPES:
            raise GGUFError(f"{g.path}: {key} must be an integer, found {_type_str(types[key])}")
        value = meta[key]
        if value < 0 or (n_vocab is not None and value >= n_vocab):
            raise GGUFError(f"{g.path}: {key} = {value} is outside the vocabulary "
                            f"(0..{(n_vocab or 0) - 1})")


def _type_str(t: tuple[int, int | None]) -> str:
    vtype, etype = t
    name = GGUFValueType(vtype).name.lower()
    if etype is None:
        return name
    try:
        return f"array of {GGUFValueType(etype).name.lower()}"
    except ValueError:
        return f"array of type {etype}"
