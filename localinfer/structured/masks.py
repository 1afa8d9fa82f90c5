"""Masker: the token masks of one step's constrained sequences, filled while the model runs.

    masker.start(guides)          # before runner.execute: llguidance fills the bitmasks on a
                                  # worker thread (its own thread pool, GIL released)
    logits = runner.execute(...)  # meanwhile the forward pass runs
    masker.apply(rows, pairs)     # wait for the fill, then disallowed logits -> -inf

The overlap needs a core the forward pass does not use; without one the masks are filled
after the forward pass, on all cores (LOCALINFER_MASK_OVERLAP=0/1 forces either way).

`added` is what the engine thread spends on masks beyond the forward pass (waiting for a fill
that is not done yet, applying, advancing the matchers): the cost a constrained sequence adds
to a step, which `localinfer bench --structured` reports per sequence-step.
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
    fill_s: float = 0.0  # llguidance computing masks (hidden behind the forward pass)
    added_s: float = 0.0  # the engine thread's own time on masks
    per_seq_step: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))

    def reset(self) -> None:
        self.steps = self.seq_steps = 0
        self.fill_s = self.added_s = 0.0
        self.per_seq_step.clear()


class Masker:
    def __init__(self, n_tokens: int, runner_threads: int | None = None,
                 overlap: bool | None = None) -> None:
        import llguidance

        self.n_words = (n_tokens + 31) // 32
        cores = os.cpu_count() or 1
        if overlap is None:
            # overlap only with a core to spare: on a machine whose cores all run the forward
            # pass, a fill thread beside it stalls the kernels' parallel regions (measured on
            # 2 cores: constrained single-stream decode 0.89x unconstrained with overlap)
            env = os.environ.get("LOCALINFER_MASK_OVERLAP")
            overlap = env == "1" if env in ("0", "1") else cores > (runner_threads or cores)
        self.overlap = overlap
        # filled alone (no overlap), the masks may use every core; beside the forward pass,
        # what the runner leaves free
        spare = cores - (runner_threads or cores) if overlap else cores
        self.executor = llguidance.LLExecutor(max(spare, 1))
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="localinfer-mask")
        self._masks = np.empty((0, self.n_words), np.int32)
        self._pending: Future[float] | None = None
        self._guides: list[Guide] = []
        self._fill_s = self._added_s = 0.0
        self.stats = MaskStats()

    def start(self, guides: list[Guide]) -> None:
        """Begin filling one mask per guide (mask i for guides[i])."""
        if len(self._masks) < len(guides):
            self._masks = np.empty((max(len(guides), 2 * len(self._masks)), self.n_words),
                                   np.int32)
        self._guides = guides
        if self.overlap:
            self._pending = self._pool.submit(self._fill, guides)

    def _fill(self, guides: list[Guide]) -> float:
        t0 = time.perf_counter()
        self.executor.unsafe_compute_mask_ptr(
            [(g.matcher, i) for i, g in enumerate(guides)], self._masks.ctypes.data,
            self.n_words * 4, len(self._masks))
        return time.perf_counter() - t0

    def apply(self, logits: np.ndarray, pairs: list[tuple[int, int]]) -> None:
        """Mask logits row r with mask m for each (r, m), in place."""
        from localinfer.structured.apply_mask import apply_bitmasks

        t0 = time.perf_counter()
        if self._pending is not None:
            self._fill_s = self._pending.result()
            self._pending = None
        else:
            self._fill_s = self._fill(self._guides)
        if pairs:
            rows = np.array([r for r, _ in pairs], np.int64)
            masks = np.array([m for _, m in pairs], np.int64)
            apply_bitmasks(logits, rows, self._masks, masks)
        self._added_s = time.perf_counter() - t0

    def end_step(self, advance_s: float) -> None:
        """Record the step: its masks plus `advance_s`, the time the matchers took to
        consume the sampled tokens."""
        st, n = self.stats, len(self._guides)
        added = self._added_s + advance_s
        st.steps += 1
        st.seq_steps += n
        st.fill_s += self._fill_s
        st.added_s += added
        st.per_seq_step.extend([added / max(n, 1)] * n)
        self._guides = []

    def close(self) -> None:
        self._pool.shutdown(wait=False)

    def __del__(self) -> None:
        pool: Any = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False)
