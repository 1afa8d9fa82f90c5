"""BatchBuffer: a llama_batch whose arrays are numpy buffers we own, filled without a Python
loop per token. Every token belongs to exactly one llama.cpp sequence (prefix sharing is done
with llama_memory_seq_cp, not with multi-sequence tokens)."""

from __future__ import annotations

import ctypes
from types import ModuleType

import numpy as np


class BatchBuffer:
    def __init__(self, llama_cpp: ModuleType, capacity: int) -> None:
        self.capacity = capacity
        self.token = np.zeros(capacity, np.int32)  # (n,) token ids
        self.pos = np.zeros(capacity, np.int32)  # (n,) positions
        self.n_seq_id = np.ones(capacity, np.int32)  # (n,) always 1
        self.seq = np.zeros(capacity, np.int32)  # (n,) llama.cpp sequence id of each token
        self.logits = np.zeros(capacity, np.int8)  # (n,) 1 where logits are wanted
        # seq_id is an array of pointers: entry i points at self.seq[i]
        self._seq_ptrs = self.seq.ctypes.data + 4 * np.arange(capacity, dtype=np.uintp)
        c_int32_p = ctypes.POINTER(ctypes.c_int32)
        self.batch = llama_cpp.llama_batch()
        self.batch.token = self.token.ctypes.data_as(c_int32_p)
        self.batch.embd = ctypes.POINTER(ctypes.c_float)()
        self.batch.pos = self.pos.ctypes.data_as(c_int32_p)
        self.batch.n_seq_id = self.n_seq_id.ctypes.data_as(c_int32_p)
        self.batch.seq_id = self._seq_ptrs.ctypes.data_as(ctypes.POINTER(c_int32_p))
        self.batch.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))

    def fill(self, tokens: np.ndarray, pos: np.ndarray, seq: np.ndarray, rows: np.ndarray) -> None:
        """Set the batch to these (n,) tokens, positions and sequence ids; logits at `rows`."""
        n = len(tokens)
        if n > self.capacity:
            raise RuntimeError(f"{n} tokens exceed the llama_batch capacity {self.capacity}")
        self.token[:n] = tokens
        self.pos[:n] = pos
        self.seq[:n] = seq
        self.logits[:n] = 0
        self.logits[rows] = 1
        self.batch.n_tokens = n
