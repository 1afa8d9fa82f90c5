"""Sampler: small composable numpy functions over one sequence's logits.

Order as llama.cpp's default chain: logit bias, penalties, top-k, top-p, min-p, temperature,
then a draw
from the sequence's own Generator (so a seeded request does not depend on what else is in
the batch). Temperature 0 is greedy: argmax, ties to the lowest token id.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from localinfer.engine.outputs import TokenLogprob
from localinfer.engine.sequence import Sequence
from localinfer.sampling_params import SamplingParams


def apply_logit_bias(logits: np.ndarray, bias: dict[int, float]) -> np.ndarray:
    """Add each biased token's bias to its logit (OpenAI's logit_bias). A token the
    structured-output mask removed stays at -inf: a bias never re-admits it."""
    ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
    logits[ids] += np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
    return logits


def apply_penalties(logits: np.ndarray, recent: list[int], p: SamplingParams) -> np.ndarray:
    """Repetition penalty (llama.cpp: divide positive, multiply negative logits of seen
    tokens), then presence and frequency penalties, over the recent tokens."""
    if not recent:
        return logits
    counts = Counter(recent)
    ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
    n = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
    x = logits[ids]
    if p.repetition_penalty != 1.0:
        x = np.where(x > 0, x / p.repetition_penalty, x * p.repetition_penalty)
    x = x - n * p.frequency_penalty - p.presence_penalty
    logits[ids] = x
    return logits


def top_k(logits: np.ndarray, k: int) -> np.ndarray:
    if 0 < k < logits.shape[0]:
        kth = np.partition(logits, -k)[-k]
        logits[logits < kth] = -np.inf
    return logits


def top_p(logits: np.ndarray, p: float) -> np.ndarray:
    """Keep the most likely tokens whose probabilities first reach p together."""
    if p >= 1.0:
        return logits
    alive = np.flatnonzero(np.isfinite(logits))
    order = alive[np.argsort(-logits[alive], kind="stable")]
    probs = softmax(logits[order])
    n_keep = int(np.searchsorted(np.cumsum(probs), p)) + 1  # includes the one crossing p
    logits[order[n_keep:]] = -np.inf
    return logits


def min_p(logits: np.ndarray, p: float) -> np.ndarray:
    """Drop tokens whose probability is below p times the most likely one's."""
    if p <= 0.0:
        return logits
    logits[logits < logits.max() + np.log(p)] = -np.inf
    return logits


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def greedy(logits: np.ndarray) -> int:
    return int(np.argmax(logits))  # first maximum: ties go to the lowest id


def probabilities(logits: np.ndarray, temperature: float) -> np.ndarray:
    """The distribution a draw at this temperature samples from (float64)."""
    return softmax(logits.astype(np.float64) / temperature)


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token from probabilities (which need not sum to exactly 1)."""
    cdf = np.cumsum(probs)
    i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return min(i, probs.shape[0] - 1)


def sample(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    return draw(probabilities(logits, temperature), rng)


def token_logprob(row: np.ndarray, token: int, k: int) -> TokenLogprob:
    """The chosen token's log-probability and the top k, from the raw logits row."""
    x = row.astype(np.float64)
    m = x.max()
    lse = m + np.log(np.exp(x - m).sum())
    top: list[tuple[int, float]] = []
    if k > 0:
        ids = np.argpartition(-x, k - 1)[:k]
        ids = ids[np.lexsort((ids, -x[ids]))]  # most likely first, ties by id
        top = [(int(i), float(x[i] - lse)) for i in ids]
    return TokenLogprob(token, float(x[token] - lse), top)


def recent_tokens(seq: Sequence, last_n: int) -> list[int]:
    return last_tokens(seq.token_ids, last_n)


def last_tokens(token_ids: list[int], last_n: int) -> list[int]:
    """The tokens the penalties look at: the last last_n (-1: all)."""
    if last_n == 0:
        return []
    return token_ids if last_n < 0 else token_ids[-last_n:]


def filtered(row: np.ndarray, p: SamplingParams, recent: list[int]) -> np.ndarray:
    """A copy of one logits row with the logit bias and the penalties over `recent` applied
    and, unless greedy, top-k, top-p and min-p: what greedy() or sample() then picks from."""
    x = np.array(row, dtype=np.float32)  # never modify the runner's buffer
    if p.logit_bias:
        x = apply_logit_bias(x, p.logit_bias)
    if has_penalty(p):
        x = apply_penalties(x, recent, p)
    if p.greedy:
        return x
    return min_p(top_p(top_k(x, p.top_k), p.top_p), p.min_p)


def make_generator(params: SamplingParams) -> np.random.Generator:
    # any integer is a valid seed (OpenAI clients send negative ones); numpy wants >= 0
    return np.random.default_rng(None if params.seed is None else params.seed % 2**64)


def has_penalty(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def plain_greedy(p: SamplingParams) -> bool:
    """Greedy on the raw logits: an argmax of the runner's row picks the token (no bias or
    penalty reshapes the row first)."""
    return p.greedy and not p.logit_bias and not has_penalty(p)


class Sampler:
    def __call__(self, logits: np.ndarray, seqs: list[Sequence]) -> list[int]:
        """logits: (n_seqs, n_vocab) float32, row i for seqs[i]. Returns one token each."""
        if seqs and all(plain_greedy(s.sampling_params) for s in seqs):
            # a batch of plain greedy decodes: one argmax over the block, not one per row
            return np.argmax(logits[: len(seqs)], axis=1).tolist()
        return [self.sample_one(logits[i], seq) for i, seq in enumerate(seqs)]

    def sample_one(self, row: np.ndarray, seq: Sequence) -> int:
        p = seq.sampling_params
        if plain_greedy(p):
            return greedy(row)
        x = filtered(row, p, recent_tokens(seq, p.penalty_last_n) if has_penalty(p) else [])
        if p.greedy:
            return greedy(x)
        if seq.generator is None:
            seq.generator = make_generator(p)
        return sample(x, p.temperature, seq.generator)
