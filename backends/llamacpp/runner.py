"""LlamaCppModelRunner: llama.cpp's decoder under localinfer's scheduler and block manager.

One engine step is one llama_decode carrying every scheduled sequence's tokens (decodes and
prefill chunks), each token tagged with its sequence's llama.cpp sequence id. The KV cache is
one unified pool of num_blocks * block_size cells shared by all sequences (kv_unified), so
the engine's block budget is llama.cpp's cell budget; kv_map.KVMap says which llama.cpp
sequence holds which block and turns prefix-cache hits into llama_memory_seq_cp.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from localinfer.backend import ModelRunner
from localinfer.errors import InvalidRequestError, UnsupportedModelError

from . import bindings
from .batch_buffer import BatchBuffer
from .kv_map import KVMap, SeqInput

if TYPE_CHECKING:
    from localinfer.engine.batch import ScheduledBatch
    from localinfer.gguf_file import GGUFFile
    from localinfer.model_config import ModelConfig


def default_threads() -> int:
    """One thread per physical core we may run on (llama.cpp gains nothing from SMT)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return max(1, (os.cpu_count() or 2) // 2)
    cores = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topo / "core_id").read_text(), (topo / "physical_package_id").read_text()))
        except OSError:
            cores.add((str(cpu), ""))
    return max(1, len(cores))


