"""SentencePiece-style BPE (`tokenizer.ggml.model == "llama"`): Gemma, Llama 2, Mistral, ...

Spaces become "▁"; the text is split into UTF-8 characters and adjacent symbols are merged
while their concatenation is a vocabulary entry, always the pair whose merged piece has the
highest score (the leftmost on ties), as llama.cpp's llm_tokenizer_spm_session does. A final
symbol that is not a token falls back to its bytes' <0xXX> tokens.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Iterable

import numpy as np

from localinfer.errors import TokenizerError
from localinfer.tokenizer.base import Tokenizer
from localinfer.tokenizer.vocab import KEY, Vocab

SPACE = "\u2581"  # "▁", SentencePiece's visible space
_WORD_CACHE_LIMIT = 65536


class SpmTokenizer(Tokenizer):
    def __init__(
        self,
        vocab: Vocab,
        scores: np.ndarray | list[float],
        *,
        add_bos: bool,
        add_eos: bool = False,
        add_space_prefix: bool = True,
    ) -> None:
        super().__init__(vocab, add_bos, add_eos)
        if len(scores) < vocab.n_vocab:
            raise TokenizerError(f"{KEY}scores has {len(scores)} entries for {vocab.n_vocab}")
        # float64 in an array, not a list of Python floats: 8 bytes a token instead of 32 (6 MB
        # less for gemma3's 262k tokens); indexing gives the same floats as float() of each
        self._scores = array("d", np.asarray(scores[: vocab.n_vocab], np.float64).tobytes())
        self.add_space_prefix = add_space_prefix
        self._byte_ids = [vocab.token_to_id.get(f"<0x{b:02X}>") for b in range(256)]
        self._cache: dict[str, tuple[int, ...]] = {}

    def _encode_fragments(self, fragments: Iterable[str | int], out: list[int]) -> None:
        # llama.cpp prefixes a space to text that starts the input or follows a special token
        prev_special = True
        for fragment in fragments:
            if isinstance(fragment, int):
                out.append(fragment)
                prev_special = True
                continue
            text = " " + fragment if self.add_space_prefix and prev_special else fragment
            out.extend(self._encode_text(text))
            prev_special = False

    def _encode_text(self, text: str) -> list[int]:
        text = text.replace(" ", SPACE)
        ids = self._cache.get(text)
        if ids is None:
            if len(self._cache) >= _WORD_CACHE_LIMIT:
                self._cache.clear()
            ids = self._cache[text] = tuple(self._merge(text))
        return list(ids)

    def _merge(self, text: str) -> list[int]:
        token_to_id, scores = self.vocab.token_to_id, self._scores
        syms = list(text)  # one symbol per character, merged in place
        n = len(syms)
        nxt = [*range(1, n), -1]
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, str]] = []

        def push(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            merged = syms[left] + syms[right]
            tid = token_to_id.get(merged)
            if tid is not None:
                heapq.heappush(heap, (-scores[tid], left, right, merged))

        for i in range(n - 1):
            push(i, i + 1)
        while heap:
            _, left, right, merged = heapq.heappop(heap)
            a, b = syms[left], syms[right]
            if not a or not b or a + b != merged:
                continue  # stale: one side was merged away since the pair was queued
            syms[left], syms[right] = merged, ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            push(prv[left], left)
            push(left, nxt[left])
        out: list[int] = []
        for sym in syms:
            if not sym:
                continue
            tid = token_to_id.get(sym)
            if tid is not None:
                out.append(tid)
                continue
            for byte in sym.encode("utf-8", "surrogatepass"):
                bid = self._byte_ids[byte]
                if bid is not None:
                    out.append(bid)
        return out

    def _normal_token_bytes(self, text: str) -> bytes:
        return text.replace(SPACE, " ").encode("utf-8", "surrogatepass")
