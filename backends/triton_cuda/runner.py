"""TritonModelRunner: the forward pass in Triton kernels on a CUDA GPU, over the engine's paged
KV pool, with the weights kept quantized in GPU memory.

The engine (scheduler, block manager, sampler, prefix cache, structured output) is the same as
for the CPU backends: this runner only turns a ScheduledBatch into the logits of the rows the
engine samples, copied back to the host.  Without a GPU, TRITON_INTERPRET=1 runs the same
kernels on the CPU (device.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import localinfer.backends.triton_cuda  # noqa: F401  (TRITON_CACHE_DIR before triton loads)
import numpy as np
import torch  # noqa: F401  (an ImportError here becomes get_backend's install hint)
import triton  # noqa: F401

from localinfer.backend import ModelRunner
from localinfer.errors import InvalidRequestError, UnsupportedModelError

from .device import pick_device

if TYPE_CHECKING:
    from localinfer.engine.batch import ScheduledBatch
    from localinfer.gguf_file import GGUFFile
    from localinfer.model_config import ModelConfig


class TritonModelRunner(ModelRunner):
    name = "triton"
    sliding_window_pool = True

    def __init__(self, gguf: GGUFFile, config: ModelConfig, *, num_blocks: int,
                 block_size: int, threads: int | None = None, progress: bool = False,
                 max_num_batched_tokens: int = 512, num_swa_blocks: int | None = None,
                 cuda_graphs: bool = True) -> None:
        super().__init__(gguf, config, num_blocks=num_blocks, block_size=block_size,
                         threads=threads, progress=progress)
        if config.arch not in ("llama", "qwen2", "gemma3"):
            raise UnsupportedModelError(f"triton backend: architecture {config.arch!r}")
        if block_size < 16 or block_size & (block_size - 1):
            raise InvalidRequestError(f"triton backend: block_size must be a power of two >= "
                                      f"16 (tensor-core tiles), got {block_size}")
        self.device = pick_device()

        from .gemma3 import gemma3_step
        from .llama import llama_step
        from .step import Pools, Scratch
        from .weights import TritonWeights

        config.check_tensors(gguf)
        c = config
        self.weights = TritonWeights.load(gguf, c, self.device)
        self.sliding_window = c.sliding_window if any(c.swa_layers) else 0
        self.num_swa_blocks = num_swa_blocks or num_blocks
        self.pools = Pools.allocate(c, num_blocks, self.num_swa_blocks, block_size, self.device)
        self.scratch = Scratch(c, max_num_batched_tokens, self.device)
        self._step = gemma3_step if c.arch == "gemma3" else llama_step
        group = c.n_heads // c.n_kv_heads
        self._group_p = 1 << (group - 1).bit_length()
        # a decode with fewer (sequence, KV head) programs than ~2 per SM splits its context
        self._split_target = 0
        if self.device.type == "cuda":
            self._split_target = 2 * torch.cuda.get_device_properties(
                self.device).multi_processor_count
        self._graphs = None
        if cuda_graphs and self.device.type == "cuda":
            from .graphs import DecodeGraphs

            self._graphs = DecodeGraphs(self, max_num_batched_tokens)

    def execute(self, batch: ScheduledBatch) -> np.ndarray:
        if batch.block_size != self.block_size:
            raise InvalidRequestError(
                f"batch block_size {batch.block_size} != runner block_size {self.block_size}")
        if batch.num_tokens == 0:
            return np.zeros((0, self.config.n_vocab), np.float32)
        if min(batch.token_ids) < 0 or max(batch.token_ids) >= self.config.n_vocab:
            raise InvalidRequestError("token id out of range")
        self._check_addresses(batch)
        if self._graphs is not None:
            logits = self._graphs.run(batch)
            if logits is not None:
                return logits
        return self.forward(batch).cpu().numpy()

    def _check_addresses(self, batch: ScheduledBatch) -> None:
        """A kernel given a slot or block outside its pool would write or read GPU memory
        that is not the pool's: refuse such a batch instead."""
        slots = self.num_blocks * self.block_size
        if self.sliding_window and not batch.swa_block_tables:
            raise InvalidRequestError("triton backend: a gemma3 batch without its "
                                      "sliding-window block tables")
        if max(batch.slot_mapping) >= slots or min(batch.slot_mapping) < 0 or any(
                max(t, default=0) >= self.num_blocks or min(t, default=0) < 0
                for t in batch.block_tables):
            raise InvalidRequestError("triton backend: KV slot or block outside the pool")
        if batch.swa_block_tables and (
                max(batch.swa_slot_mapping) >= self.num_swa_blocks * self.block_size
                or any(max(t, default=0) >= self.num_swa_blocks for t in batch.swa_block_tables)):
            raise InvalidRequestError("triton backend: KV slot or block outside the "
                                      "sliding-window pool")

    def forward(self, batch: ScheduledBatch):  # -> torch.Tensor (n_logits, n_vocab), device
        from .step import StepInputs

        self.scratch.ensure(batch.num_tokens)
        inputs = StepInputs.build(batch, self.device, self._group_p, self.config.n_kv_heads,
                                  self._split_target)
        return self._step(self.weights, self.config, inputs, self.pools, self.scratch)

    @property
    def kv_cache_bytes(self) -> int:
        return self.pools.nbytes()

    def close(self) -> None:
        self._graphs = None
        self.weights = None  # type: ignore[assignment]
        self.pools = None  # type: ignore[assignment]
        self.scratch = None  # type: ignore[assignment]
