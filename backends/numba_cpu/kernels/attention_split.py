"""How the vector attention kernels split one query's keys into chunks, and how they merge
the chunks (flash-decoding): shared by the vector kernels of attention_simd.py.

Keys are cut at fixed absolute positions, chunk k = positions k*chunk .. (k+1)*chunk - 1.  A
chunk's result is (o, m, l) per query head: o its output with probabilities normalized within
the chunk (and rounded to f16 before they meet f16 V, as in the unsplit kernel), m the largest
score, l the sum of exp(score - m).  A token's chunks merge in order k = first, first+1, ...
whichever threads computed them, so its result depends on its own context only — never on the
batch, the thread count or the split; a context within one chunk is bit for bit the unsplit
kernel's.

A row with no visible key in a chunk (a tile's earlier token, a chunk past its context) has
l = 0 and is left out of the merge; merging into an empty state (m = -inf, l = 0) copies the
part exactly, so a token's result is the same whether its first chunk starts the state or is
merged into an empty one.

Per-thread scratch row (one per query row: a tile's tokens x the GQA group's heads), in columns:
    [0, hd)                   Q rounded to f16
    [hd, 2hd + 2)             one chunk's (o, m, l)
    [2hd + 2, 2hd + 2 + C)    scores of one chunk, then its probabilities
    [2hd + 2 + C, 3hd + 4 + C)  the running merged (o, m, l)
    [3hd + 4 + C, width)      slots of (hd + 2) columns: chunk results of the split mode
"""

from __future__ import annotations

import numpy as np
from numba import njit

CHUNK = 256  # keys per chunk: long enough to amortize a merge, short enough to balance threads
SPLIT_ITEMS = 4  # split keys across threads when a step has fewer (token, kv head) items
# than this many per thread
TILE_TOKENS = 4  # consecutive tokens of one sequence whose query rows share each K / V load


@njit(nogil=True)
def plan_chunks(width, head_dim, block_size, n_threads):
    """-> (chunk, first slot column, slots per thread) for scratch rows of `width` columns.
    chunk is a whole number of blocks; a narrow scratch gets a shorter chunk."""
    fixed = 3 * head_dim + 4
    chunk = max(block_size, (CHUNK // block_size) * block_size)
    room = (width - fixed) // block_size * block_size
    if room < chunk:
        chunk = max(block_size, room)
    tail = fixed + chunk
    return chunk, tail, max(0, width - tail) // (head_dim + 2)


@njit(nogil=True)
def chunk_span(position, window, chunk):
    """First and last chunk holding keys visible from `position` (window 0: all before it)."""
    n_ctx = position + 1
    lo = max(0, n_ctx - window) if window > 0 else 0
    return lo // chunk, (n_ctx - 1) // chunk


@njit(nogil=True)
def slot(scratch, u, tail, head_dim, per_thread):
    """Slot u of the split mode: (group, head_dim + 2) columns of some thread's row tail."""
    c = tail + (u % per_thread) * (head_dim + 2)
    return scratch[u // per_thread, :, c:c + head_dim + 2]


@njit(nogil=True)
def merge(state, part, head_dim):
    """state <- the softmax-weighted union of state and part, both (rows, head_dim + 2);
    rows whose part is empty (l = 0) keep their state."""
    for h in range(state.shape[0]):
        ms, ls = state[h, head_dim], state[h, head_dim + 1]
        mp, lp = part[h, head_dim], part[h, head_dim + 1]
        if lp == 0.0:
            continue
        m = max(ms, mp)
        a = ls * np.exp(np.float32(ms - m))
        b = lp * np.exp(np.float32(mp - m))
        total = a + b
        wa = a / total
        wb = b / total
        for c in range(head_dim):
            state[h, c] = wa * state[h, c] + wb * part[h, c]
        state[h, head_dim] = m
        state[h, head_dim + 1] = total
