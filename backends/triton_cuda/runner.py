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
import torch  # an ImportError here becomes get_backend's install hint
import triton  # noqa: F401

from localinfer.backend import ModelRunner
from localinfer.errors import InvalidRequestError, UnsupportedModelError

from .device import pick_device
from .gemma3 import gemma3_step
from .llama import llama_step
from .step import Layout, Pools, Scratch, StepInputs
from .weights import TritonWeights

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
        config.check_tensors(gguf)
        c = config
        self.weights = TritonWeights.load(gguf, c, self.device)
        self.sliding_window = c.sliding_window if any(c.swa_layers) else 0
        self.num_swa_blocks = num_swa_blocks or num_blocks
        self.pools = Pools.allocate(c, num_blocks, self.num_swa_blocks, block_size, self.device)
        self.scratch = Scratch(c, max_num_batched_tokens, self.device)
        self._step = gemma3_step if c.arch == "gemma3" else llama_step
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
        if self.sliding_window and not batch.swa_block_tables:
            raise InvalidRequestError("triton backend: a gemma3 batch without its "
                                      "sliding-window block tables")
        if self._graphs is not None:
            logits = self._graphs.run(batch)
            if logits is not None:
                return logits
        return self.forward(batch).cpu().numpy()

    def pack(self, batch: ScheduledBatch, lay: Layout, qb: np.ndarray) -> np.ndarray:
        """StepInputs.pack, checked against this runner's vocabulary and pools."""
        host = StepInputs.pack(batch, lay, qb)
        StepInputs.check(host, lay, batch.num_tokens, self.config.n_vocab, self.block_size,
                         self.num_blocks, self.num_swa_blocks)
        return host

    def forward(self, batch: ScheduledBatch) -> torch.Tensor:
        """The step run eagerly: (n_logits, n_vocab) logits on the device."""
        c = self.config
        lay, qb, block_q, n_splits = Layout.of(batch, c.n_heads, c.n_kv_heads,
                                               self._split_target)
        dev = torch.from_numpy(self.pack(batch, lay, qb)).to(self.device)
        inputs = StepInputs.on_device(dev, lay, block_q, n_splits)
        return self._step(self.weights, c, inputs, self.pools, self.scratch)

    def close(self) -> None:
        self._graphs = None
        self.weights = None  # type: ignore[assignment]
        self.pools = None  # type: ignore[assignment]
        self.scratch = None  # type: ignore[assignment]
