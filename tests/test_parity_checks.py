"""The parity helpers (parity_checks.py) against the plain float64 formulas they replace."""

from __future__ import annotations

import numpy as np
from parity_checks import ROWS, confident_mismatches, kl_per_position, lead, log_softmax, row_leads


def _logits(rows: int, vocab: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ref = (rng.standard_normal((rows, vocab)) * 4 + 10).astype(np.float32)
    ours = ref + (rng.standard_normal((rows, vocab)) * 0.05).astype(np.float32)
    ours[3] = ref[3]  # one identical row: KL 0
    ours[5, 7] += 30  # one row whose top-1 moved: a large KL
    return ref, ours


def test_kl_matches_the_float64_log_softmax_formula() -> None:
    ref, ours = _logits(2 * ROWS + 5, 3000, 1)  # more rows than one chunk, a partial last one
    lr, lo = log_softmax(ref), log_softmax(ours)
    expected = (np.exp(lr) * (lr - lo)).sum(axis=1)
    got = kl_per_position(ref, ours)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-7)
    assert abs(got[3]) < 1e-7 and got[5] > 1.0


def test_leads_and_confident_mismatches() -> None:
    ref, ours = _logits(ROWS + 3, 500, 2)
    ref[0, :2] = ref[0].max() + 1  # a tie at the top: lead 0
    expected = np.array([lead(r) for r in ref])
    np.testing.assert_allclose(row_leads(ref), expected, rtol=0, atol=0)
    assert row_leads(ref)[0] == 0.0
    differ = ref.argmax(1) != ours.argmax(1)
    assert differ[5]
    want = np.flatnonzero(differ & (expected >= 1.0))
    assert confident_mismatches(ref, ours).tolist() == want.tolist()
