"""Masker: the token masks of the constrained sequences, filled while the engine does other work.

    step N:   ... sample, advance matchers; masker.start(next step's guides)   # prefetch
              (outputs, detokenization, scheduling run meanwhile on the engine thread)
    step N+1: masker.start(guides)   # a no-op when the prefetch was for exactly these
              logits = runner.execute(...)
              masker.apply(rows, pairs)   # wait for the fill, then disallowed logits -> -inf

A mask depends only on its matcher's state, which is final once the previous token is
consumed, so the fill (llguidance, GIL released, on a worker thread) starts right then and runs
beside the engine thread's serial Python work — time in which the forward pass's cores idle —
and, if it is not done by then, beside the forward pass. LOCALINFER_MASK_OVERLAP=0 fills
synchronously in apply() instead (for measuring).

`MaskStats.per_seq_step` is what the engine thread spends on masks beyond the forward pass
(waiting for a fill, applying, advancing the matchers) per constrained sequence and step:
what `localinfer bench --structured` reports; `fill_s` is llguidance's own time.
"""

from __future__ import annotations

import os
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from localinfer.structured.guide import Guide

MAX_SAMPLES = 1 << 16


@dataclass(slots=True)
class MaskStats:
    steps: int = 0
    seq_steps: int = 0
    masks: int = 0  # masks computed
    fill_s: float = 0.0  # llguidance computing masks
    added_s: float = 0.0  # the engine thread's own time on constraints
    per_seq_step: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))

    def reset(self) -> None:
        self.steps = self.seq_steps = self.masks = 0
        self.fill_s = self.added_s = 0.0
        self.per_seq_step.clear()

    def record(self, n_seqs: int, added_s: float) -> None:
        self.steps += 1
        self.seq_steps += n_seqs
        self.added_s += added_s
        self.per_seq_step.extend([added_s / max(n_seqs, 1)] * n_seqs)


class Masker:
    def __init__(self, n_tokens: int, runner_threads: int | None = None,
                 overlap: bool | None = None) -> None:
        self.n_words = (n_tokens + 31) // 32
        if overlap is None:
            overlap = os.environ.get("LOCALINFER_MASK_OVERLAP", "1") != "0"
        self.overlap = overlap
        # threads of our own, as many as the runner leaves cores free (at least one), not
        # llguidance's LLExecutor: its rayon workers spin after a fill, which on 2 fully used
        # cores slowed the next forward pass by 2-6 ms per step (16 streams of Qwen 0.5B);
        # plain per-matcher calls took 0.4 ms per step for the same 16 masks, rayon 1.2-1.8
        cores = os.cpu_count() or 1
        self.workers = max(cores - (runner_threads or cores), 1)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="localinfer-mask")
        self._chunks = (ThreadPoolExecutor(self.workers, thread_name_prefix="localinfer-mask")
                        if self.workers > 1 else None)
        self._masks = np.empty((0, self.n_words), np.int32)
        self._pending: Future[float] | None = None
        self._key: tuple[Any, ...] | None = None  # which sequences the current masks are for
        self._guides: list[tuple[Guide, list[int]]] = []
        self.stats = MaskStats()

    def start(self, guides: list[Guide], key: tuple[Any, ...],
              guesses: list[list[int]] | None = None) -> None:
        """Begin filling the masks of the guides, in order: one per guide, or with `guesses`
        1 + len(guesses[i]) for guides[i] (a speculating sequence's verified rows, see
        Guide.fill_masks); `key` names the sequences and their guesses. Already started for
        the same key (prefetched): nothing to do."""
        if key == self._key:
            return
        self._wait()  # a fill in flight writes the buffer: let it finish first
        jobs = [(g, guesses[i] if guesses else []) for i, g in enumerate(guides)]
        self._key, self._guides = key, jobs
        self._reserve(sum(1 + len(d) for _, d in jobs))
        if self.overlap:
            self._pending = self._pool.submit(self._fill, jobs)

    def apply(self, logits: np.ndarray, pairs: list[tuple[int, int]]) -> None:
        """Mask logits row r with mask m (of the guides given to start) for each (r, m)."""
        from localinfer.structured.apply_mask import apply_bitmasks

        if self.overlap:
            self._wait()
        else:
            self.stats.fill_s += self._fill(self._guides)
        if pairs:
            rows = np.array([r for r, _ in pairs], np.int64)
            masks = np.array([m for _, m in pairs], np.int64)
            apply_bitmasks(logits, rows, self._masks, masks)
        self._key, self._guides = None, []  # the matchers advance next: these masks are spent

    def _wait(self) -> None:
        if self._pending is not None:
            self.stats.fill_s += self._pending.result()
            self._pending = None

    def _reserve(self, n: int) -> None:
        if len(self._masks) < n:
            self._masks = np.empty((max(n, 2 * len(self._masks)), self.n_words), np.int32)

    def _fill(self, jobs: list[tuple[Guide, list[int]]]) -> float:
        t0 = time.perf_counter()
        firsts = np.cumsum([0] + [1 + len(d) for _, d in jobs])
        if self._chunks is None or len(jobs) < 2:
            self._fill_rows(jobs, 0)
        else:
            step = -(-len(jobs) // self.workers)
            parts = [self._chunks.submit(self._fill_rows, jobs[k:k + step], int(firsts[k]))
                     for k in range(0, len(jobs), step)]
            for part in parts:
                part.result()
        self.stats.masks += int(firsts[-1])
        return time.perf_counter() - t0

    def _fill_rows(self, jobs: list[tuple[Guide, list[int]]], first: int) -> None:
        # each mask drops the GIL while llguidance walks the token trie
        size = self.n_words * 4
        at = self._masks.ctypes.data + first * size
        for g, guesses in jobs:
            g.fill_masks(at, size, guesses)
            at += (1 + len(guesses)) * size

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        if self._chunks is not None:
            self._chunks.shutdown(wait=False)

    def __del__(self) -> None:
        if hasattr(self, "_chunks"):  # a half-built Masker has no threads to stop
            self.close()
