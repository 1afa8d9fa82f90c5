"""Sampler: greedy, filters, penalties, seeded reproducibility."""

from __future__ import annotations

import numpy as np

from localinfer.engine.sampler import (
    Sampler,
    apply_penalties,
    candidates,
    min_p,
    top_k,
    top_p,
)
from localinfer.engine.sequence import Sequence
from localinfer.sampling_params import SamplingParams


def seq(tokens=(1, 2), **params) -> Sequence:
    return Sequence(0, "r", list(tokens), SamplingParams(**params))


def logits(n=32, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, n)).astype(np.float32) * 2


def test_greedy_is_argmax_and_ties_go_to_lowest_id():
    x = logits()
    assert Sampler()(x, [seq()]) == [int(np.argmax(x[0]))]
    tie = np.zeros((1, 8), np.float32)
    tie[0, [3, 5]] = 1.0
    assert Sampler()(tie, [seq()]) == [3]


def test_batched_greedy_equals_each_row_alone():
    """A batch of plain greedy rows takes one argmax over the block: the same tokens (ties to
    the lowest id in each row) as row by row, and a batch mixing in a penalized row too."""
    x = np.random.default_rng(3).standard_normal((5, 40)).astype(np.float32)
    x[2, [7, 30]] = 9.0  # a tie in row 2
    alone = [Sampler()(x[i : i + 1], [seq()])[0] for i in range(5)]
    assert Sampler()(x, [seq() for _ in range(5)]) == alone
    assert alone[2] == 7
    mixed = [seq() for _ in range(5)]
    mixed[4] = seq(tokens=(alone[4],), repetition_penalty=50.0)
    got = Sampler()(x, mixed)
    assert got[:4] == alone[:4] and got[4] != alone[4]


def test_top_k_1_equals_greedy():
    x = logits()
    for seed in range(5):
        assert Sampler()(x, [seq(temperature=1.5, top_k=1, seed=seed)]) == [int(np.argmax(x[0]))]


def test_seeded_sampling_is_reproducible_and_batch_independent():
    x = logits(seed=3)
    a = [Sampler()(x, [seq(temperature=1.0, seed=42)])[0] for _ in range(1)]
    s1 = seq(temperature=1.0, seed=42)
    s2 = seq(temperature=1.0, seed=42)
    other = seq(temperature=1.0, seed=7)
    alone = [Sampler()(x, [s1])[0] for _ in range(20)]
    batched = [Sampler()(np.concatenate([x, x]), [other, s2])[1] for _ in range(20)]
    assert alone == batched and alone[0] == a[0]
    assert len(set(alone)) > 1  # it does sample


def test_input_logits_are_not_modified():
    x = logits()
    before = x.copy()
    Sampler()(x, [seq(temperature=0.7, top_k=3, repetition_penalty=1.3, seed=1)])
    assert np.array_equal(x, before)


def test_repetition_penalty_llama_cpp_style():
    x = np.array([2.0, -2.0, 2.0, -2.0], np.float32)
    out = apply_penalties(x.copy(), [0, 1], SamplingParams(repetition_penalty=2.0))
    assert out.tolist() == [1.0, -4.0, 2.0, -2.0]


def test_presence_and_frequency_penalties():
    x = np.zeros(4, np.float32)
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    out = apply_penalties(x, [2, 2, 2, 1], p)
    assert out.tolist() == [0.0, -0.75, -1.25, 0.0]


def test_penalty_last_n_window_changes_greedy_choice():
    x = np.array([[0.0, 1.0, 0.9]], np.float32)
    s = seq(tokens=[1, 0, 0], repetition_penalty=2.0, penalty_last_n=2)
    assert Sampler()(x, [s]) == [1]  # token 1 is outside the window
    s = seq(tokens=[1, 0, 0], repetition_penalty=2.0, penalty_last_n=3)
    assert Sampler()(x, [s]) == [2]


def test_top_k_keeps_k_best():
    x = np.array([0.1, 3.0, 2.0, -1.0, 2.5], np.float32)
    ids, v = top_k(x, 2)
    assert ids.tolist() == [1, 4] and v.tolist() == x[[1, 4]].tolist()


def test_top_p_keeps_smallest_set_reaching_p():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    x = np.log(probs).astype(np.float32)
    assert top_p(*candidates(x), 0.5)[0].tolist() == [0]
    assert top_p(*candidates(x), 0.7)[0].tolist() == [0, 1]
    assert top_p(*candidates(x), 0.9)[0].tolist() == [0, 1, 2]
    # the kept ids stay ascending whatever the logits' order
    assert top_p(*candidates(x[::-1].copy()), 0.7)[0].tolist() == [2, 3]


