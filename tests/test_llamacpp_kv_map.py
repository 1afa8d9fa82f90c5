"""KVMap (the llama.cpp backend's block -> llama.cpp sequence bookkeeping) on a fake memory
that tracks cells exactly as llama.cpp's unified cache does (a cell is a position and a set of
seq ids), and on one that copies only whole streams, as its per-sequence streams do."""

from __future__ import annotations

import pytest
from localinfer.backends.llamacpp.kv_map import KVMap

BS = 4


class FakeMemory:
    def __init__(self) -> None:
        self.cells: dict[int, tuple[int, set[int]]] = {}  # cell -> (pos, seqs)
        self._next = 0

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        for pos, seqs in self.cells.values():
            if src in seqs and p0 <= pos < p1:
                seqs.add(dst)

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        p0, p1 = max(p0, 0), p1 if p1 >= 0 else 1 << 30  # llama.cpp: p1 < 0 is "to the end"
        for cell, (pos, seqs) in list(self.cells.items()):
            if seq in seqs and p0 <= pos < p1:
                seqs.discard(seq)
                if not seqs:
                    del self.cells[cell]

    def decode(self, seq: int, first_pos: int, n: int) -> None:
        have = sorted(p for p, s in self.cells.values() if seq in s)
        assert have == list(range(first_pos)), f"seq {seq} holds {have}, decodes from {first_pos}"
        for pos in range(first_pos, first_pos + n):
            self.cells[self._next] = (pos, {seq})
            self._next += 1

    def positions(self, seq: int) -> list[int]:
        return sorted(p for p, s in self.cells.values() if seq in s)


def step(kv: KVMap, mem: FakeMemory, seq_id: int, table: list[int], first: int, n: int) -> int:
    inp = kv.prepare(seq_id, table, first, list(range(100 + first, 100 + first + n)))
    mem.decode(inp.llama_seq, inp.first_pos, len(inp.token_ids))
    return inp.n_prefix


def test_prefix_hit_is_copied_and_tail_freed() -> None:
    mem = FakeMemory()
    kv = KVMap(mem, BS, n_seq_max=8)
    step(kv, mem, 0, [0, 1, 2], 0, 10)  # blocks 0, 1 full, block 2 holds 2 tokens
    kv.free(0, [0, 1, 2], cached={0, 1})
    assert len(mem.cells) == 8  # the partial block's cells are gone, the cached ones stay
    assert step(kv, mem, 1, [0, 1, 5], 8, 3) == 0  # engine: 8 cached tokens
    me = kv.live[1]
    assert mem.positions(me) == list(range(11))
    assert kv.prefix_tokens_copied == 8 and kv.prefix_tokens_recomputed == 0
    kv.free(1, [0, 1, 5], cached={0, 1})
    assert len(mem.cells) == 8 and len(kv.cell_blocks()) == 1  # one holder per cached block


def test_reused_block_evicts_old_cells() -> None:
    mem = FakeMemory()
    kv = KVMap(mem, BS, n_seq_max=8)
    step(kv, mem, 0, [0, 1], 0, 8)
    kv.free(0, [0, 1], cached={0, 1})
    step(kv, mem, 1, [1], 0, 3)  # the engine evicted block 1 and gave it to a new sequence
    assert len(mem.cells) == 4 + 3
    assert kv.cell_blocks() == {kv.live[1]: {1}, 0: {0}}


def test_exhausted_seq_ids_drop_the_oldest_holder_and_recompute() -> None:
    mem = FakeMemory()
    kv = KVMap(mem, BS, n_seq_max=2)
    step(kv, mem, 0, [0, 1], 0, 8)
    kv.free(0, [0, 1], cached={0, 1})  # llama seq 0 retired, holding blocks 0 and 1
    step(kv, mem, 1, [2], 0, 2)  # takes llama seq 1
    # a third sequence needs an id: seq 0's cells go, its cached prefix is recomputed
    assert step(kv, mem, 2, [0, 1, 3], 8, 1) == 8
    assert kv.evicted_holders == 1 and kv.prefix_tokens_recomputed == 8
    assert mem.positions(kv.live[2]) == list(range(9))


def test_preempted_sequence_gets_a_fresh_id_and_no_cells_leak() -> None:
    mem = FakeMemory()
    kv = KVMap(mem, BS, n_seq_max=4)
    step(kv, mem, 0, [0, 1], 0, 6)
    kv.free(0, [0, 1], cached={0})  # preempted: block 0 stays cached
    assert step(kv, mem, 0, [0, 2], 4, 3) == 0  # readmitted with a cache hit on block 0
    kv.free(0, [0, 2], cached=set())
    assert mem.cells == {} and kv.cell_blocks() == {} and not kv.records


