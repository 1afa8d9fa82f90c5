"""KVMap: where each engine KV block lives in llama.cpp's cache, and prefix reuse by copy.

llama.cpp addresses its KV cells by (sequence id, position), not by our block ids, so the
runner keeps this map beside the engine's BlockManager (which stays the authority):

- every engine sequence runs as one llama.cpp sequence id (`live`; ids are recycled);
- every block id that was written has a BlockRecord: its index in the block table (so its
  positions are [index * block_size, (index + 1) * block_size)), the token ids written there
  and the llama.cpp sequence ids whose cells hold its K/V (`holders`);
- a new sequence whose first scheduled position is > 0 had its prefix blocks served by the
  engine's prefix cache: their K/V are copied (llama_memory_seq_cp) from a holder, block by
  block in a unified pool; with one stream per sequence id (max_seq_len set) llama.cpp
  copies only whole streams, so the holder of the longest run of leading prefix blocks is
  copied and the copy trimmed past that run; from the first block not copied on, the
  runner recomputes them from the recorded token ids (prepended to the sequence's tokens
  in the same llama_decode);
- when the engine frees a sequence (finished, aborted, preempted), its cells are removed
  except for blocks the engine keeps in its prefix cache; a block's cells are kept under one
  holder only, and a freed sequence whose id still holds cached blocks is "retired";
- when the engine reuses a block id for new tokens, the old contents' cells are removed
  (the slot mapping writes to a block whose record belongs to a retired holder);
- when every llama.cpp sequence id is taken, the least recently retired holder's cells are
  dropped (counted as `evicted_holders`); later hits on its blocks are recomputed.

So llama.cpp holds cells only for blocks the engine has allocated or cached, at most one
set per block id: n_ctx = num_blocks * block_size cells always suffice in a unified pool.
With streams, a sequence id's cells are its stream's: the engine keeps every sequence within
max_seq_len tokens and the live ones within n_seq_max, and prepare checks both.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol


class KVMemory(Protocol):
    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None: ...
    def seq_rm(self, seq: int, p0: int, p1: int) -> None: ...


@dataclass(slots=True)
class BlockRecord:
    index: int  # the block's place in its block tables
    tokens: list[int] = field(default_factory=list)  # token ids written so far
    holders: set[int] = field(default_factory=set)  # llama.cpp seq ids holding its K/V


@dataclass(slots=True)
class SeqInput:
    """What one engine sequence feeds into this step's llama_decode."""

    llama_seq: int
    first_pos: int  # position of token_ids[0]
    token_ids: list[int]  # recomputed prefix tokens, then the scheduled tokens
    n_prefix: int  # how many of token_ids are recomputed prefix