def test_min_p_keeps_tokens_above_fraction_of_max():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    x = np.log(probs).astype(np.float32)
    assert min_p(*candidates(x), 0.25)[0].tolist() == [0, 1, 2]
    assert min_p(*candidates(x), 0.5)[0].tolist() == [0, 1]


def test_sampling_follows_the_distribution_roughly():
    x = np.log(np.array([[0.7, 0.2, 0.1]], np.float32))
    s = seq(temperature=1.0, seed=0)
    draws = [Sampler()(x, [s])[0] for _ in range(2000)]
    freq = np.bincount(draws, minlength=3) / 2000
    assert np.allclose(freq, [0.7, 0.2, 0.1], atol=0.04)


def test_token_logprob_matches_log_softmax():
    from localinfer.engine.sampler import token_logprob

    rng = np.random.default_rng(0)
    row = rng.standard_normal(100).astype(np.float32)
    ref = row.astype(np.float64) - np.log(np.exp(row.astype(np.float64)).sum())
    lp = token_logprob(row, 7, 5)
    assert lp.token_id == 7 and abs(lp.logprob - ref[7]) < 1e-6  # float32 exponentials
    assert [i for i, _ in lp.top] == list(np.argsort(-ref)[:5])
    assert np.allclose([v for _, v in lp.top], np.sort(ref)[::-1][:5])
    assert token_logprob(row, 7, 0).top == []


def test_any_integer_seed_is_accepted_and_reproducible():
    from localinfer.engine.sampler import make_generator
    from localinfer.sampling_params import SamplingParams

    for seed in (-1, -(2**63), 2**64 + 5):
        a = make_generator(SamplingParams(seed=seed)).random(4)
        b = make_generator(SamplingParams(seed=seed)).random(4)
        assert (a == b).all()


def _full_row_distribution(row: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The chain as it reads on the whole row (each filter sets dropped logits to -inf, then
    one softmax over every token): what the candidate filters must reproduce."""
    x = row.astype(np.float32).copy()
    if 0 < p.top_k < x.shape[0]:
        x[x < np.partition(x, -p.top_k)[-p.top_k]] = -np.inf
    if p.top_p < 1.0:
        alive = np.flatnonzero(np.isfinite(x))
        order = alive[np.argsort(-x[alive], kind="stable")]
        e = np.exp(x[order] - x[order].max())
        n_keep = int(np.searchsorted(np.cumsum(e / e.sum()), p.top_p)) + 1
        x[order[n_keep:]] = -np.inf
    if p.min_p > 0.0:
        x[x < x.max() + np.log(p.min_p)] = -np.inf
    z = x.astype(np.float64) / p.temperature
    e = np.exp(z - z.max())
    return e / e.sum()


def test_candidate_filters_give_the_whole_rows_distribution():
    """top-k, top-p and min-p on candidates keep exactly the tokens the whole-row chain keeps,
    with the same probabilities, and a seeded draw picks the same token."""
    from localinfer.engine.sampler import kept, make_generator, probabilities, sample

    rng = np.random.default_rng(5)
    settings = [dict(top_k=40, top_p=0.95, min_p=0.05), dict(top_k=0, top_p=0.9, min_p=0.0),
                dict(top_k=7, top_p=1.0, min_p=0.2), dict(top_k=0, top_p=1.0, min_p=0.0)]
    for trial in range(24):
        row = (rng.standard_normal(3000) * rng.uniform(0.5, 4)).astype(np.float32)
        row[rng.integers(0, 3000, 5)] = row.max()  # ties at the top
        p = SamplingParams(temperature=float(rng.uniform(0.3, 1.5)), seed=trial,
                           **settings[trial % len(settings)])
        ref = _full_row_distribution(row, p)
        ids, v = kept(row, p)
        assert ids.tolist() == np.flatnonzero(ref > 0).tolist()
        assert np.allclose(probabilities(v, p.temperature), ref[ids], rtol=1e-12, atol=0)
        a, b = make_generator(p), make_generator(p)
        cdf = np.cumsum(ref)
        whole = [min(int(np.searchsorted(cdf, a.random() * cdf[-1], side="right")), 2999)
                 for _ in range(20)]
        assert [sample(row, p, b) for _ in range(20)] == whole


def test_a_masked_row_draws_only_allowed_tokens():
    """A structured-output mask leaves fewer tokens than top_k: only those are ever drawn."""
    row = np.full((1, 500), -np.inf, np.float32)
    row[0, [3, 250, 499]] = [0.5, 0.0, 1.0]
    s = seq(temperature=1.0, top_k=40, top_p=0.95, min_p=0.0, seed=4)
    assert set(Sampler()(row, [s])[0] for _ in range(300)) == {3, 250, 499}
