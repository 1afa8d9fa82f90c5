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

Capacity: a sequence with c tokens computed that runs a chunk of n holds the logical blocks
from (c - window + 1) // block_size to cdiv(c + n, block_size) - 1, at most
(window + n + 2 * block_size - 3) // block_size of them, whatever c.  `pool_blocks_for` sizes
the pool for max_num_seqs such sequences whose chunks share one step's token budget, capped
by the main pool (which bounds every table anyway); with it the scheduler never runs short.
A smaller pool is allowed down to one sequence's window (`min_pool_blocks`): the scheduler
then shrinks prefill chunks to the free blocks and preempts (recompute) like it does for the
main pool (scheduler.py).
"""

from __future__ import annotations

from collections import deque

from localinfer.engine.config import EngineConfig, cdiv, num_blocks_for
from localinfer.engine.sequence import Sequence

RELEASED = -1


def pool_blocks_for(window: int, block_size: int, max_num_seqs: int,
                    max_num_batched_tokens: int, num_blocks: int) -> int:
    """Sliding-pool blocks that max_num_seqs running sequences never outgrow (see above)."""
    per_seq_fixed = window + 2 * block_size - 3
    need = (max_num_seqs * per_seq_fixed + max_num_batched_tokens) // block_size
    return max(1, min(num_blocks, need))


def size_kv_pools(config: EngineConfig, window: int, global_bytes_per_token: int,
                  sliding_bytes_per_token: int) -> tuple[int, int]:
    """(main pool blocks, sliding pool blocks) for a model whose layers split into global
    ones (global_bytes_per_token of K+V over all of them, indexed by the main pool) and
    sliding-window ones (indexed by the sliding pool); also stores the first in
    config.num_blocks.  kv_cache_mb bounds both pools together: the sliding pool takes
    what pool_blocks_for asks (or as much as the main pool when the budget is tight) and
    the global layers the rest."""
    bs = config.block_size

    def sliding_for(num_blocks: int) -> int:
        return pool_blocks_for(window, bs, config.max_num_seqs, config.max_num_batched_tokens,
                               num_blocks)

    if config.num_blocks is not None or config.kv_cache_mb is None:
        num_blocks = num_blocks_for(config, global_bytes_per_token + sliding_bytes_per_token)
    else:
        budget = int(config.kv_cache_mb * 1024 * 1024)
        g, s = global_bytes_per_token * bs, sliding_bytes_per_token * bs
        full = sliding_for(1 << 62)  # the sliding pool of an unbounded main pool
        if g == 0:  # every layer slides: the main pool holds ids only
            num_blocks = 2 * cdiv(config.max_model_len, bs)  # EngineConfig's default pool
            num_blocks = min(num_blocks, budget // s)
        elif budget >= (g + s) * full:
            num_blocks = (budget - s * full) // g
        else:  # too tight for the full sliding pool: both pools equal, as without one
            num_blocks = num_blocks_for(config, global_bytes_per_token + sliding_bytes_per_token)
        if num_blocks < 1:
            num_blocks = num_blocks_for(config, global_bytes_per_token + sliding_bytes_per_token)
    config.num_blocks = num_blocks
    return num_blocks, sliding_for(num_blocks)


def min_pool_blocks(window: int, block_size: int, num_blocks: int) -> int:
    """Blocks one sequence needs to advance by one token with its whole window held."""
    return min(num_blocks, cdiv(window + block_size - 1, block_size))


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

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def blocks_needed(self, seq: Sequence, end: int) -> int:
        """New blocks ensure(seq, end) would take from the pool."""
        have = max(len(self.tables.get(seq.seq_id, ())),
                   self._first_live(seq.num_computed_tokens))
        return max(0, cdiv(end, self.block_size) - have)

    def max_end(self, seq: Sequence) -> int:
        """The largest chunk end (token count) the free blocks can serve for the sequence."""
        have = max(len(self.tables.get(seq.seq_id, ())),
                   self._first_live(seq.num_computed_tokens))
        return (have + len(self.free_blocks)) * self.block_size

    def ensure(self, seq: Sequence, end: int) -> list[int]:
        """Blocks for the sequence's tokens < end (this step's chunk); returns its table."""
        table = self.table(seq)
        first_live = self._first_live(seq.num_computed_tokens)
        while len(table) < cdiv(end, self.block_size):
            if len(table) < first_live:  # e.g. a prefix hit: never read, never written
                table.append(RELEASED)
                continue
            if not self.free_blocks:
                raise RuntimeError("out of sliding-window KV blocks (the scheduler should "
                                   "have checked)")
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

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Give back the blocks past the sequence's first num_tokens tokens (rejected
        speculative guesses; BlockManager.truncate)."""
        table = self.tables.get(seq.seq_id)
        if not table:
            return
        keep = cdiv(num_tokens, self.block_size)
        for block in table[keep:]:
            if block != RELEASED:
                self.free_blocks.append(block)
        del table[keep:]

    def free(self, seq: Sequence) -> None:
        for block in self.tables.pop(seq.seq_id, []):
            if block != RELEASED:
                self.free_blocks.append(block)

    def slot(self, seq: Sequence, position: int) -> int:
        block = self.tables[seq.seq_id][position // self.block_size]
        assert block != RELEASED, "slot of a released sliding-window block"
        return block * self.block_size + position % self.block_size
