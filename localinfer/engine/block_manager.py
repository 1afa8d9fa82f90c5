"""BlockManager: KV block ids, reference counts and automatic prefix caching.

It owns ids only; the runner owns the memory. A full block is identified by a hash chained
with the previous block's hash over its token ids, so equal hashes mean equal prefixes. A
hash is registered only once the block's K/V have been computed, so a request that reuses a
block never reads slots still to be written. Blocks whose ref count drops to 0 keep their
hash and stay reusable until the pool needs them (evicted least recently freed first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from localinfer.engine.config import cdiv
from localinfer.engine.sequence import Sequence


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None  # set while registered in the prefix cache
    token_ids: tuple[int, ...] = ()  # contents of a hashed block, checked on every hit
    parent_hash: int = 0


_ROOT_HASH = 0


def block_hash(parent: int, tokens: tuple[int, ...]) -> int:
    """A full block's prefix-cache key: its tokens chained with its parent block's key
    (_ROOT_HASH for the first block). Python's hash of a tuple of ints is the same in every
    process, so another process (a cluster's request router) computes the same keys."""
    return hash((parent, tokens))


def prefix_hashes(token_ids: list[int], block_size: int, limit: int) -> list[int]:
    """The keys of the first `limit` full blocks of `token_ids`, as the cache registers them."""
    keys: list[int] = []
    parent = _ROOT_HASH
    for i in range(min(len(token_ids) // block_size, limit)):
        parent = block_hash(parent, tuple(token_ids[i * block_size:(i + 1) * block_size]))
        keys.append(parent)
    return keys


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # ref_count == 0 blocks; unhashed ones at the front (taken first), hashed ones behind
        # them in the order they were freed (LRU eviction)
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached_blocks: dict[int, int] = {}  # hash -> block id
        self.prefix_queried_tokens = 0
        self.prefix_hit_tokens = 0
        # called by free() with (seq_id, block_table, ids of those blocks still cached):
        # runners whose KV lives outside the block pool (llama.cpp) drop the rest there
        self.on_free: Callable[[int, list[int], set[int]], None] | None = None
        # called by truncate() with (seq_id, tokens kept, ids of the blocks freed): runners
        # whose KV lives outside the block pool drop the rolled-back positions there
        self.on_truncate: Callable[[int, int, list[int]], None] | None = None
        # (seq, n_hits) -> how many of those prefix hits may be used: a sliding-window pool
        # (sliding_window.py) caps them when it cannot supply the window before the hit
        self.limit_hits: Callable[[Sequence, int], int] | None = None

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    # -- prefix hashing --------------------------------------------------------------------

    def _block_tokens(self, seq: Sequence, i: int) -> tuple[int, ...]:
        return tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])

    def _hash_full_blocks(self, seq: Sequence, n_full: int) -> None:
        """Extend seq.block_hashes to its first n_full full blocks."""
        for i in range(len(seq.block_hashes), n_full):
            parent = seq.block_hashes[i - 1] if i else _ROOT_HASH
            seq.block_hashes.append(block_hash(parent, self._block_tokens(seq, i)))

    def _cache_hits(self, seq: Sequence) -> list[int]:
        """Block ids of the longest cached prefix; never the block of the last token, whose
        logits must be computed, and none for a sequence that needs every prompt position's
        logits (a cached block's positions are never computed)."""
        if not self.enable_prefix_caching or seq.wants_prompt_rows:
            return []
        n_full = (seq.num_tokens - 1) // self.block_size
        self._hash_full_blocks(seq, n_full)
        hits: list[int] = []
        for i in range(n_full):
            block_id = self.cached_blocks.get(seq.block_hashes[i])
            if block_id is None:
                break
            block = self.blocks[block_id]
            parent = seq.block_hashes[i - 1] if i else _ROOT_HASH
            if block.parent_hash != parent or block.token_ids != self._block_tokens(seq, i):
                break  # hash collision: treat as a miss
            hits.append(block_id)
        if self.limit_hits is not None:
            hits = hits[: self.limit_hits(seq, len(hits))]
        return hits

    # -- allocation ------------------------------------------------------------------------

    def can_allocate(self, seq: Sequence) -> bool:
        hits = self._cache_hits(seq)
        revived = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        needed = cdiv(seq.num_tokens, self.block_size) - len(hits) + revived
        return needed <= self.num_free_blocks

    def allocate(self, seq: Sequence) -> None:
        """Give a waiting sequence blocks for all its tokens, reusing cached prefix blocks;
        sets num_cached_tokens and num_computed_tokens to the reused prefix."""
        assert not seq.block_table, f"seq {seq.seq_id} already holds blocks"
        hits = self._cache_hits(seq)
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_blocks[block_id]
            block.ref_count += 1
        seq.block_table = list(hits)
        for _ in range(cdiv(seq.num_tokens, self.block_size) - len(hits)):
            seq.block_table.append(self._take_free_block())
        seq.num_cached_tokens = len(hits) * self.block_size
        seq.num_computed_tokens = seq.num_cached_tokens
        if self.enable_prefix_caching:
            self.prefix_queried_tokens += seq.num_tokens
            self.prefix_hit_tokens += seq.num_cached_tokens

    def _take_free_block(self) -> int:
        if not self.free_blocks:
            raise RuntimeError("out of KV blocks (the scheduler should have checked)")
        block_id, _ = self.free_blocks.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None:  # evict it from the prefix cache
            if self.cached_blocks.get(block.hash) == block_id:
                del self.cached_blocks[block.hash]
            block.hash = None
            block.token_ids = ()
        block.ref_count = 1
        return block_id

    def can_append(self, seq: Sequence, num_lookahead: int = 0) -> bool:
        """Whether the sequence's blocks can grow to hold all its tokens (and num_lookahead
        speculative guesses after them)."""
        needed = cdiv(seq.num_tokens + num_lookahead, self.block_size) - len(seq.block_table)
        return needed <= self.num_free_blocks

    def lookahead_room(self, seq: Sequence) -> int:
        """How many guesses after all its tokens the sequence's blocks and the free ones hold."""
        slots = (len(seq.block_table) + self.num_free_blocks) * self.block_size
        return max(0, slots - seq.num_tokens)

    def may_append(self, seq: Sequence, num_lookahead: int = 0) -> None:
        """Add blocks so the table covers all tokens (one new block at a block boundary),
        and num_lookahead speculative guesses after them."""
        while len(seq.block_table) * self.block_size < seq.num_tokens + num_lookahead:
            seq.block_table.append(self._take_free_block())

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Roll the sequence's K/V back to its first num_tokens positions (its rejected
        speculative guesses leave): the blocks past them go back to the pool. Those were
        taken for this step's guesses, so no other sequence shares them and none is in the
        prefix cache (only blocks whose every token was accepted are hashed)."""
        keep = cdiv(num_tokens, self.block_size)
        freed = seq.block_table[keep:]
        for block_id in reversed(freed):
            block = self.blocks[block_id]
            if block.ref_count != 1 or block.hash is not None:
                raise RuntimeError(f"rollback of KV block {block_id} that is shared or cached")
            block.ref_count = 0
            self.free_blocks[block_id] = None
            self.free_blocks.move_to_end(block_id, last=False)
        del seq.block_table[keep:]
        if self.on_truncate is not None:
            self.on_truncate(seq.seq_id, num_tokens, freed)

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Register the hashes of blocks that are full and computed (prompt or generated
        text), so later requests — e.g. the next chat turn — can share them."""
        if not self.enable_prefix_caching:
            return
        n_full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        if n_full <= seq.num_registered_blocks:
            return  # nothing new: most decode steps stay inside a block
        self._hash_full_blocks(seq, n_full)
        for i in range(seq.num_registered_blocks, n_full):
            block = self.blocks[seq.block_table[i]]
            h = seq.block_hashes[i]
            if block.hash is not None or h in self.cached_blocks:
                continue  # already registered, or an equal block was registered first
            block.hash = h
            block.token_ids = self._block_tokens(seq, i)
            block.parent_hash = seq.block_hashes[i - 1] if i else _ROOT_HASH
            self.cached_blocks[h] = block.block_id
        seq.num_registered_blocks = n_full

    def free(self, seq: Sequence) -> None:
        """Release the sequence's blocks (tail first, so tails are evicted before the shared
        heads); hashed blocks stay in the prefix cache until reused."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            if block.ref_count <= 0:
                raise RuntimeError(f"double free of KV block {block_id}")
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_blocks[block_id] = None
                if block.hash is None:
                    self.free_blocks.move_to_end(block_id, last=False)
        if self.on_free is not None:
            table = seq.block_table
            self.on_free(seq.seq_id, table, {b for b in table if self.blocks[b].hash is not None})
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_registered_blocks = 0

    def reset_prefix_cache(self) -> None:
        """Forget all cached hashes (e.g. after the runner's KV pool was cleared)."""
        for block in self.blocks:
            block.hash = None
            block.token_ids = ()
        self.cached_blocks.clear()
