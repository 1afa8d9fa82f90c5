"""SlidingWindowPool: KV block ids of sliding-window attention layers (gemma3's local layers).

A sliding-window layer's query at position p reads keys p - window + 1 .. p only, so once a
sequence has computed c tokens (every later query is at c or beyond) its blocks wholly before
c - window + 1 are never read again: they go back to the pool at once.  Global layers keep
their full table in the BlockManager; this pool keeps a second table per sequence over the
same logical blocks, with -1 where a block was released, so a sequence holds about
window / block_size + its current chunk's blocks however long it grows.

Prefix caching: a prefix hit of k blocks would need the sliding layers' K/V of the window
before k * block_size, which this pool does not keep for finished sequences; a model with a
sliding pool therefore recomputes its prompt (limit_hits caps hits at 0) while the global
layers' blocks are still registered (TODO: cache the window's blocks by the same hashes).

Capacity: a sequence's sliding blocks are a subset of the logical blocks its full table holds
and nothing is shared, so a pool as large as the BlockManager's never runs out first.
"""

from __future__ import annotations

from collections import deque

from localinfer.engine.config import cdiv
from localinfer.engine.sequence import Sequence

RELEASED = -1


class SlidingWindowPool:
    def __init__(self, num_blocks: int, block_size: int, window: int) -> None:
        if window < 1:
            raise ValueError(f"sliding window must be >= 1, got {window}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.window = window
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.tables: dict[int, list[int]] = {}  # seq_id -> logical block -> id or RELEASED
        self.peak_used = 0

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    def limit_hits(self, seq: Sequence, hits: int) -> int:
        """Prefix-cache blocks a sequence may reuse (see module docstring)."""
        return 0

    def table(self, seq: Sequence) -> list[int]:
        return self.tables.setdefault(seq.seq_id, [])

    def ensure(self, seq: Sequence, end: int) -> list[int]:
        """Blocks for the sequence's tokens < end (this step's chunk); returns its table."""
        table = self.table(seq)
        first_live = self._first_live(seq.num_computed_tokens)
        while len(table) < cdiv(end, self.block_size):
            if len(table) < first_live:  # e.g. a prefix hit: never read, never written
                table.append(RELEASED)
                continue
            if not self.free_blocks:
                raise RuntimeError("out of sliding-window KV blocks (pool smaller than the "
                                   "engine's)")
            table.append(self.free_blocks.popleft())
        self.peak_used = max(self.peak_used, self.num_used_blocks)
        return table

    def _first_live(self, computed: int) -> int:
        """First logical block a query at position >= computed can still read."""
        return max(0, computed - self.window + 1) // self.block_size

    def release_out_of_window(self, seq: Sequence) -> None:
        """After a step: give back the blocks no later query of the sequence can read."""
        table = self.tables.get(seq.seq_id)
        if not table:
            return
        for i in range(min(self._first_live(seq.num_computed_tokens), len(table))):
            if table[i] != RELEASED:
                self.free_blocks.append(table[i])
                table[i] = RELEASED

    def free(self, seq: Sequence) -> None:
        for block in self.tables.pop(seq.seq_id, []):
            if block != RELEASED:
                self.free_blocks.append(block)

    def slot(self, seq: Sequence, position: int) -> int:
        block = self.tables[seq.seq_id][position // self.block_size]
        assert block != RELEASED, "slot of a released sliding-window block"
        return block * self.block_size + position % self.block_size
