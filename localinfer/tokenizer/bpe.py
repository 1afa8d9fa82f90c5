"""GPT-2 style byte-level BPE (`tokenizer.ggml.model == "gpt2"`): SmolLM, Qwen, Llama 3, ...

Each pre-tokenized word is turned into bytes, each byte into a printable stand-in character
(GPT-2's byte-to-unicode table), and adjacent symbols are merged by rank: always the pair with the
lowest rank, the leftmost one on ties, exactly like llama.cpp's llm_tokenizer_bpe_session.

Ranks are looked up by the merge line itself, "left right": no symbol ever contains a space (the
stand-in for byte 0x20 is "Ġ"), so `left + " " + right` is the one line that llama.cpp splits into
that pair, and lines it splits into pairs no symbol can form (a leading space, no space at all)
are never looked up.  Keying by the line spares splitting 150k lines and building 150k tuples.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Any

from localinfer.errors import TokenizerError
from localinfer.gguf_strings import StringArray
from localinfer.tokenizer.base import Tokenizer
from localinfer.tokenizer.pretokenize import PreTokenizer, PreTokenizerSpec
from localinfer.tokenizer.vocab import KEY, Vocab

_WORD_CACHE_LIMIT = 65536


def _byte_alphabet() -> list[str]:
    """GPT-2's table: printable Latin-1 bytes stand for themselves, the rest map from U+0100 on."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = [""] * 256
    extra = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


BYTE_TO_CHAR = _byte_alphabet()
CHAR_TO_BYTE = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
# str.translate table: a Latin-1 decoded byte string -> GPT-2 stand-in characters
_LATIN1_TO_ALPHABET = {b: c for b, c in enumerate(BYTE_TO_CHAR)}


def byte_encode(text: str) -> str:
    return text.encode("utf-8", "surrogatepass").decode("latin-1").translate(_LATIN1_TO_ALPHABET)


def parse_merges(merges: Any, n_tokens: int) -> dict[str, int]:
    """Merge line -> rank (its index), the first rank of a repeated line (std::map::emplace
    keeps the first)."""
    if isinstance(merges, StringArray):  # what the GGUF parser gives: strings by construction
        merges = merges.to_list()
    elif not isinstance(merges, list | tuple) or not all(isinstance(m, str) for m in merges):
        raise TokenizerError(f"{KEY}merges must be an array of strings")
    # built in C, last to first, so that the first of repeated lines is the one that stays
    n = len(merges)
    return dict(zip(reversed(merges), range(n - 1, -1, -1), strict=True))


class BpeTokenizer(Tokenizer):
    """Byte-level BPE with a pre-tokenizer chosen by `tokenizer.ggml.pre`."""

    def __init__(
        self,
        vocab: Vocab,
        ranks: Mapping[str, int],
        spec: PreTokenizerSpec,
        add_bos: bool,
        add_eos: bool = False,
    ) -> None:
        """ranks: "left right" merge line -> rank, as parse_merges() returns them."""
        super().__init__(vocab, add_bos, add_eos)
        self.pre_tokenizer = PreTokenizer(spec)
        self._ranks = dict(ranks)
        self._ignore_merges = spec.ignore_merges
        self._word_cache: dict[str, tuple[int, ...]] = {}

    def _encode_text(self, text: str) -> list[int]:
        out: list[int] = []
        cache = self._word_cache
        for word in self.pre_tokenizer.split(text):
            ids = cache.get(word)
            if ids is None:
                if len(cache) >= _WORD_CACHE_LIMIT:
                    cache.clear()
                ids = cache[word] = self._encode_word(byte_encode(word))
            out.extend(ids)
        return out

    def _encode_word(self, word: str) -> tuple[int, ...]:
        token_to_id = self.vocab.token_to_id
        if self._ignore_merges and word in token_to_id:
            return (token_to_id[word],)
        ids: list[int] = []
        for symbol in self._merge(word):
            tid = token_to_id.get(symbol)
            if tid is not None:
                ids.append(tid)
                continue
            # No such token: fall back to single-byte tokens of the symbol's UTF-8 text,
            # skipping bytes that have none (what llama.cpp does).
            for b in symbol.encode("utf-8"):
                tid = token_to_id.get(chr(b)) if b < 0x80 else None
                if tid is not None:
                    ids.append(tid)
        return tuple(ids)

    def _merge(self, word: str) -> list[str]:
        """Apply merges to the characters of `word` (one per byte) and return the symbols."""
        n = len(word)
        if n < 2:
            return [word] if word else []
        ranks = self._ranks
        syms = list(word)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap = []
        for i in range(n - 1):
            rank = ranks.get(syms[i] + " " + syms[i + 1])
            if rank is not None:
                heap.append((rank, i, i + 1, syms[i] + syms[i + 1]))
        heapq.heapify(heap)
        while heap:
            _, left, right, merged = heapq.heappop(heap)
            a, b = syms[left], syms[right]
            # Stale entries: one side was merged away or has grown since the pair was queued.
            if not a or not b or a + b != merged:
                continue
            syms[left] = merged
            syms[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            for x, y in ((prv[left], left), (left, nxt[left])):
                if x >= 0 and y >= 0:
                    rank = ranks.get(syms[x] + " " + syms[y])
                    if rank is not None:
                        heapq.heappush(heap, (rank, x, y, syms[x] + syms[y]))
        return [s for s in syms if s]

    def _normal_token_bytes(self, text: str) -> bytes:
        out = bytearray()
        for ch in text:
            b = CHAR_TO_BYTE.get(ch)
            if b is not None:
                out.append(b)
            else:  # not a byte stand-in: llama.cpp writes this marker (llama_decode_text)
                hexed = "".join(f"{x:02x}" for x in ch.encode("utf-8", "surrogatepass"))
                out += f"[UNK_BYTE_0x{hexed}{text}]".encode("utf-8", "surrogatepass")
        return bytes(out)