class LlamaCppModelRunner(ModelRunner):
    name = "llamacpp"
    supports_any_architecture = True

    def __init__(
        self,
        gguf: GGUFFile,
        config: ModelConfig,
        *,
        num_blocks: int,
        block_size: int,
        threads: int | None = None,
        progress: bool = False,
        n_gpu_layers: int = 0,
        n_seq_max: int | None = None,
        n_ubatch: int = 512,
        flash_attn: bool | None = None,
    ) -> None:
        super().__init__(gguf, config, num_blocks=num_blocks, block_size=block_size,
                         threads=threads, progress=progress)
        self.lib = lib = bindings.load()
        bindings.quiet_logs(lib)
        lib.llama_backend_init()
        self.threads = threads or default_threads()
        self._model: Any = None
        self._ctx: Any = None
        mparams = lib.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers
        # the file was opened and validated by localinfer first (RELIABILITY.md case 8)
        self._model = lib.llama_model_load_from_file(str(gguf.path).encode(), mparams)
        if not self._model:
            raise UnsupportedModelError(f"llama.cpp could not load {gguf.path}")
        kinds = [("recurrent", "llama_model_is_recurrent"), ("hybrid", "llama_model_is_hybrid"),
                 ("encoder-decoder", "llama_model_has_encoder"),
                 ("diffusion", "llama_model_is_diffusion")]
        for kind, fn in kinds:
            if hasattr(lib, fn) and getattr(lib, fn)(self._model):
                self.close()
                raise UnsupportedModelError(
                    f"llamacpp backend: {kind} model {config.arch!r} (its state is not paged KV)")
        self.n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self._model))
        if self.n_vocab != config.n_vocab:
            self.close()
            raise UnsupportedModelError(
                f"llama.cpp sees {self.n_vocab} tokens, the GGUF metadata {config.n_vocab}")
        self.n_cells = num_blocks * block_size
        max_seqs = lib.llama_max_parallel_sequences()
        # every live or retired sequence holds >= 1 cell, so n_cells ids always suffice
        # (and llama.cpp wants n_seq_max <= n_batch)
        self.n_seq_max = min(n_seq_max or max_seqs, max_seqs, self.n_cells)
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = self.n_cells
        cparams.n_batch = self.n_cells  # a step never writes more tokens than there are cells
        cparams.n_ubatch = min(n_ubatch, self.n_cells)
        cparams.n_seq_max = self.n_seq_max
        cparams.kv_unified = True  # one cell pool for all sequences, as the engine's blocks
        # sliding-window layers keep every cell too: a copied prefix must be complete
        cparams.swa_full = True
        cparams.n_threads = cparams.n_threads_batch = self.threads
        cparams.no_perf = True
        # None (default): llama.cpp decides, as llama-server does; on CPU that is on, and
        # flash attention skips the masked cells of the other sequences in the unified
        # pool (+20-30% aggregate decode at 16 sequences here). False: as llama-cpp-python's
        # Llama, whose greedy outputs ours then equal bit for bit
        if flash_attn is not None:
            cparams.flash_attn_type = int(flash_attn)
        self._ctx = lib.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            self.close()
            raise UnsupportedModelError(
                f"llama.cpp could not create a context of {self.n_cells} KV cells")
        self._memory = lib.llama_get_memory(self._ctx)
        self.kv = KVMap(self, block_size, self.n_seq_max)
        self._buf = BatchBuffer(lib, self.n_cells)
        self.tokens_decoded = 0  # tokens sent to llama_decode, recomputed prefixes included
        self.decode_calls = 0

    # -- counters --------------------------------------------------------------------------

    @property
    def prefix_tokens_copied(self) -> int:
        return self.kv.prefix_tokens_copied

    @property
    def prefix_tokens_recomputed(self) -> int:
        return self.kv.prefix_tokens_recomputed

    # -- KVMemory, for KVMap ------------------------------------------------------------------

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.lib.llama_memory_seq_cp(self._memory, src, dst, p0, p1)

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        if not self.lib.llama_memory_seq_rm(self._memory, seq, p0, p1):
            raise RuntimeError(f"llama.cpp refused to remove seq {seq} positions {p0}..{p1}")

    def seq_pos_max(self, seq: int) -> int:
        """Largest position llama.cpp holds for a sequence id (-1: none)."""
        return int(self.lib.llama_memory_seq_pos_max(self._memory, seq))

    # -- engine hooks -------------------------------------------------------------------------

    def execute(self, batch: ScheduledBatch) -> np.ndarray:
        """One llama_decode for the whole batch. The logits returned are a view of llama.cpp's
        output buffer, valid until the next execute (the engine samples from them within the
        step and copies what it keeps)."""
        if batch.block_size != self.block_size:
            raise InvalidRequestError(
                f"batch block_size {batch.block_size} != runner block_size {self.block_size}")
        if batch.num_tokens == 0:
            return np.zeros((0, self.n_vocab), np.float32)
        starts = batch.seq_starts
        inputs = [self.kv.prepare(seq_id, batch.block_tables[i], batch.positions[starts[i]],
                                  batch.token_ids[starts[i]:starts[i + 1]])
                  for i, seq_id in enumerate(batch.seq_ids)]
        rows = np.asarray(batch.logits_indices, np.int64)
        lengths = np.diff(np.asarray(starts, np.int64))
        llama_seqs = np.fromiter((inp.llama_seq for inp in inputs), np.int32, len(inputs))
        if any(inp.n_prefix for inp in inputs):
            rows = self._fill_with_prefixes(inputs, lengths, rows)
        else:  # the usual step: the batch's own arrays, no per-token Python
            self._buf.fill(np.asarray(batch.token_ids, np.int32),
                           np.asarray(batch.positions, np.int32),
                           np.repeat(llama_seqs, lengths), rows)
        n_tokens = self._buf.batch.n_tokens
        rc = self.lib.llama_decode(self._ctx, self._buf.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc} on {n_tokens} tokens of "
                               f"{batch.num_seqs} sequences (KV cells: {self.n_cells})")
        self.decode_calls += 1
        self.tokens_decoded += n_tokens
        return self._logits(rows)

    def _fill_with_prefixes(self, inputs: list[SeqInput], lengths: np.ndarray,
                            rows: np.ndarray) -> np.ndarray:
        """A step where some sequences recompute cached prefix blocks before their scheduled
        tokens (`lengths` per sequence); returns the logits rows moved past those prefixes."""
        tokens: list[int] = []
        for inp in inputs:
            tokens += inp.token_ids
        sizes = np.array([len(inp.token_ids) for inp in inputs], np.int64)
        pos = np.arange(len(tokens)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        pos += np.repeat([inp.first_pos for inp in inputs], sizes)
        seqs = np.repeat([inp.llama_seq for inp in inputs], sizes)
        shift = np.repeat(np.cumsum([inp.n_prefix for inp in inputs]), lengths)
        rows = rows + shift[rows]
        self._buf.fill(np.asarray(tokens, np.int32), pos, seqs, rows)
        return rows

    def _logits(self, rows: np.ndarray) -> np.ndarray:
        """llama.cpp keeps the output rows in batch order: (len(rows), n_vocab) in place."""
        ptr = self.lib.llama_get_logits(self._ctx)
        out = np.ctypeslib.as_array(ptr, shape=(len(rows), self.n_vocab))
        if len(rows) > 1 and not np.all(rows[1:] > rows[:-1]):  # engine asked out of order
            return out[np.argsort(np.argsort(rows))]
        return out

    def free_sequence(self, seq_id: int, block_table: list[int], cached: set[int]) -> None:
        self.kv.free(seq_id, block_table, cached)

    def close(self) -> None:
        if self._ctx:
            self.lib.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            self.lib.llama_model_free(self._model)
            self._model = None
