"""NumbaModelRunner: the llama forward pass in our own Numba kernels over the paged KV pool."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import localinfer.backends.numba_cpu  # noqa: F401  (sets NUMBA_CACHE_DIR before numba loads)
import numpy as np

from localinfer.backend import ModelRunner
from localinfer.errors import InvalidRequestError, UnsupportedModelError

from .compile_notice import CompileNotice
from .kernel_thread import kernel_thread
from .thread_budget import ThreadBudget

if TYPE_CHECKING:
    from localinfer.engine.batch import ScheduledBatch
    from localinfer.gguf_file import GGUFFile
    from localinfer.model_config import ModelConfig


def physical_cores() -> int:
    """Cores we may run on, counting SMT siblings once (at least 1)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return max(1, (os.cpu_count() or 2) // 2)
    cores = set()
    for cpu in cpus:
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(base + "core_id") as f1, open(base + "physical_package_id") as f2:
                cores.add((f1.read().strip(), f2.read().strip()))
        except OSError:
            cores.add((str(cpu), "0"))
    return max(1, len(cores))


class NumbaModelRunner(ModelRunner):
    name = "numba"
    # gemma3's sliding-window layers keep K/V in their own pool of num_swa_blocks blocks
    # (LLM sizes it from the window: engine/sliding_window.py); None = as many as num_blocks
    sliding_window_pool = True

    def __init__(self, gguf: GGUFFile, config: ModelConfig, *, num_blocks: int, block_size: int,
                 threads: int | None = None, progress: bool = False,
                 max_num_batched_tokens: int = 512, isa: str | None = None,
                 num_swa_blocks: int | None = None) -> None:
        super().__init__(gguf, config, num_blocks=num_blocks, block_size=block_size,
                         threads=threads, progress=progress)
        if config.arch not in ("llama", "qwen2", "gemma3"):
            raise UnsupportedModelError(f"numba backend: architecture {config.arch!r}")
        import numba

        from .cache_load import lazy_refresh
        from .cached_weights import load_weights
        from .isa import Isa, resolve_isa
        from .kv_pages import kv_zeros
        from .llama import llama_step, make_buffers

        self.threads = threads or physical_cores()
        lazy_refresh()  # before the first kernel loads from the cache (cache_load.py)
        self._numba_threads = min(self.threads, numba.config.NUMBA_NUM_THREADS)
        numba.set_num_threads(self._numba_threads)
        self._budget = ThreadBudget(self._numba_threads)
        self._kernels = kernel_thread()
        config.check_tensors(gguf)
        c = config
        self.isa = resolve_isa(isa)
        if self.isa != "generic" and (block_size % 16 or c.head_dim % 16 or c.n_ff % 16):
            if isa or os.environ.get("LOCALINFER_ISA", "auto") != "auto":
                raise InvalidRequestError(f"ISA {self.isa!r} needs block_size, head_dim and "
                                          "n_ff to be multiples of 16")
            self.isa = "generic"
        self._isa = Isa(self.isa)
        self.token_group = self._isa.token_group  # 4 on the vpdpbusd paths (isa.py)
        weight_types = sorted({t.type_name for t in gguf.tensors.values()})
        self._compile_notice = CompileNotice(c.arch, self.isa, *weight_types, enabled=progress)
        # weights_from_cache: mapped from the repacked-weight cache rather than repacked
        weights, self.weights_from_cache = load_weights(gguf, c, tiled=self.isa != "generic")
        gguf.release_pages()  # the tokenizer and metadata were parsed; tensors live in weights
        # -- gemma3: its own step and two KV pools (global, sliding-window); see gemma3.py
        self._gemma3 = None
        if c.arch == "gemma3":
            from .gemma3 import Gemma3Forward

            self.sliding_window = c.sliding_window if any(c.swa_layers) else 0
            self.num_swa_blocks = num_swa_blocks or num_blocks
            self._gemma3 = Gemma3Forward(weights, c, self._isa, self.isa, num_blocks=num_blocks,
                                         num_swa_blocks=self.num_swa_blocks,
                                         block_size=block_size, threads=self.threads,
                                         max_tokens=max_num_batched_tokens)
            self.weights = self._gemma3.weights
            return
        # --
        self.weights = weights
        # f16 bits; the avx512 attention keeps K transposed within each block
        if self.isa == "generic":
            k_shape = v_shape = (c.n_layers, num_blocks, block_size, c.n_kv_heads, c.head_dim)
        else:
            k_shape = (c.n_layers, num_blocks, c.n_kv_heads, c.head_dim, block_size)
            v_shape = (c.n_layers, num_blocks, c.n_kv_heads, block_size, c.head_dim)
        self.k_pool, self.v_pool = kv_zeros(k_shape), kv_zeros(v_shape)
        self._dims = (c.n_layers, c.n_embd, c.n_heads, c.n_kv_heads, c.head_dim, c.n_ff,
                      c.rope_dim, block_size, int(c.rope_neox))
        self._step = llama_step
        self._make_buffers = make_buffers
        self._capacity = 0
        self._bufs: tuple = ()
        self._ensure_capacity(max_num_batched_tokens)

    def _ensure_capacity(self, n_tokens: int) -> None:
        if self._gemma3 is not None:
            self._gemma3.ensure_capacity(n_tokens)
            return
        if n_tokens <= self._capacity:
            return
        c = self.config
        self._bufs = self._make_buffers(n_tokens, c.n_embd, c.n_heads, c.n_kv_heads,
                                        c.head_dim, c.n_ff, c.rope_dim, self.threads,
                                        self.num_blocks * self.block_size)
        self._capacity = n_tokens

    def execute(self, batch: ScheduledBatch) -> np.ndarray:
        n = batch.num_tokens
        if batch.block_size != self.block_size:
            raise InvalidRequestError(
                f"batch block_size {batch.block_size} != runner block_size {self.block_size}")
        if n == 0:
            return np.zeros((0, self.config.n_vocab), np.float32)
        self._ensure_capacity(n)
        tokens = np.asarray(batch.token_ids, np.int64)
        if tokens.min() < 0 or tokens.max() >= self.config.n_vocab:
            raise InvalidRequestError("token id out of range")
        token_seq = np.repeat(np.arange(batch.num_seqs, dtype=np.int64),
                              np.diff(np.asarray(batch.seq_starts, np.int64)))
        width = max(1, max(len(t) for t in batch.block_tables))
        tables = np.zeros((batch.num_seqs, width), np.int64)
        for i, t in enumerate(batch.block_tables):
            tables[i, : len(t)] = t
        positions = np.asarray(batch.positions, np.int64)
        rows = np.asarray(batch.logits_indices, np.int64)
        logits = np.empty((len(rows), self.config.n_vocab), np.float32)
        w = self.weights
        c = self.config
        slots = np.asarray(batch.slot_mapping, np.int64)
        if self._gemma3 is not None:  # sliding layers address their own pool when it is given
            swa_tables, swa_slots = tables, slots
            if batch.swa_block_tables:
                swa_tables = np.zeros_like(tables)
                for i, t in enumerate(batch.swa_block_tables):
                    swa_tables[i, : len(t)] = np.maximum(t, 0)  # released (-1): never read
                swa_slots = np.asarray(batch.swa_slot_mapping, np.int64)
            from .gemma3 import gemma3_step

            self._kernels.run(self._on_kernel_thread, gemma3_step, *self._gemma3.step_args(
                tokens, positions, token_seq, tables, slots, swa_tables, swa_slots, rows,
                logits))
            return logits
        self._kernels.run(self._on_kernel_thread, self._step, self._isa, tokens, positions,
                          token_seq, tables, slots, rows, self._dims, np.float32(c.rms_eps),
                          float(c.rope_base), np.float32(1.0 / np.sqrt(c.head_dim)), w.embd,
                          w.head, w.out_norm, w.attn_norm, w.ffn_norm, w.bqkv, w.wqkv, w.wo,
                          w.wgu, w.wdown, w.q8k, self.k_pool, self.v_pool, self._bufs, logits)
        return logits

    def _on_kernel_thread(self, step: Callable[..., None], *args: Any) -> None:
        """Run a step on the kernel thread (kernel_thread.py), with this step's thread count:
        numba's count belongs to the calling thread, here always the kernel thread."""
        import numba

        threads = self._budget.now()  # fewer while other processes keep cores busy
        if numba.get_num_threads() != threads:
            numba.set_num_threads(threads)
        with self._compile_notice, self._compile_ahead(step, args):
            step(*args)

    def _compile_ahead(self, step: Any, args: tuple) -> AbstractContextManager[Any]:
        """While a step of a new kind compiles, a helper process compiles part of its kernels
        (compile_ahead.py)."""
        if not self._compile_notice.pending:
            return nullcontext()
        from .compile_ahead import CompileAhead, step_jobs

        return CompileAhead(step_jobs(step.py_func, args), step.py_func)

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes of the KV pools (both of gemma3's)."""
        if self._gemma3 is not None:
            g = self._gemma3
            return g.k_global.nbytes + g.v_global.nbytes + g.k_local.nbytes + g.v_local.nbytes
        return self.k_pool.nbytes + self.v_pool.nbytes

    def close(self) -> None:
        if self._gemma3 is not None:
            self._gemma3.close()
        self.weights = None  # type: ignore[assignment]
        self.k_pool = self.v_pool = np.zeros(0, np.uint16)
