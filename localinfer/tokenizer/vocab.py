"""The vocabulary shared by every tokenizer model: token texts, attributes and special ids.

Built from GGUF metadata following llama.cpp's rules (llama-vocab.cpp, llama_vocab::impl::load):
default special ids per model type, the text-based detection of end-of-turn / fill-in-the-middle
tokens (which also makes them control tokens), and the end-of-generation (EOG) set.
"""

from __future__ import annotations

import enum
import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from localinfer.errors import TokenizerError
from localinfer.gguf_strings import StringArray

log = logging.getLogger(__name__)

KEY = "tokenizer.ggml."


class TokenAttr(enum.IntFlag):
    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 4
    USER_DEFINED = 8
    UNUSED = 16
    BYTE = 32


# tokenizer.ggml.token_type values (gguf.TokenType) -> attribute
_TYPE_TO_ATTR = {
    1: TokenAttr.NORMAL,
    2: TokenAttr.UNKNOWN,
    3: TokenAttr.CONTROL,
    4: TokenAttr.USER_DEFINED,
    5: TokenAttr.UNUSED,
    6: TokenAttr.BYTE,
}

# Texts llama.cpp recognises when the metadata does not name the token (first match wins).
_EOT_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
)
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
# Tokens that end generation whatever their id metadata says.
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
})
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss

_ID_KEYS = {
    "bos": ("bos_token_id",), "eos": ("eos_token_id",), "eot": ("eot_token_id",),
    "eom": ("eom_token_id",), "unk": ("unknown_token_id",), "sep": ("seperator_token_id",),
    "pad": ("padding_token_id",), "mask": ("mask_token_id",),
    "fim_pre": ("fim_pre_token_id", "prefix_token_id"),
    "fim_suf": ("fim_suf_token_id", "suffix_token_id"),
    "fim_mid": ("fim_mid_token_id", "middle_token_id"),
    "fim_pad": ("fim_pad_token_id",), "fim_rep": ("fim_rep_token_id",),
    "fim_sep": ("fim_sep_token_id",),
}
ID_NAMES = tuple(_ID_KEYS)  # the keys of Vocab.ids

SPECIAL_ATTRS = TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN
SKIPPABLE_ATTRS = TokenAttr.CONTROL | TokenAttr.UNKNOWN  # hidden by decode(skip_special=True)