class KVMap:
    def __init__(self, memory: KVMemory, block_size: int, n_seq_max: int,
                 max_seq_len: int | None = None) -> None:
        self.memory = memory
        self.block_size = block_size
        self.n_seq_max = n_seq_max
        # one stream of max_seq_len cells per sequence id (None: one unified pool)
        self.max_seq_len = max_seq_len
        self.live: dict[int, int] = {}  # engine seq id -> llama.cpp seq id
        self.next_pos: dict[int, int] = {}  # engine seq id -> next position to write
        self.records: dict[int, BlockRecord] = {}  # block id -> record
        self.held: dict[int, set[int]] = {}  # llama.cpp seq id -> block ids whose cells it holds
        self.retired: OrderedDict[int, None] = OrderedDict()  # freed ids still holding blocks
        self.free_ids = list(range(n_seq_max - 1, -1, -1))  # pop() gives 0 first
        self.prefix_tokens_copied = 0
        self.prefix_tokens_recomputed = 0
        self.evicted_holders = 0

    # -- one step ---------------------------------------------------------------------------

    def prepare(self, seq_id: int, table: list[int], first_pos: int, tokens: list[int]) -> SeqInput:
        """Map one scheduled sequence onto llama.cpp before the decode: admit it (copying or
        recomputing its cached prefix), evict stale cells of blocks it is about to write,
        and record the tokens it writes."""
        bs = self.block_size
        prefix: list[int] = []
        if seq_id not in self.live:
            if first_pos % bs:
                raise RuntimeError(f"seq {seq_id} starts at {first_pos}, inside a block")
            me = self._new_llama_seq()
            self.live[seq_id] = me
            prefix = self._admit(me, table[: first_pos // bs])
        elif self.next_pos[seq_id] != first_pos:
            raise RuntimeError(
                f"seq {seq_id} resumes at {first_pos}, expected {self.next_pos[seq_id]}"
            )
        me = self.live[seq_id]
        pos, end = first_pos, first_pos + len(tokens)
        if self.max_seq_len is not None and end > self.max_seq_len:
            raise RuntimeError(f"seq {seq_id} reaches position {end}, past its llama.cpp "
                               f"stream of {self.max_seq_len} cells")
        while pos < end:  # one pass per block written, not per token
            index = pos // bs
            block_id = table[index]
            stop = min(end, (index + 1) * bs)
            rec = self.records.get(block_id)
            if rec is None or me not in rec.holders:
                rec = self._claim(block_id, index, me)
            if len(rec.tokens) != pos % bs:
                raise RuntimeError(f"block {block_id}: write at offset {pos % bs}, "
                                   f"holds {len(rec.tokens)} tokens")
            rec.tokens.extend(tokens[pos - first_pos : stop - first_pos])
            pos = stop
        self.next_pos[seq_id] = end
        if not prefix:
            return SeqInput(me, first_pos, tokens, 0)
        return SeqInput(me, first_pos - len(prefix), prefix + list(tokens), len(prefix))

    def _admit(self, me: int, cached: list[int]) -> list[int]:
        """Copy the cached prefix blocks' cells into `me`; recompute from the first block
        not copied. Returns the token ids to recompute."""
        bs = self.block_size
        for i, block_id in enumerate(cached):
            rec = self.records.get(block_id)
            if rec is None or rec.index != i or len(rec.tokens) != bs:
                raise RuntimeError(f"prefix block {block_id} (#{i}) was never written here")
        n_copied = 0
        if self.max_seq_len is not None and cached:
            n_copied = self._copy_stream(me, cached)
        prefix: list[int] = []
        for i, block_id in enumerate(cached[n_copied:], n_copied):
            rec = self.records[block_id]
            if self.max_seq_len is None and not prefix and rec.holders:
                src = next(iter(rec.holders))
                self.memory.seq_cp(src, me, i * bs, (i + 1) * bs)
                self._hold(me, block_id, rec)
                self.prefix_tokens_copied += bs
                continue
            # no cells left for this block (or an earlier one): recompute it in this decode;
            # retired holders' cells of it are dropped (a live holder keeps its own)
            live_ids = set(self.live.values())
            for h in list(rec.holders - live_ids):
                self._drop(h, block_id, rec)
            self._hold(me, block_id, rec)
            prefix.extend(rec.tokens)
            self.prefix_tokens_recomputed += bs
        return prefix

    def _copy_stream(self, me: int, cached: list[int]) -> int:
        """Streams: copy the whole stream of the holder with the longest run of leading
        prefix blocks into `me` (llama.cpp copies the buffers at the next decode, before
        that decode writes anything), then drop the copied cells past that run. Returns
        the number of blocks copied."""
        best, n_best = -1, 0
        for h in self.records[cached[0]].holders:
            n = 1
            while n < len(cached) and h in self.records[cached[n]].holders:
                n += 1
            if n > n_best:
                best, n_best = h, n
        if not n_best:
            return 0
        self.memory.seq_cp(best, me, -1, -1)
        self.memory.seq_rm(me, n_best * self.block_size, -1)
        for block_id in cached[:n_best]:
            self._hold(me, block_id, self.records[block_id])
        self.prefix_tokens_copied += n_best * self.block_size
        return n_best

    def _claim(self, block_id: int, index: int, me: int) -> BlockRecord:
        """`me` writes a block that holds other contents (or none yet): evict those cells."""
        old = self.records.get(block_id)
        if old is not None:
            live_ids = set(self.live.values())
            for h in list(old.holders):
                if h in live_ids:
                    raise RuntimeError(f"block {block_id} is written by llama seq {me} while "
                                       f"live seq {h} still uses it")
                self._drop(h, block_id, old)
        rec = BlockRecord(index)
        self.records[block_id] = rec
        self._hold(me, block_id, rec)
        return rec

    # -- speculative guesses rejected by the engine ---------------------------------------------

    def rollback(self, seq_id: int, num_tokens: int) -> None:
        """The engine keeps only the sequence's first num_tokens positions (the rest were
        rejected speculative guesses): their cells go, and so do the tokens recorded past
        them; a block left with none of them (the engine freed it) loses its record. Blocks
        past num_tokens were written by this sequence alone in its last step, so no other
        holder has cells there."""
        me = self.live.get(seq_id)
        if me is None:
            return
        bs = self.block_size
        self.memory.seq_rm(me, num_tokens, -1)
        self.next_pos[seq_id] = min(self.next_pos[seq_id], num_tokens)
        held = self.held.get(me, set())
        for block_id in list(held):
            rec = self.records[block_id]
            keep = num_tokens - rec.index * bs
            if keep >= len(rec.tokens):
                continue
            if keep > 0:
                del rec.tokens[keep:]
                continue
            rec.holders.discard(me)
            held.discard(block_id)
            if not rec.holders:
                del self.records[block_id]

    # -- sequences freed by the engine --------------------------------------------------------

    def free(self, seq_id: int, table: list[int], cached: set[int]) -> None:
        """The engine freed this sequence's blocks (`table`); `cached` are the ones it keeps
        in its prefix cache. Cells of the others go (also stale ones of blocks the sequence
        was given but had not written yet); a cached block keeps one holder."""
        me = self.live.pop(seq_id, None)
        self.next_pos.pop(seq_id, None)
        live_ids = set(self.live.values())
        for block_id in table:
            rec = self.records.get(block_id)
            if rec is None:
                continue
            if block_id in cached:
                if me in rec.holders and len(rec.holders) > 1:
                    self._drop(me, block_id, rec)  # another holder keeps the cells
                continue
            for h in list(rec.holders - live_ids):
                self._drop(h, block_id, rec)
            if not rec.holders:
                del self.records[block_id]
        if me is None:
            return
        if self.held.get(me):
            self.retired[me] = None
        else:
            self._release(me)

    def clear(self) -> None:
        """Forget everything (the caller clears llama.cpp's memory)."""
        self.__init__(self.memory, self.block_size, self.n_seq_max,  # type: ignore[misc]
                      self.max_seq_len)

    # -- holders ------------------------------------------------------------------------------

    def _new_llama_seq(self) -> int:
        if not self.free_ids:
            if not self.retired:
                raise RuntimeError(f"more than {self.n_seq_max} live llama.cpp sequences")
            oldest = next(iter(self.retired))
            for block_id in list(self.held[oldest]):  # the last drop releases the id
                self._drop(oldest, block_id, self.records[block_id])
            self.evicted_holders += 1
        return self.free_ids.pop()

    def _hold(self, seq: int, block_id: int, rec: BlockRecord) -> None:
        rec.holders.add(seq)
        self.held.setdefault(seq, set()).add(block_id)

    def _drop(self, seq: int, block_id: int, rec: BlockRecord) -> None:
        """Remove `seq`'s cells of one block; a retired id that holds nothing more is freed."""
        bs = self.block_size
        self.memory.seq_rm(seq, rec.index * bs, (rec.index + 1) * bs)
        rec.holders.discard(seq)
        held = self.held.get(seq)
        if held is not None:
            held.discard(block_id)
            if not held and seq in self.retired:
                del self.retired[seq]
                self._release(seq)

    def _release(self, seq: int) -> None:
        self.held.pop(seq, None)
        self.free_ids.append(seq)

    # -- inspection (tests) ----------------------------------------------------------------------

    def cell_blocks(self) -> dict[int, set[int]]:
        """llama.cpp seq id -> block ids whose cells it holds (live and retired)."""
        return {s: set(b) for s, b in self.held.items() if b}
