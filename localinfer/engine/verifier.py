"""Verifier: which of a sequence's speculative guesses the target model accepts.

A speculating sequence ran its last token and k guesses g_1..g_k in one forward pass, so the
step returns k + 1 logits rows: row j predicts the token after g_j (row 0: after the last
token). Each row is sampled exactly as plain decoding would sample it — the logit bias,
penalties over the tokens before it (the sequence's tokens, then the guesses accepted so
far), top-k, top-p, min-p, temperature, the request's own Generator — and the guesses are
checked in order (so a biased request verifies against its biased distribution, and its
tokens stay exactly plain decoding's):

- greedy: g_j is accepted while it equals the row's argmax; the first mismatch yields the
  argmax instead. The tokens are exactly plain greedy decoding's.
- sampling: the proposer's distribution q is one-hot on g_j (n-gram lookup; a draft model
  proposes greedily too), so rejection sampling with min(1, p/q) accepts g_j with
  probability p(g_j); on rejection the token is drawn from p with g_j removed and the rest
  renormalized — max(p - q, 0) normalized. Each emitted token then follows p exactly, as a
  plain draw would (the draws differ, so a seeded request's text does too).

When all k guesses are accepted the last row gives one more token (the bonus), so a
verification always yields 1..k + 1 tokens: the accepted guesses, then one of the target's.
"""

from __future__ import annotations

import numpy as np

from localinfer.engine.sampler import (
    draw,
    greedy,
    has_penalty,
    kept,
    last_tokens,
    make_generator,
    penalized,
    plain_greedy,
    probabilities,
)
from localinfer.engine.sequence import Sequence


def verify(rows: np.ndarray, seq: Sequence, guesses: list[int]) -> list[int]:
    """rows: (len(guesses) + 1, n_vocab) float32 logits, row j after guess j (row 0 after
    the sequence's last token). Returns the accepted guesses and the target's next token."""
    k = len(guesses)
    p = seq.sampling_params
    if plain_greedy(p):
        best = np.argmax(rows[: k + 1], axis=1).tolist()
        n = 0
        while n < k and best[n] == guesses[n]:
            n += 1
        return guesses[:n] + [best[n]]
    recent = last_tokens(seq.token_ids, p.penalty_last_n) if has_penalty(p) else []
    if not p.greedy and seq.generator is None:
        seq.generator = make_generator(p)
    out: list[int] = []
    for j in range(k + 1):
        x = penalized(rows[j], p, last_tokens(recent + out, p.penalty_last_n))
        guess = guesses[j] if j < k else None
        if p.greedy:
            token = greedy(x)
        else:
            ids, v = kept(x, p)
            token = _rejection_sample(ids, probabilities(v, p.temperature), guess,
                                      seq.generator)
        out.append(token)
        if token != guess:
            return out
    return out


def _rejection_sample(ids: np.ndarray, probs: np.ndarray, guess: int | None,
                      rng: np.random.Generator) -> int:
    """Accept the guess with probability p(guess), else draw from p without it; no guess
    (the bonus position): a plain draw.  ids (ascending) are the tokens the filters kept and
    probs their probabilities; a guess that is not among them has p = 0."""
    if guess is None:
        return int(ids[draw(probs, rng)])
    at = int(np.searchsorted(ids, guess))
    found = at < ids.shape[0] and ids[at] == guess
    if rng.random() < (probs[at] if found else 0.0):
        return guess
    if found:  # p(guess) < 1, so another kept token has p > 0
        probs[at] = 0.0
    return int(ids[draw(probs, rng)])
