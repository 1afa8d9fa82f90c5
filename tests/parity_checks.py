"""The parity criteria for teacher-forced logits against a reference (llama.cpp, or another
backend): no top-1 difference where the reference leads by >= 1.0, and a bound on the mean KL
divergence of our distribution from the reference's.

Why 1.0: llama.cpp disagrees with itself by that much.  Its AVX2 and its AVX-512 builds, on one
Xeon host and SmolLM2 Q4_1 (tests/test_numba_parity.py's text), differ by 0.18 logits on average
and 2.6 at most; at one position the AVX-512 build's top-1 led by 0.54 and the AVX2 build's by
0.46.  A lead of 0.5 made the test pass or fail with the host the reference was built on."""

from __future__ import annotations

import numpy as np

# rows per chunk in the whole-matrix helpers: a chunk's temporaries stay a few tens of MB
# where the whole (positions, vocab) float64 arrays took GBs (gemma3: 588 x 262144), whose
# allocation and page faults cost more than the arithmetic
ROWS = 16


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def kl_per_position(ref: np.ndarray, ours: np.ndarray) -> np.ndarray:
    """KL(softmax(ref) || softmax(ours)) per row of two (positions, vocab) logit arrays.

    With p = softmax(ref): KL = sum p (ref - ours) - (max_r - max_o) - log s_r + log s_o,
    s = the sums of exp(x - max x): two exponentials per element instead of three, taken in
    float32 (relative error ~1e-7) and summed in float64, so the result is within ~1e-6 of
    the float64 log-softmax formula (tests/test_parity_checks.py) for bounds of 1e-3 and up."""
    ref = np.asarray(ref, np.float32)
    ours = np.asarray(ours, np.float32)
    out = np.empty(len(ref))
    for i in range(0, len(ref), ROWS):
        r, o = ref[i:i + ROWS], ours[i:i + ROWS]
        mr, mo = r.max(axis=1), o.max(axis=1)
        er = np.exp(r - mr[:, None])
        sr = er.sum(axis=1, dtype=np.float64)
        so = np.exp(o - mo[:, None]).sum(axis=1, dtype=np.float64)
        cross = np.einsum("ij,ij->i", er, r - o, dtype=np.float64) / sr
        out[i:i + ROWS] = (cross - (mr.astype(np.float64) - mo) - np.log(sr) + np.log(so))
    return out


def row_leads(ref: np.ndarray) -> np.ndarray:
    """Per row: how far the top-1 logit leads the runner-up (0 for a tie)."""
    out = np.empty(len(ref), np.float64)
    for i in range(0, len(ref), ROWS):
        top2 = np.partition(ref[i:i + ROWS], -2, axis=1)[:, -2:].astype(np.float64)
        out[i:i + ROWS] = top2[:, 1] - top2[:, 0]
    return out


def lead(row: np.ndarray) -> float:
    """row_leads() of one row."""
    top2 = np.partition(row, -2)[-2:]
    return float(top2[1]) - float(top2[0])


def confident_mismatches(ref: np.ndarray, ours: np.ndarray, lead: float = 1.0) -> np.ndarray:
    """Positions where the reference's top-1 leads its runner-up by >= lead and ours differs."""
    return np.flatnonzero((row_leads(ref) >= lead) & (ref.argmax(1) != ours.argmax(1)))


def assert_parity(ref: np.ndarray, ours: np.ndarray, max_mean_kl: float) -> None:
    mismatch = confident_mismatches(ref, ours)
    assert mismatch.size == 0, f"top-1 differs at confident positions {mismatch.tolist()}"
    kl = kl_per_position(ref, ours)
    assert kl.mean() <= max_mean_kl, f"mean KL {kl.mean():.2e}, max {kl.max():.2e}"
