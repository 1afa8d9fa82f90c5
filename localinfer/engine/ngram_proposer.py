"""NgramProposer: prompt lookup — the sequence's own text predicts its continuation.

The last n tokens of a sequence (its tail) are looked up in everything before them, prompt
and output alike; where they occurred before, the tokens that followed are the guess. n
runs from MAX_N down to MIN_N and the longest match wins, the most recent one among equally
long matches (vLLM's and llama.cpp's prompt lookup do the same). A match that overlaps the
tail (the text repeats with a period shorter than k) has fewer than k tokens after it: the
guess repeats them, as the text would. Code edits, summaries and
extraction repeat their input, so their guesses are often right; where they are not, the
sequence's AdaptiveK soon stops asking.

The search runs every step for every speculating sequence, so it is one compiled pass over
the tokens (find_continuation, O(len * MAX_N) at worst and stopping at the first MAX_N-long
match from the end), over a per-sequence array that only the new tokens are copied into.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from localinfer.engine.proposer import Proposer
from localinfer.engine.sequence import Sequence

MAX_N = 4
MIN_N = 2  # a single shared token predicts little: measured, it mostly cost steps in free text


@njit(nogil=True, cache=True, boundscheck=False)
def find_continuation(tokens: np.ndarray, n_tokens: int, min_n: int, max_n: int,
                      k: int) -> tuple[int, int]:
    """(start, length) in tokens of up to k tokens that followed the most recent longest
    earlier occurrence (min_n..max_n tokens) of tokens[n_tokens - max_n : n_tokens]; length
    0 when there is none."""
    last = n_tokens - 1
    best_len = 0
    best_end = -1
    for end in range(last - 1, min_n - 2, -1):  # a match ends at `end`, before the tail
        m = 0
        while m < max_n and m <= end and tokens[end - m] == tokens[last - m]:
            m += 1
        if m > best_len:
            best_len = m
            best_end = end
            if m == max_n:
                break
    if best_len < min_n:
        return 0, 0
    start = best_end + 1
    return start, min(k, n_tokens - start)


class NgramProposer(Proposer):
    name = "ngram"

    def __init__(self, min_n: int = MIN_N, max_n: int = MAX_N) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ngram sizes must satisfy 1 <= min_n <= max_n: {min_n}, {max_n}")
        self.min_n = min_n
        self.max_n = max_n
        self._tokens: dict[int, np.ndarray] = {}  # seq_id -> its token ids so far (grown)
        self._filled: dict[int, int] = {}

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        out: list[list[int]] = []
        for seq, k in zip(seqs, ks, strict=True):
            tokens = self._sync(seq)
            start, n = find_continuation(tokens, seq.num_tokens, self.min_n, self.max_n, k)
            guess = tokens[start : start + n].tolist()
            if 0 < n < k and start + n == seq.num_tokens:  # periodic text: continue the period
                guess = (guess * (k // n + 1))[:k]
            out.append(guess)
        return out

    def _sync(self, seq: Sequence) -> np.ndarray:
        """The sequence's tokens as an array: copy in only what was appended since."""
        n = seq.num_tokens
        buf = self._tokens.get(seq.seq_id)
        filled = self._filled.get(seq.seq_id, 0)
        if filled > n:  # the sequence got shorter (never during decoding): start over
            filled = 0
        if buf is None or buf.shape[0] < n:
            grown = np.empty(max(64, 2 * n), np.int32)
            if buf is not None:
                grown[:filled] = buf[:filled]
            buf = self._tokens[seq.seq_id] = grown
        buf[filled:n] = seq.token_ids[filled:n]
        self._filled[seq.seq_id] = n
        return buf

    def free(self, seq: Sequence) -> None:
        self._tokens.pop(seq.seq_id, None)
        self._filled.pop(seq.seq_id, None)
