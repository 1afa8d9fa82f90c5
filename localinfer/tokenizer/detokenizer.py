"""Streaming token ids -> text without ever emitting half a character.

A character may be spread over several byte-level tokens (emoji, CJK); its first bytes are held
until the rest arrive. Bytes that can never form a valid character become U+FFFD, the same text a
one-shot `bytes.decode("utf-8", "replace")` of everything would give, so the concatenation of all
`add()` results plus `flush()` equals `tokenizer.decode(ids)`.
"""

from __future__ import annotations

import codecs

from localinfer.tokenizer.base import Tokenizer
from localinfer.tokenizer.vocab import SKIPPABLE_ATTRS


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False) -> None:
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._chunks: list[str] = []
        self._text: str | None = ""

    def add(self, token_id: int) -> str:
        """New text completed by this token ("" while a character is still incomplete)."""
        piece = self.tokenizer.token_to_bytes(token_id)
        if self.skip_special and self.tokenizer.vocab.attrs[token_id] & SKIPPABLE_ATTRS:
            return ""
        return self._emit(self._decoder.decode(piece))

    def add_many(self, token_ids: list[int]) -> str:
        return "".join([self.add(t) for t in token_ids])

    def flush(self) -> str:
        """Whatever is pending, incomplete bytes as U+FFFD; call once the stream ends."""
        return self._emit(self._decoder.decode(b"", final=True))

    @property
    def pending_bytes(self) -> int:
        """Bytes held back because their character is not complete yet."""
        return len(self._decoder.getstate()[0])

    @property
    def text(self) -> str:
        """All text emitted so far."""
        if self._text is None:
            self._text = "".join(self._chunks)
            self._chunks = [self._text]
        return self._text

    def _emit(self, new: str) -> str:
        if new:
            self._chunks.append(new)
            self._text = None
        return new