def test_resuming_at_the_wrong_position_is_a_bookkeeping_error() -> None:
    kv = KVMap(FakeMemory(), BS, n_seq_max=2)
    kv.prepare(0, [0], 0, [1, 2])
    with pytest.raises(RuntimeError, match="resumes at 3"):
        kv.prepare(0, [0], 3, [4])


class StreamMemory(FakeMemory):
    """llama.cpp's per-sequence streams: a cross-stream copy takes the whole source stream
    (any narrower range is refused, as llama.cpp asserts) and replaces the destination's."""

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        assert p0 < 0 and p1 < 0, "llama.cpp copies only whole streams"
        for cell, (_, seqs) in list(self.cells.items()):
            seqs.discard(dst)
            if not seqs:
                del self.cells[cell]
        for pos, seqs in list(self.cells.values()):
            if src in seqs:
                self.cells[self._next] = (pos, {dst})
                self._next += 1

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        super().seq_rm(seq, max(p0, 0), p1 if p1 >= 0 else 1 << 30)


def test_stream_copy_takes_the_longest_holder_and_trims_it() -> None:
    mem = StreamMemory()
    kv = KVMap(mem, BS, n_seq_max=4, max_seq_len=32)
    step(kv, mem, 0, [0, 1, 2, 3], 0, 14)  # blocks 0-2 full, block 3 half
    step(kv, mem, 1, [0, 5], 4, 4)  # shares block 0 only: its copy of seq 0 is trimmed
    assert mem.positions(kv.live[1]) == list(range(8))
    kv.free(1, [0, 5], cached={0, 5})
    kv.free(0, [0, 1, 2, 3], cached={0, 1, 2})
    # blocks 0-2 are held by seq 0's stream alone (block 5 by seq 1's): the copy of
    # stream 0 is cut at position 12, nothing is recomputed
    assert step(kv, mem, 2, [0, 1, 2, 7], 12, 2) == 0
    me = kv.live[2]
    assert mem.positions(me) == list(range(14))
    assert kv.prefix_tokens_copied == 4 + 12 and kv.prefix_tokens_recomputed == 0
    assert kv.cell_blocks()[me] == {0, 1, 2, 7}


def test_stream_copy_recomputes_past_the_holders_run() -> None:
    mem = StreamMemory()
    kv = KVMap(mem, BS, n_seq_max=4, max_seq_len=32)
    step(kv, mem, 0, [0, 1], 0, 8)
    kv.free(0, [0, 1], cached={0, 1})
    step(kv, mem, 1, [0, 2], 4, 4)  # copies block 0 from seq 0's stream, writes block 2
    kv.free(1, [0, 2], cached={0, 2})
    # block 0 lives in one stream, block 2 in another (seq 0's copy of it was dropped):
    # one whole-stream copy brings block 0, block 2 is recomputed in the same decode
    assert step(kv, mem, 2, [0, 2, 9], 8, 1) == 4
    assert mem.positions(kv.live[2]) == list(range(9))
    assert kv.prefix_tokens_recomputed == 4


def test_a_sequence_past_its_stream_is_refused_not_truncated() -> None:
    kv = KVMap(StreamMemory(), BS, n_seq_max=2, max_seq_len=8)
    kv.prepare(0, [0, 1], 0, list(range(8)))
    with pytest.raises(RuntimeError, match="past its llama.cpp stream of 8 cells"):
        kv.prepare(0, [0, 1, 2], 8, [9])


@pytest.mark.parametrize("streams", [False, True])
def test_rollback_of_rejected_guesses_drops_their_cells(streams: bool) -> None:
    mem = StreamMemory() if streams else FakeMemory()
    kv = KVMap(mem, BS, n_seq_max=4, max_seq_len=64 if streams else None)
    step(kv, mem, 0, [0, 1], 0, 6)  # the prompt: positions 0..5
    step(kv, mem, 0, [0, 1, 2], 6, 5)  # its next token and 4 guesses: 6..10
    me = kv.live[0]
    kv.rollback(0, 8)  # one guess accepted; block 2 (8..11) went back to the engine's pool
    assert mem.positions(me) == list(range(8))
    assert 2 not in kv.records and kv.cell_blocks() == {me: {0, 1}}
    assert len(kv.records[1].tokens) == BS
    step(kv, mem, 0, [0, 1, 3], 8, 3)  # resumes at 8 in a fresh block: 8..10
    kv.rollback(0, 9)  # inside a block: it keeps the accepted position
    assert mem.positions(me) == list(range(9)) and len(kv.records[3].tokens) == 1
    step(kv, mem, 0, [0, 1, 3], 9, 1)
    kv.free(0, [0, 1, 3], cached={0, 1})
    assert mem.positions(me) == list(range(8)) and set(kv.records) == {0, 1}
