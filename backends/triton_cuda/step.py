"""What a step's kernels read besides the weights: the batch on the device, the KV pools and
the scratch activations.

StepInputs turns the scheduler's plain lists into device tensors — packed into one int32 array
on the host, so a step makes one host-to-device copy, not eight.  Scratch is allocated once
for the most tokens a step may carry and handed out as views, so steps do not allocate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from localinfer.engine.batch import ScheduledBatch
from localinfer.model_config import ModelConfig

from .attention import AttentionPlan, plan


@dataclass(slots=True)
class StepInputs:
    tokens: torch.Tensor  # (n_tokens,) int32
    positions: torch.Tensor  # (n_tokens,) int32
    slots: torch.Tensor  # (n_tokens,) int32: block * block_size + offset
    tables: torch.Tensor  # (n_seqs, width) int32
    swa_slots: torch.Tensor  # gemma3's sliding-window pool (the main ones without it)
    swa_tables: torch.Tensor
    rows: torch.Tensor  # (n_logits,) int64 token rows whose logits the step returns
    plan: AttentionPlan

    @staticmethod
    def pack(batch: ScheduledBatch, n: int, n_seqs: int, width: int, swa: bool) -> np.ndarray:
        """The batch as one int32 array (tokens, positions, slots, tables, then the sliding
        pool's tables and slots), padded to n tokens and n_seqs sequences: padding tokens
        are token 0 at position 0 with slot -1 (their K/V are not stored)."""
        m = batch.num_tokens
        host = np.zeros(3 * n + n_seqs * width * (2 if swa else 1) + (n if swa else 0),
                        np.int32)
        host[:m], host[n: n + m], host[2 * n: 2 * n + m] = (batch.token_ids, batch.positions,
                                                            batch.slot_mapping)
        host[2 * n + m: 3 * n] = -1
        tables = host[3 * n: 3 * n + n_seqs * width].reshape(n_seqs, width)
        for i, t in enumerate(batch.block_tables):
            tables[i, : len(t)] = t
        if swa:  # released blocks (-1) are never read: attention starts at the window
            at = 3 * n + n_seqs * width
            swa_tables = host[at: at + n_seqs * width].reshape(n_seqs, width)
            for i, t in enumerate(batch.swa_block_tables):
                swa_tables[i, : len(t)] = np.maximum(t, 0)
            swa_slots = host[at + n_seqs * width:]
            swa_slots[:m] = batch.swa_slot_mapping
            swa_slots[m:] = -1
        return host

    @classmethod
    def on_device(cls, dev: torch.Tensor, n: int, n_seqs: int, width: int, swa: bool,
                  rows: torch.Tensor, p: AttentionPlan) -> StepInputs:
        """Views of a packed array on the device (pack's layout)."""
        t = dev[3 * n: 3 * n + n_seqs * width].view(n_seqs, width)
        swa_t, swa_s = t, dev[2 * n: 3 * n]
        if swa:
            at = 3 * n + n_seqs * width
            swa_t = dev[at: at + n_seqs * width].view(n_seqs, width)
            swa_s = dev[at + n_seqs * width:]
        return cls(dev[:n], dev[n: 2 * n], dev[2 * n: 3 * n], t, swa_s, swa_t, rows, p)

    @classmethod
    def build(cls, batch: ScheduledBatch, device: torch.device, group_p: int, n_kv: int,
              split_target: int) -> StepInputs:
        n, n_seqs = batch.num_tokens, batch.num_seqs
        width = max(1, max(len(t) for t in batch.block_tables))
        swa = bool(batch.swa_block_tables)
        dev = torch.from_numpy(cls.pack(batch, n, n_seqs, width, swa)).to(device)
        rows = torch.tensor(batch.logits_indices, dtype=torch.int64).to(device)
        p = plan(np.asarray(batch.seq_starts, np.int64), group_p, device, width, n_kv,
                 split_target)
        return cls.on_device(dev, n, n_seqs, width, swa, rows, p)


@dataclass(slots=True)
class Pools:
    k: list[torch.Tensor]  # per layer (num_blocks, block_size, n_kv, head_dim) f16 views
    v: list[torch.Tensor]
    is_local: list[bool]  # gemma3: the layer attends within the sliding window
    freqs: torch.Tensor  # rope frequencies (the global layers' base)
    freqs_local: torch.Tensor  # the sliding-window layers' base
    storage: list[torch.Tensor]  # the pools' own tensors (global, local), for their size

    @classmethod
    def allocate(cls, c: ModelConfig, num_blocks: int, num_swa_blocks: int, block_size: int,
                 device: torch.device) -> Pools:
        from .elementwise import inv_freq

        local = [bool(s) and c.sliding_window > 0 for s in c.swa_layers] or [False] * c.n_layers
        counts = (local.count(False), local.count(True))
        shape = (block_size, c.n_kv_heads, c.head_dim)
        storage = [torch.zeros((2, n, nb, *shape) if n else (2, 0, 0, *shape),
                               dtype=torch.float16, device=device)
                   for n, nb in ((counts[0], num_blocks), (counts[1], num_swa_blocks))]
        k, v, seen = [], [], [0, 0]
        for is_local in local:
            pool = storage[is_local]
            k.append(pool[0, seen[is_local]])
            v.append(pool[1, seen[is_local]])
            seen[is_local] += 1
        put = lambda base: torch.from_numpy(inv_freq(c.rope_dim, base)).to(device)  # noqa: E731
        return cls(k, v, local, put(c.rope_base), put(c.rope_base_swa), storage)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.storage)


class Scratch:
    """Activations for up to `capacity` tokens, reused by every step (views [:n]).
    keep_retired: buffers replaced by bigger ones stay allocated (CUDA graphs captured with
    the old ones still write there)."""

    def __init__(self, c: ModelConfig, capacity: int, device: torch.device,
                 keep_retired: bool = False) -> None:
        self.c, self.device, self.capacity = c, device, 0
        self.retired: list[torch.Tensor] | None = [] if keep_retired else None
        self.bufs: list[torch.Tensor] = []
        self.split = (torch.empty(0, device=device), torch.empty(0, device=device))
        self.ensure(capacity)

    def ensure(self, n: int) -> None:
        if n <= self.capacity:
            return
        c, f32 = self.c, torch.float32
        qkv = (c.n_heads + 2 * c.n_kv_heads) * c.head_dim
        widths = (c.n_embd, c.n_embd, qkv, c.n_heads * c.head_dim, 2 * c.n_ff, c.n_ff)
        self._retire(*self.bufs)
        self.bufs = [torch.empty(n, w, dtype=f32, device=self.device) for w in widths]
        self.capacity = n
        self.logit_buf = torch.empty(0, c.n_vocab, dtype=f32, device=self.device)

    def _retire(self, *bufs: torch.Tensor) -> None:
        if self.retired is not None:
            self.retired.extend(bufs)

    def views(self, n: int) -> list[torch.Tensor]:
        """x, xn, qkv, att, gu, hid: (n, width) each."""
        self.ensure(n)
        return [b[:n] for b in self.bufs]

    def split_for(self, p: AttentionPlan, n: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A split decode's partial results (attention.py), grown on demand; None unsplit."""
        if p.n_splits == 1:
            return None
        c = self.c
        need = p.n_splits * n * c.n_heads
        if self.split[1].numel() < 2 * need:
            self._retire(*self.split)
            self.split = (torch.empty(need * c.head_dim, device=self.device),
                          torch.empty(2 * need, device=self.device))
        return self.split

    def logits(self, n: int) -> torch.Tensor:
        """(n, n_vocab): grown on demand, as a step rarely returns more rows than sequences."""
        if n > self.logit_buf.shape[0]:
            self._retire(self.logit_buf)
            self.logit_buf = torch.empty(n, self.c.n_vocab, dtype=torch.float32,
                                         device=self.device)
        return self.logit_buf[:n]
