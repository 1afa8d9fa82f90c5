"""Masker: the token masks of one step's constrained sequences.

    masker.start(guides)          # before runner.execute: llguidance fills the bitmasks on a
                                  # worker thread (its own thread pool, GIL released)
    logits = runner.execute(...)  # meanwhile the forward pass runs
    masker.apply(rows, pairs)     # wait for the fill, then disallowed logits -> -inf

The overlap needs a core the forward pass does not use; without one the masks are filled
after the forward pass, on all cores (LOCALINFER_MASK_OVERLAP=0/1 forces either way).

`MaskStats.per_seq_step` is what the engine thread spends on masks beyond the forward pass
(waiting for a fill, applying, advancing the matchers) per constrained
sequence and step: what `localinfer bench --structured` reports.
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
        import llguidance

        self.n_words = (n_tokens + 31) // 32
        cores = os.cpu_count() or 1
        if overlap is None:
            # overlap only with a core to spare: on a machine whose cores all run the forward
            # pass, a fill thread beside it stalls the kernels' parallel regions
            env = os.environ.get("LOCALINFER_MASK_OVERLAP")
            overlap = env == "1" if env in ("0", "1") else cores > (runner_threads or cores)
        self.overlap = overlap
        # beside the forward pass, the cores the runner leaves free; after it, one thread:
        # the kernels' OpenMP workers still spin after their last parallel region, and a
        # second fill thread competing with them was slower than one (2 cores: 16 masks of
        # Qwen's 151k vocabulary in 3.1-3.3 ms on one thread, 3.5-4.7 ms on two)
        spare = cores - (runner_threads or cores) if overlap else 1
        self.executor = llguidance.LLExecutor(max(spare, 1))
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="localinfer-mask")
        self._masks = np.empty((0, self.n_words), np.int32)
        self._pending: Future[float] | None = None
        self._guides: list[Guide] = []
        self.stats = MaskStats()

    def start(self, guides: list[Guide]) -> None:
        """Begin filling one mask per guide (mask i for guides[i])."""
        self._guides = guides
        if guides and self.overlap:
            self._reserve(len(guides))
            self._pending = self._pool.submit(self._fill, guides)

    def apply(self, logits: np.ndarray, pairs: list[tuple[int, int]]) -> None:
        """Mask logits row r with mask m (of the guides given to start) for each (r, m)."""
        if self._pending is not None:
            self.stats.fill_s += self._pending.result()
            self._pending = None
        else:
            self._reserve(len(self._guides))
            self.stats.fill_s += self._fill(self._guides)
        self._apply(logits, pairs)
        self._guides = []

    def _reserve(self, n: int) -> None:
        if len(self._masks) < n:
            self._masks = np.empty((max(n, 2 * len(self._masks)), self.n_words), np.int32)

    def _fill(self, guides: list[Guide]) -> float:
        t0 = time.perf_counter()
        self.executor.unsafe_compute_mask_ptr(
            [(g.matcher, i) for i, g in enumerate(guides)], self._masks.ctypes.data,
            self.n_words * 4, len(self._masks))
        self.stats.masks += len(guides)
        return time.perf_counter() - t0

    def _apply(self, logits: np.ndarray, pairs: list[tuple[int, int]]) -> None:
        from localinfer.structured.apply_mask import apply_bitmasks

        if pairs:
            rows = np.array([r for r, _ in pairs], np.int64)
            masks = np.array([m for _, m in pairs], np.int64)
            apply_bitmasks(logits, rows, self._masks, masks)

    def close(self) -> None:
        self._pool.shutdown(wait=False)

    def __del__(self) -> None:
        pool: Any = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False)
