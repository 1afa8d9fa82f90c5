"""CUDA graphs for decode steps: one captured step per (batch-size bucket, block-table width).

A decode step of a 0.5B model is ~150 kernel launches of a few microseconds of GPU work each;
launched from Python they take longer to issue than to run.  A CUDA graph replays the whole
step as one launch.  Graphs need static inputs, so each bucket owns one packed int32 buffer
(StepInputs.pack's layout) that a step fills with a single host-to-device copy — the sequences
padded to the bucket with slot -1, so padding rows store no K/V — and its own scratch, which
eager steps never reallocate under it.  Buckets: 1, 2, 4, ... up to 64 sequences (decode only:
one token and one logits row per sequence); block-table widths: powers of two.  A bucket is
captured on first use, after one eager warm-up run that compiles its kernels.

LOCALINFER_CUDA_GRAPHS=0 turns them off (every step eager), e.g. to compare the two.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from localinfer.engine.batch import ScheduledBatch

from .attention import query_blocks
from .step import Layout, Scratch, StepInputs

if TYPE_CHECKING:
    from .runner import TritonModelRunner

MAX_BUCKET = 64


@dataclass(slots=True)
class _Graph:
    graph: torch.cuda.CUDAGraph
    static: torch.Tensor  # the packed inputs (device)
    inputs: StepInputs  # views of `static`: the graph reads them all
    layout: Layout
    qb: np.ndarray  # the bucket's query blocks (one per sequence)
    logits: torch.Tensor  # (bucket, n_vocab), written by every replay


class DecodeGraphs:
    def __init__(self, runner: TritonModelRunner, max_tokens: int) -> None:
        self.runner = runner
        self.enabled = os.environ.get("LOCALINFER_CUDA_GRAPHS", "1") != "0"
        self.max_bucket = min(MAX_BUCKET, max_tokens)
        self.pool = torch.cuda.graph_pool_handle()
        # graphs keep the addresses they were captured with: this scratch never frees a buffer
        self.scratch = Scratch(runner.config, self.max_bucket, runner.device, keep_retired=True)
        self.graphs: dict[tuple[int, int, bool], _Graph] = {}

    @staticmethod
    def _bucket(n: int) -> int:
        return 1 << (n - 1).bit_length()

    def run(self, batch: ScheduledBatch) -> np.ndarray | None:
        """The step's logits through a graph, or None when the batch is not a decode step
        that fits one (the runner then runs it eagerly)."""
        k = batch.num_seqs
        if (not self.enabled or k > self.max_bucket or batch.num_tokens != k
                or batch.seq_starts != list(range(k + 1))
                or batch.logits_indices != list(range(k))):
            return None
        bucket = min(self._bucket(k), self.max_bucket)
        width = max(16, self._bucket(max(len(t) for t in batch.block_tables)))
        if width > self.runner.num_blocks:
            width = self.runner.num_blocks
        swa = bool(batch.swa_block_tables)
        key = (bucket, width, swa)
        g = self.graphs.get(key) or self._capture(bucket, width, swa)
        self.graphs[key] = g
        g.static.copy_(torch.from_numpy(self.runner.pack(batch, g.layout, g.qb)))
        g.graph.replay()
        return g.logits[:k].cpu().numpy()

    def _capture(self, bucket: int, width: int, swa: bool) -> _Graph:
        r = self.runner
        static, inputs, lay, qb = static_inputs(r, bucket, width, swa)

        def step() -> torch.Tensor:
            return r._step(r.weights, r.config, inputs, r.pools, self.scratch)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()  # compiles the kernels and grows the scratch outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = step()
        return _Graph(graph, static, inputs, lay, qb, logits)


def static_inputs(r: TritonModelRunner, bucket: int, width: int,
                  swa: bool) -> tuple[torch.Tensor, StepInputs, Layout, np.ndarray]:
    """A bucket's packed input buffer (all padding until a step fills it: a warm-up stores no
    K/V), the StepInputs viewing it, its layout and its (fixed) query blocks."""
    c = r.config
    qb, block_q, n_splits = query_blocks(np.arange(bucket + 1), c.n_heads, c.n_kv_heads, width,
                                         r._split_target)
    lay = Layout(bucket, bucket, width, swa, bucket, qb.shape[1])
    empty = ScheduledBatch([], [], [], [0], [], [], [], [], r.block_size)
    static = torch.from_numpy(StepInputs.pack(empty, lay, qb)).to(r.device)
    return static, StepInputs.on_device(static, lay, block_q, n_splits), lay, qb
