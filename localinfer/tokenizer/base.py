"""The Tokenizer interface and what every model type shares: special tokens, BOS/EOS, decoding.

A model type (BPE, SentencePiece, ...) subclasses Tokenizer and implements `_encode_text`, which
tokenizes one fragment of plain text, and `_normal_token_bytes`, which turns an ordinary vocabulary
entry back into bytes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any

from localinfer.errors import InvalidRequestError, TokenizerError
from localinfer.tokenizer.vocab import SKIPPABLE_ATTRS, SPECIAL_ATTRS, TokenAttr, Vocab


class Tokenizer(ABC):
    """Text <-> token ids, identical to llama.cpp on the same GGUF vocabulary."""

    def __init__(self, vocab: Vocab, add_bos: bool, add_eos: bool = False) -> None:
        self.vocab = vocab
        self.add_bos = add_bos
        self.add_eos = add_eos
        if add_bos and vocab.ids["bos"] is None:
            raise TokenizerError("the vocabulary adds a BOS token but has no BOS token id")
        if add_eos and vocab.ids["eos"] is None:
            raise TokenizerError("the vocabulary adds an EOS token but has no EOS token id")
        self._specials = {flag: vocab.special_tokens(flag) for flag in (False, True)}
        self._piece_cache: list[bytes | None] = [None] * vocab.n_vocab

    @staticmethod
    def from_gguf(metadata: Mapping[str, Any]) -> Tokenizer:
        """The tokenizer a GGUF file's metadata describes; raises TokenizerError."""
        from localinfer.tokenizer.factory import tokenizer_from_gguf

        return tokenizer_from_gguf(metadata)

    # ---- properties --------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return self.vocab.n_vocab

    @property
    def bos_id(self) -> int | None:
        return self.vocab.ids["bos"]

    @property
    def eos_id(self) -> int | None:
        return self.vocab.ids["eos"]

    @property
    def eog_ids(self) -> frozenset[int]:
        return self.vocab.eog_ids

    def is_special(self, token_id: int) -> bool:
        """Control and unknown tokens: the ones decode(skip_special=True) leaves out."""
        return bool(self.vocab.attrs[self._check_id(token_id)] & SKIPPABLE_ATTRS)

    def token_text(self, token_id: int) -> str:
        """The vocabulary entry as stored in the GGUF file (e.g. "Ġthe")."""
        return self.vocab.tokens[self._check_id(token_id)]

    # ---- encoding ----------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids for `text`, like llama_tokenize(text, add_special, parse_special).

        add_special adds BOS (and EOS) when the vocabulary asks for them; parse_special turns
        the text of control tokens such as "<|im_start|>" into those tokens.
        """
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self.vocab.ids["bos"])  # type: ignore[arg-type]
        if text:
            self._encode_fragments(split_special(text, self._specials[parse_special]), out)
        if add_special and self.add_eos:
            out.append(self.vocab.ids["eos"])  # type: ignore[arg-type]
        return out

    def _encode_fragments(self, fragments: Iterable[str | int], out: list[int]) -> None:
        for fragment in fragments:
            if isinstance(fragment, int):
                out.append(fragment)
            else:
                out.extend(self._encode_text(fragment))

    @abstractmethod
    def _encode_text(self, text: str) -> list[int]:
        """Tokens for plain text that contains no special tokens."""

    # ---- decoding ----------------------------------------------------------------------------
    def token_to_bytes(self, token_id: int) -> bytes:
        """The raw bytes this token contributes to the text (special tokens as their text)."""
        piece = self._piece_cache[self._check_id(token_id)]
        if piece is None:
            piece = self._token_bytes(token_id)
            self._piece_cache[token_id] = piece
        return piece

    def _token_bytes(self, token_id: int) -> bytes:
        attr = self.vocab.attrs[token_id]
        text = self.vocab.tokens[token_id]
        if attr & SPECIAL_ATTRS:
            return text.encode("utf-8", "surrogatepass")
        if attr & TokenAttr.NORMAL:
            return self._normal_token_bytes(text)
        if attr & TokenAttr.BYTE:
            return bytes([int(text[3:5], 16)])  # "<0xAB>"
        return b""  # unused / undefined tokens render as nothing, as in llama.cpp

    @abstractmethod
    def _normal_token_bytes(self, text: str) -> bytes:
        """Bytes of an ordinary vocabulary entry."""

    def decode_bytes(self, ids: Iterable[int], skip_special: bool = False) -> bytes:
        attrs = self.vocab.attrs
        parts = []
        for tid in ids:
            piece = self.token_to_bytes(tid)
            if skip_special and attrs[tid] & SKIPPABLE_ATTRS:
                continue
            parts.append(piece)
        return b"".join(parts)

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of the tokens; bytes that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids, skip_special).decode("utf-8", "replace")

    def _check_id(self, token_id: int) -> int:
        if not 0 <= token_id < self.vocab.n_vocab:
            raise InvalidRequestError(
                f"token id {token_id} is outside the vocabulary (0..{self.vocab.n_vocab - 1})"
            )
        return token_id


def split_special(text: str, specials: list[tuple[str, int]]) -> list[str | int]:
    """Cut special-token texts out of `text` (llama.cpp's tokenizer_st_partition).

    Tokens are tried longest first; each one splits every remaining text fragment at all of its
    occurrences, left to right, so a longer token wins over a shorter one it contains.
    """
    fragments: list[str | int] = [text]
    for tok_text, tok_id in specials:
        if tok_text not in text:
            continue
        new: list[str | int] = []
        for frag in fragments:
            if isinstance(frag, int) or tok_text not in frag:
                new.append(frag)
                continue
            for k, part in enumerate(frag.split(tok_text)):
                if k:
                    new.append(tok_id)
                if part:
                    new.append(part)
        fragments = new
    return fragments
