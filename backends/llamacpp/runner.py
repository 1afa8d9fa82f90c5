"""LlamaCppModelRunner: llama.cpp's decoder under localinfer's scheduler and block manager.

One engine step is one llama_decode carrying every scheduled sequence's tokens (decodes and
prefill chunks), each token tagged with its sequence's llama.cpp sequence id. The engine's
pool of num_blocks * block_size cells is llama.cpp's KV cache, laid out one of two ways:

- per-sequence streams (kv_unified off, as llama-server's slots): one stream of
  n_ctx / n_streams cells per llama.cpp sequence id, so a token attends only to its own
  sequence's cells (16 served sequences of ~250 tokens: ~18% less CPU time than in the
  unified pool, whose masked cells of other sequences still cost).
  A stream caps a sequence's length and the streams cap the live sequences; the engine
  honours both (fit_kv). Prefix reuse copies a whole stream, then trims it.
- one unified pool (kv_unified on): any sequence may use every cell, so the engine's
  block budget is llama.cpp's cell budget; prefix reuse copies single blocks.

The engine picks the layout when it is created (fit_kv): streams when every one of its
max_num_seqs sequences gets a stream that holds max_model_len tokens, else the unified
pool; the kv_unified option forces either. kv_map.KVMap says which llama.cpp sequence holds
which block and turns prefix-cache hits into llama_memory_seq_cp.

Speculative decoding: a sequence's rejected guesses leave llama.cpp's cache through
llama_memory_seq_rm of its positions past the accepted ones (rollback).
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
        kv_unified: bool | None = None,
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
        self.n_seq_max_option = n_seq_max
        self.kv_unified_option = kv_unified
        cparams = self._cparams = lib.llama_context_default_params()
        cparams.n_batch = self.n_cells  # a step never writes more tokens than there are cells
        cparams.n_ubatch = min(n_ubatch, self.n_cells)
        # sliding-window layers keep every cell too: a copied prefix must be complete
        cparams.swa_full = True
        cparams.n_threads = cparams.n_threads_batch = self.threads
        cparams.no_perf = True
        # None (default): llama.cpp decides, as llama-server does; on CPU that is on, and
        # flash attention skips masked cells (those of other sequences in the unified
        # pool). False: as llama-cpp-python's Llama, whose greedy outputs ours then equal
        # bit for bit
        if flash_attn is not None:
            cparams.flash_attn_type = int(flash_attn)
        # set by fit_kv (the engine calls it; execute falls back to the unified pool)
        self.kv_unified = True
        self.n_seq_max = 0
        self.max_seq_len = self.n_cells  # longest sequence a llama.cpp sequence id holds
        self.kv: KVMap | None = None
        self._buf = BatchBuffer(lib, self.n_cells)
        self.tokens_decoded = 0  # tokens sent to llama_decode, recomputed prefixes included
        self.decode_calls = 0

    # -- the KV cache layout -----------------------------------------------------------------

    def fit_kv(self, max_num_seqs: int, max_model_len: int) -> tuple[int, int | None]:
        """Create the llama.cpp context for an engine that runs up to max_num_seqs
        sequences of up to max_model_len tokens. Returns (the longest sequence, the most
        live sequences; None: no limit) that this layout holds, for the engine to honour."""
        if self._ctx is not None:
            raise RuntimeError("the llama.cpp context exists already")
        max_seqs = self.lib.llama_max_parallel_sequences()
        streams = min(self.n_seq_max_option or max_num_seqs, max_seqs, self.num_blocks)
        blocks_per_stream = self.num_blocks // streams
        unified = self.kv_unified_option
        if unified is None:  # streams only where they shorten no sequence
            unified = streams < 2 or blocks_per_stream * self.block_size < max_model_len
        if unified:
            # every live or retired sequence holds >= 1 cell, so n_cells ids always suffice
            # (and llama.cpp wants n_seq_max <= n_batch)
            self._create_context(min(self.n_seq_max_option or max_seqs, max_seqs,
                                     self.n_cells), unified=True, n_ctx=self.n_cells)
            return self.n_cells, None
        # llama.cpp pads each stream to a multiple of 256 cells (as it does llama-server's
        # slots); the engine keeps to its own pool, so the padding cells stay unused
        self.max_seq_len = blocks_per_stream * self.block_size
        self._create_context(streams, unified=False, n_ctx=streams * self.max_seq_len)
        return self.max_seq_len, streams

    def _create_context(self, n_seq_max: int, *, unified: bool, n_ctx: int) -> None:
        cparams = self._cparams
        cparams.n_ctx = n_ctx
        cparams.n_seq_max = n_seq_max
        cparams.kv_unified = unified
        self._ctx = self.lib.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            self.close()
            layout = "unified" if unified else f"{n_seq_max} streams"
            raise UnsupportedModelError(
                f"llama.cpp could not create a context of {n_ctx} KV cells ({layout})")
        got = self.lib.llama_n_ctx(self._ctx)
        if got < n_ctx:
            self.close()
            raise UnsupportedModelError(f"llama.cpp gave {got} KV cells, asked for {n_ctx}")
        self.kv_unified, self.n_seq_max = unified, n_seq_max
        self._memory = self.lib.llama_get_memory(self._ctx)
        self.kv = KVMap(self, self.block_size, n_seq_max,
                        max_seq_len=None if unified else self.max_seq_len)

    # -- counters --------------------------------------------------------------------------

    @property
    def prefix_tokens_copied(self) -> int:
        return self.kv.prefix_tokens_copied if self.kv is not None else 0

    @property
    def prefix_tokens_recomputed(self) -> int:
        return self.kv.prefix_tokens_recomputed if self.kv is not None else 0

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
        if self.kv is None:  # no engine sized it: the unified pool
            self.fit_kv(1, self.n_cells)
        kv = self.kv
        assert kv is not None
        starts = batch.seq_starts
        inputs = [kv.prepare(seq_id, batch.block_tables[i], batch.positions[starts[i]],
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

    def rollback(self, seq_id: int, num_tokens: int, freed_blocks: list[int]) -> None:
        if self.kv is not None:
            self.kv.rollback(seq_id, num_tokens)

    def free_sequence(self, seq_id: int, block_table: list[int], cached: set[int]) -> None:
        if self.kv is not None:
            self.kv.free(seq_id, block_table, cached)

    def close(self) -> None:
        if self._ctx:
            self.lib.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            self.lib.llama_model_free(self._model)
            self._model = None