@dataclass(slots=True)
class Vocab:
    tokens: list[str]
    attrs: list[TokenAttr]
    token_to_id: dict[str, int]
    ids: dict[str, int | None]  # "bos", "eos", "eot", ... -> id or None
    eog_ids: frozenset[int] = field(default_factory=frozenset)
    # special_tokens() per parse_special, computed once: every tokenizer and the engine's
    # continuations ask for them, and the tokenizer cache stores them
    specials: dict[bool, list[tuple[str, int]]] = field(default_factory=dict)

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_metadata(cls, md: Mapping[str, Any], default_ids: Mapping[str, int]) -> Vocab:
        tokens = _string_list(md, KEY + "tokens")
        n = len(tokens)
        if n == 0:
            raise TokenizerError(f"{KEY}tokens is empty")
        # llama.cpp renames empty tokens so that they can never match text.
        if "" in tokens:
            tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        token_to_id = dict(zip(tokens, range(n), strict=True))  # in C, unlike a dictcomp
        if len(token_to_id) != n:
            raise TokenizerError(f"{KEY}tokens contains duplicate token texts")
        attrs = [TokenAttr.NORMAL] * n
        types = md.get(KEY + "token_type")
        if types is not None:
            types = _int_array(types, KEY + "token_type")
            if len(types) < n:
                raise TokenizerError(f"{KEY}token_type has {len(types)} entries for {n} tokens")
            attrs = list(map(_TYPE_TO_ATTR.get, types[:n].tolist(),
                             itertools.repeat(TokenAttr.UNDEFINED)))
        vocab = cls(tokens, attrs, token_to_id, _special_ids(md, default_ids, n))
        vocab._detect_special_texts()
        vocab.eog_ids = vocab._compute_eog()
        return vocab

    def _detect_special_texts(self) -> None:
        def first_present(texts: Sequence[str]) -> int | None:
            return next((self.token_to_id[t] for t in texts if t in self.token_to_id), None)

        wanted = {"eot": _EOT_TEXTS, "eom": ("<|eom_id|>",), **_FIM_TEXTS}
        for name, texts in wanted.items():
            if self.ids.get(name) is None:
                found = first_present(texts)
                if found is not None:
                    self.ids[name] = found
                    self.attrs[found] |= TokenAttr.CONTROL

    def _compute_eog(self) -> frozenset[int]:
        eog = {self.ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if self.ids[k] is not None}
        for text in _EOG_TEXTS:
            tid = self.token_to_id.get(text)
            if tid is not None:
                eog.add(tid)
                self.attrs[tid] |= TokenAttr.CONTROL
        for text in _ALWAYS_RENDERED:
            if text in self.token_to_id:
                self.attrs[self.token_to_id[text]] = TokenAttr.USER_DEFINED
        eog.update(self.ids[k] for k in ("eos", "eot", "eom") if self.ids[k] is not None)
        texts = {self.tokens[i]: i for i in eog}
        # gpt-oss / solar-open: "<|end|>" ends a message there, not the generation
        has_call = bool({"<|call|>", "<|calls|>"} & texts.keys())
        if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
            eog.discard(texts["<|end|>"])
            self.attrs[texts["<|end|>"]] = TokenAttr.USER_DEFINED
        # gemma4 and plamo have an ordinary "</s>"
        if "</s>" in texts and {"<|tool_response>", "<|plamo:eos|>"} & texts.keys():
            eog.discard(texts["</s>"])
            self.attrs[texts["</s>"]] = TokenAttr.NORMAL
        return frozenset(eog)

    def special_tokens(self, parse_special: bool) -> list[tuple[str, int]]:
        """Tokens split out of raw text, longest (in UTF-8 bytes) first, as llama.cpp orders them.

        Without parse_special only user-defined tokens are split out; control and unknown tokens
        are then treated as plain text.  The list is shared: callers must not change it.
        """
        found = self.specials.get(parse_special)
        if found is not None:
            return found
        allowed = SPECIAL_ATTRS if parse_special else TokenAttr.USER_DEFINED
        # each distinct attribute tested once (an IntFlag `&` per token of a 150k vocabulary
        # cost more than a second of every start), then the tokens picked without a Python-level
        # step per token: compress/map/set lookups all run in C
        matching = {a for a in set(self.attrs) if a & allowed}
        tokens = self.tokens
        picked = itertools.compress(range(len(tokens)), map(matching.__contains__, self.attrs))
        found = [(tokens[i], i) for i in picked]
        # a stable sort: equal lengths keep id order
        found.sort(key=lambda ti: -len(ti[0].encode("utf-8", "surrogatepass")))
        self.specials[parse_special] = found
        return found


def _string_list(md: Mapping[str, Any], key: str) -> list[str]:
    value = md.get(key)
    if value is None:
        raise TokenizerError(f"GGUF metadata has no {key}")
    if isinstance(value, StringArray):  # what the GGUF parser gives: strings by construction
        return value.to_list()
    if not isinstance(value, list | tuple) or not all(isinstance(t, str) for t in value):
        raise TokenizerError(f"{key} must be an array of strings")
    return list(value)


def _int_array(value: Any, key: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise TokenizerError(f"{key} must be an integer array, got {arr.dtype} {arr.shape}")
    return arr


def _special_ids(
    md: Mapping[str, Any], defaults: Mapping[str, int], n: int
) -> dict[str, int | None]:
    ids: dict[str, int | None] = {}
    for name, keys in _ID_KEYS.items():
        default = defaults.get(name)
        tid = default if default is not None and 0 <= default < n else None
        for key in keys:
            value = md.get(KEY + key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise TokenizerError(f"{KEY}{key} must be an integer, got {value!r}")
            if 0 <= int(value) < n:
                tid = int(value)
            else:  # llama.cpp keeps the default id and warns
                log.warning("%s%s = %s is outside the vocabulary; ignored", KEY, key, value)
        ids[name] = tid
    return ids
