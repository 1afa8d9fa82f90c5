"""A built tokenizer as plain data and back: what the tokenizer cache stores.

to_state() keeps everything that building a tokenizer from GGUF metadata computes (the vocabulary
after llama.cpp's renaming and special-token detection, the end-of-generation set, the special
tokens in splitting order, BPE ranks or SentencePiece scores) as types that marshal writes and
that load in C without a Python step per token: the token texts joined into one string, the
attributes as bytes, ranks and scores as little-endian arrays.  from_state() checks the type and
size of every field and every id against the vocabulary, and raises ValueError for anything
else, so a damaged entry is rebuilt rather than used.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from localinfer.tokenizer.base import Tokenizer
from localinfer.tokenizer.bpe import BpeTokenizer
from localinfer.tokenizer.pretokenize import spec_named
from localinfer.tokenizer.spm import SpmTokenizer
from localinfer.tokenizer.vocab import ID_NAMES, TokenAttr, Vocab

# Characters no vocabulary is expected to hold; the first one absent from every text joins them.
_SEPARATORS = ("\x00", "\x1f", "\ufdd0", "\U0010fffe", "\U0010ffff")
_ATTRS = [TokenAttr(v) for v in range(64)]  # every combination of the six attribute flags
_ATTR_BYTES = bytes(range(len(_ATTRS)))


def to_state(tok: Tokenizer) -> dict[str, Any]:
    """The tokenizer's data; ValueError when it cannot be stored (no free separator)."""
    v = tok.vocab
    state: dict[str, Any] = {
        "tokens": _join(v.tokens),
        "attrs": bytes(v.attrs),
        "ids": dict(v.ids),
        "eog": _pack(sorted(v.eog_ids)),
        "specials": [_pack([i for _, i in v.special_tokens(flag)]) for flag in (False, True)],
        "add_bos": tok.add_bos,
        "add_eos": tok.add_eos,
    }
    if isinstance(tok, BpeTokenizer):
        lines = sorted(tok._ranks, key=tok._ranks.__getitem__)  # rank order
        state.update(model="bpe", pre=tok.pre_tokenizer.spec.name, merges=_join(lines),
                     ranks=np.array([tok._ranks[m] for m in lines], "<i4").tobytes())
    elif isinstance(tok, SpmTokenizer):
        state.update(model="spm", scores=np.array(tok._scores, "<f8").tobytes(),
                     add_space_prefix=tok.add_space_prefix)
    else:
        raise ValueError(f"cannot store a {type(tok).__name__}")
    return state


def from_state(state: Any) -> Tokenizer:
    """The tokenizer to_state() described; ValueError if `state` is not such a description."""
    if not isinstance(state, dict):
        raise ValueError("not a tokenizer state")
    tokens = _split(_get(state, "tokens", tuple))
    n = len(tokens)
    raw_attrs = _get(state, "attrs", bytes)
    if n == 0 or len(raw_attrs) != n or raw_attrs.translate(None, _ATTR_BYTES):
        raise ValueError("token attributes do not match the vocabulary")
    token_to_id = dict(zip(tokens, range(n), strict=True))
    if len(token_to_id) != n:
        raise ValueError("repeated token texts")
    ids = _get(state, "ids", dict)
    if tuple(ids) != ID_NAMES or not all(i is None or _is_id(i, n) for i in ids.values()):
        raise ValueError("bad special token ids")
    eog = _ids(_get(state, "eog", bytes), n)
    specials = _get(state, "specials", list)
    if len(specials) != 2 or not all(isinstance(x, bytes) for x in specials):
        raise ValueError("bad special token lists")
    split_out = {}
    for flag in (False, True):
        picked = _ids(specials[flag], n)
        split_out[flag] = list(zip(map(tokens.__getitem__, picked), picked, strict=True))
    vocab = Vocab(tokens, list(map(_ATTRS.__getitem__, raw_attrs)), token_to_id, ids,
                  frozenset(eog), split_out)
    add_bos, add_eos = _get(state, "add_bos", bool), _get(state, "add_eos", bool)
    model = _get(state, "model", str)
    if model == "bpe":
        spec = spec_named(_get(state, "pre", str))
        lines = _split(_get(state, "merges", tuple))
        ranks = _array(_get(state, "ranks", bytes), "<i4", len(lines)).tolist()
        if spec is None:
            raise ValueError("unknown pre-tokenizer")
        return BpeTokenizer(vocab, dict(zip(lines, ranks, strict=True)), spec, add_bos, add_eos)
    if model == "spm":
        scores = _array(_get(state, "scores", bytes), "<f8", n)
        return SpmTokenizer(vocab, scores, add_bos=add_bos, add_eos=add_eos,
                            add_space_prefix=_get(state, "add_space_prefix", bool))
    raise ValueError(f"unknown tokenizer model {model!r}")


def _join(texts: list[str]) -> tuple[str, str, int]:
    """(separator, the texts joined by it, how many): one string loads far faster than a list."""
    whole = "".join(texts)
    for sep in _SEPARATORS:
        if sep not in whole:
            return sep, sep.join(texts), len(texts)
    raise ValueError("every separator occurs in the texts")


def _split(joined: tuple) -> list[str]:
    if len(joined) != 3 or not all(isinstance(x, t) for x, t in zip(joined, (str, str, int),
                                                                       strict=True)):
        raise ValueError("bad joined texts")
    sep, text, n = joined
    if sep not in _SEPARATORS:
        raise ValueError("bad separator")
    texts = text.split(sep) if n else []
    if len(texts) != n:
        raise ValueError("joined texts do not split into their count")
    return texts


def _get(state: dict, key: str, kind: type) -> Any:
    value = state.get(key)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ValueError(f"{key}: expected {kind.__name__}")
    return value


def _is_id(i: object, n: int) -> bool:
    return type(i) is int and 0 <= i < n


def _pack(ids: list[int]) -> bytes:
    return np.array(ids, "<i4").tobytes()


def _ids(raw: bytes, n: int) -> list[int]:
    if len(raw) % 4:
        raise ValueError("bad token id array")
    ids = np.frombuffer(raw, "<i4")
    if ids.size and not (ids.min() >= 0 and ids.max() < n):
        raise ValueError("token ids outside the vocabulary")
    return ids.tolist()


def _array(raw: bytes, dtype: str, n: int) -> np.ndarray:
    if len(raw) != n * np.dtype(dtype).itemsize:
        raise ValueError("array size does not match")
    return np.frombuffer(raw, dtype)
