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
from localinfer.errors import InvalidRequestError
from localinfer.model_config import ModelConfig

from .attention import AttentionPlan, query_blocks, split_buffers


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each input of a step sits in its packed int32 array."""

    n: int  # tokens
    n_seqs: int
    width: int  # block-table entries per sequence
    swa: bool  # gemma3's sliding-window tables and slots are there too
    n_rows: int  # logits rows
    n_qb: int  # attention query blocks

    def spans(self) -> dict[str, tuple[int, int]]:
        n, table = self.n, self.n_seqs * self.width
        sizes = (("tokens", n), ("positions", n), ("slots", n), ("tables", table),
                 ("swa_tables", table if self.swa else 0), ("swa_slots", n if self.swa else 0),
                 ("rows", self.n_rows), ("qb", 3 * self.n_qb))
        out, at = {}, 0
        for name, size in sizes:
            out[name] = (at, at + size)
            at += size
        return out

    @property
    def size(self) -> int:
        return self.spans()["qb"][1]

    def parts(self, packed):  # np.ndarray | torch.Tensor -> {name: 1-D view}
        return {k: packed[a:b] for k, (a, b) in self.spans().items()}

    @classmethod
    def of(cls, batch: ScheduledBatch, n_heads: int, n_kv: int, split_target: int
           ) -> tuple[Layout, np.ndarray, int, int]:
        """A batch's layout, with its attention query blocks, BLOCK_Q and split count."""
        width = max(1, max(len(t) for t in batch.block_tables))
        qb, block_q, n_splits = query_blocks(np.asarray(batch.seq_starts, np.int64), n_heads,
                                             n_kv, width, split_target)
        lay = cls(batch.num_tokens, batch.num_seqs, width, bool(batch.swa_block_tables),
                  len(batch.logits_indices), qb.shape[1])
        return lay, qb, block_q, n_splits


@dataclass(slots=True)
class StepInputs:
    tokens: torch.Tensor  # (n_tokens,) int32
    positions: torch.Tensor  # (n_tokens,) int32
    slots: torch.Tensor  # (n_tokens,) int32: block * block_size + offset
    tables: torch.Tensor  # (n_seqs, width) int32
    swa_slots: torch.Tensor  # gemma3's sliding-window pool (the main ones without it)
    swa_tables: torch.Tensor
    rows: torch.Tensor  # (n_logits,) int32 token rows whose logits the step returns
    plan: AttentionPlan

    @staticmethod
    def pack(batch: ScheduledBatch, lay: Layout, qb: np.ndarray) -> np.ndarray:
        """The batch and its query blocks `qb` as one int32 array, padded to the layout's
        sizes: padding tokens are token 0 at position 0 with slot -1 (their K/V are not
        stored), padding logits rows are their own index."""
        host = np.zeros(lay.size, np.int32)
        part = lay.parts(host)
        m = batch.num_tokens
        part["tokens"][:m] = batch.token_ids
        part["positions"][:m] = batch.positions
        part["slots"][:m] = batch.slot_mapping
        part["slots"][m:] = -1
        tables = part["tables"].reshape(lay.n_seqs, lay.width)
        for i, t in enumerate(batch.block_tables):
            tables[i, : len(t)] = t
        if lay.swa:  # released blocks (-1) are never read: attention starts at the window
            swa_tables = part["swa_tables"].reshape(lay.n_seqs, lay.width)
            for i, t in enumerate(batch.swa_block_tables):
                swa_tables[i, : len(t)] = np.maximum(t, 0)
            part["swa_slots"][:m] = batch.swa_slot_mapping
            part["swa_slots"][m:] = -1
        k = len(batch.logits_indices)
        part["rows"][:k] = batch.logits_indices
        part["rows"][k:] = np.arange(k, lay.n_rows)
        part["qb"][:] = qb.reshape(-1)
        return host

    @classmethod
    def on_device(cls, dev: torch.Tensor, lay: Layout, block_q: int,
                  n_splits: int) -> StepInputs:
        """Views of a packed array on the device (pack's layout)."""
        part = lay.parts(dev)
        tables = part["tables"].view(lay.n_seqs, lay.width)
        swa_tables, swa_slots = tables, part["slots"]
        if lay.swa:
            swa_tables, swa_slots = part["swa_tables"].view(lay.n_seqs, lay.width), \
                part["swa_slots"]
        qb = part["qb"].view(3, lay.n_qb)
        return cls(part["tokens"], part["positions"], part["slots"], tables, swa_slots,
                   swa_tables, part["rows"], AttentionPlan(qb[0], qb[1], qb[2], block_q,
                                                           n_splits))

    @staticmethod
    def check(host: np.ndarray, lay: Layout, m: int, n_vocab: int, block_size: int,
              num_blocks: int, num_swa_blocks: int) -> None:
        """Refuse a packed batch (m real tokens) with a token id outside the vocabulary or a
        slot or block outside its pool: a kernel would read or write memory that is not the
        pool's.  Vectorized over the packed array: a step pays microseconds for it."""
        part = lay.parts(host)
        tokens = part["tokens"][:m]
        if tokens.min() < 0 or tokens.max() >= n_vocab:
            raise InvalidRequestError("token id out of range")
        pools = [("slots", "tables", num_blocks, "pool")]
        if lay.swa:
            pools.append(("swa_slots", "swa_tables", num_swa_blocks, "sliding-window pool"))
        for slots, tables, blocks, what in pools:
            s, t = part[slots][:m], part[tables]
            if s.min() < 0 or s.max() >= blocks * block_size or t.min() < 0 or t.max() >= blocks:
                raise InvalidRequestError(f"triton backend: KV slot or block outside the {what}")


@dataclass(slots=True)
class Pools:
    k: list[torch.Tensor]  # per layer (num_blocks, block_size, n_kv, head_dim) f16 views
    v: list[torch.Tensor]
    is_local: list[bool]  # gemma3: the layer attends within the sliding window
    freqs: torch.Tensor  # rope frequencies (the global layers' base)
    freqs_local: torch.Tensor  # the sliding-window layers' base
    storage: list[torch.Tensor]  # the pools' own tensors (global, local)

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


class Scratch:
    """Activations for up to `capacity` tokens, reused by every step (views [:n]).
    keep_retired: buffers replaced by bigger ones stay allocated (CUDA graphs captured with
    the old ones still write there)."""

    def __init__(self, c: ModelConfig, capacity: int, device: torch.device,
                 keep_retired: bool = False) -> None:
        self.c, self.device, self.capacity = c, device, 0
        self.retired: list[torch.Tensor] | None = [] if keep_retired else None
        self.bufs: list[torch.Tensor] = []
        self.split: tuple[torch.Tensor, torch.Tensor] | None = None
        self.logit_buf = torch.empty(0, c.n_vocab, dtype=torch.float32, device=device)
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
        bufs = split_buffers(p, n, self.c.n_heads, self.c.head_dim, self.device, self.split)
        if bufs is not self.split and self.split is not None:
            self._retire(*self.split)
        self.split = bufs
        return bufs

    def logits(self, n: int) -> torch.Tensor:
        """(n, n_vocab): grown on demand, as a step rarely returns more rows than sequences."""
        if n > self.logit_buf.shape[0]:
            self._retire(self.logit_buf)
            self.logit_buf = torch.empty(n, self.c.n_vocab, dtype=torch.float32,
                                         device=self.device)
        return self.logit_buf[:n]
