"""BlockManager: allocation, prefix caching, and a hypothesis state machine over its life."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from localinfer.engine.block_manager import BlockManager
from localinfer.engine.sequence import Sequence
from localinfer.sampling_params import SamplingParams

BS = 4


def make_seq(seq_id: int, tokens: list[int], prompt_logits: bool = False) -> Sequence:
    return Sequence(seq_id, f"r{seq_id}", list(tokens), SamplingParams(), prompt_logits=prompt_logits)


def compute_all(bm: BlockManager, seq: Sequence) -> None:
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_computed_blocks(seq)


def test_allocate_free_counts():
    bm = BlockManager(8, BS)
    seq = make_seq(0, list(range(10)))
    assert bm.can_allocate(seq)
    bm.allocate(seq)
    assert len(seq.block_table) == 3 and bm.num_used_blocks == 3 and bm.num_free_blocks == 5
    bm.free(seq)
    assert bm.num_used_blocks == 0 and seq.block_table == []


def test_double_free_raises():
    bm = BlockManager(4, BS)
    seq = make_seq(0, [1, 2, 3])
    bm.allocate(seq)
    table = list(seq.block_table)
    bm.free(seq)
    seq.block_table = table
    with pytest.raises(RuntimeError, match="double free"):
        bm.free(seq)


def test_prefix_reuse_skips_full_computed_blocks_but_never_the_last_token():
    bm = BlockManager(16, BS)
    a = make_seq(0, list(range(12)))  # 3 full blocks
    bm.allocate(a)
    compute_all(bm, a)
    b = make_seq(1, list(range(12)))  # same prompt: the block of the last token is recomputed
    bm.allocate(b)
    assert b.num_cached_tokens == 8 and b.num_computed_tokens == 8
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert bm.blocks[a.block_table[0]].ref_count == 2
    c = make_seq(2, list(range(6)) + [99, 98, 97])  # shares only the first block
    bm.allocate(c)
    assert c.num_cached_tokens == 4
    assert bm.prefix_hit_tokens == 12 and bm.prefix_queried_tokens == 12 + 12 + 9


def test_uncomputed_blocks_are_not_shared():
    bm = BlockManager(16, BS)
    a = make_seq(0, list(range(12)))
    bm.allocate(a)
    b = make_seq(1, list(range(12)))
    bm.allocate(b)  # a has computed nothing yet
    assert b.num_cached_tokens == 0


def test_freed_blocks_stay_cached_until_evicted():
    bm = BlockManager(4, BS)
    a = make_seq(0, list(range(9)))
    bm.allocate(a)
    compute_all(bm, a)
    bm.free(a)
    b = make_seq(1, list(range(9)))
    assert bm.can_allocate(b)
    bm.allocate(b)
    assert b.num_cached_tokens == 8 and bm.num_used_blocks == 3
    bm.free(b)
    other = make_seq(2, [50 + i for i in range(16)])  # needs every block: evicts the cache
    bm.allocate(other)
    bm.free(other)
    c = make_seq(3, list(range(9)))
    bm.allocate(c)
    assert c.num_cached_tokens == 0


def test_generated_text_is_shared_once_its_block_is_full():
    bm = BlockManager(16, BS)
    a = make_seq(0, [1, 2, 3])
    bm.allocate(a)
    for t in [4, 5, 6, 7, 8]:
        a.num_computed_tokens = a.num_tokens
        a.append_token(t)
        bm.may_append(a)
        bm.cache_computed_blocks(a)
    b = make_seq(1, [1, 2, 3, 4, 5, 6, 7, 8, 9])  # previous turn + new text
    bm.allocate(b)
    assert b.num_cached_tokens == 4


def test_prompt_logits_requests_skip_the_prefix_cache():
    bm = BlockManager(16, BS)
    a = make_seq(0, list(range(12)))
    bm.allocate(a)
    compute_all(bm, a)
    b = make_seq(1, list(range(12)), prompt_logits=True)
    bm.allocate(b)
    assert b.num_cached_tokens == 0


class BlockManagerMachine(RuleBasedStateMachine):
    """allocate / append / compute / free / abort / preempt / prefix-share over a small pool."""

    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(12, BS)
        self.running: list[Sequence] = []
        self.waiting: list[Sequence] = []
        self.next_id = 0

    @rule(prefix=st.sampled_from([[], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8]]),
          tail=st.lists(st.integers(0, 3), min_size=1, max_size=9))
    def add(self, prefix, tail):
        self.waiting.append(make_seq(self.next_id, prefix + tail))
        self.next_id += 1

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def allocate(self, data):
        seq = data.draw(st.sampled_from(self.waiting))
        if self.bm.can_allocate(seq):
            self.bm.allocate(seq)
            assert seq.num_computed_tokens < seq.num_tokens
            self.waiting.remove(seq)
            self.running.append(seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), token=st.integers(0, 3))
    def compute_and_append(self, data, token):
        seq = data.draw(st.sampled_from(self.running))
        seq.num_computed_tokens = seq.num_tokens
        self.bm.cache_computed_blocks(seq)
        seq.append_token(token)
        if self.bm.can_append(seq):
            self.bm.may_append(seq)
        else:  # out of blocks: preempt it (recompute later)
            self.preempt_seq(seq)

    def preempt_seq(self, seq: Sequence) -> None:
        self.bm.free(seq)
        self.running.remove(seq)
        self.waiting.insert(0, seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), guesses=st.lists(st.integers(0, 3), min_size=1, max_size=7),
          accepted=st.integers(0, 7), token=st.integers(0, 3))
    def speculate_and_roll_back(self, data, guesses, accepted, token):
        """A decode that computes its last token and k guesses, keeps the first `accepted`
        and the target's token, and rolls the rest back (scheduler.postprocess)."""
        seq = data.draw(st.sampled_from(self.running))
        k = min(len(guesses), self.bm.lookahead_room(seq))
        if seq.num_uncomputed_tokens != 1 or k == 0:
            return
        free_before, table_before = self.bm.num_free_blocks, len(seq.block_table)
        self.bm.may_append(seq, k)
        assert len(seq.block_table) * BS >= seq.num_tokens + k
        written = seq.num_tokens + k
        accepted = min(accepted, k)
        for t in guesses[:accepted]:
            seq.append_token(t)
        seq.append_token(token)
        computed = seq.num_tokens - 1
        self.bm.truncate(seq, computed)
        assert len(seq.block_table) == -(-computed // BS)
        if accepted == k:
            assert written == computed
        # the step kept just the blocks its accepted tokens need: those taken for rejected
        # guesses only are back in the pool
        assert self.bm.num_free_blocks == free_before - (len(seq.block_table) - table_before)
        seq.num_computed_tokens = computed
        self.bm.cache_computed_blocks(seq)
        if self.bm.can_append(seq):
            self.bm.may_append(seq)
        else:
            self.preempt_seq(seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def preempt(self, data):
        self.preempt_seq(data.draw(st.sampled_from(self.running)))

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(self.running))
        self.bm.free(seq)
        self.running.remove(seq)

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def abort_waiting(self, data):
        seq = data.draw(st.sampled_from(self.waiting))
        self.waiting.remove(seq)
        assert seq.block_table == []

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def double_free_is_refused(self, data):
        seq = data.draw(st.sampled_from(self.running))
        stale = list(seq.block_table)
        shared = any(self.bm.blocks[b].ref_count > 1 for b in stale)
        self.bm.free(seq)
        self.running.remove(seq)
        if not shared:
            seq.block_table = stale
            with pytest.raises(RuntimeError, match="double free"):
                self.bm.free(seq)
            seq.block_table = []

    @invariant()
    def counts(self):
        bm = self.bm
        assert bm.num_used_blocks + bm.num_free_blocks == bm.num_blocks
        refs = [0] * bm.num_blocks
        for seq in self.running:
            for b in seq.block_table:
                refs[b] += 1
        for block in bm.blocks:
            assert block.ref_count >= 0
            assert block.ref_count == refs[block.block_id]
            assert (block.ref_count == 0) == (block.block_id in bm.free_blocks)
        for h, b in bm.cached_blocks.items():
            assert bm.blocks[b].hash == h

    @invariant()
    def cached_blocks_hold_accepted_tokens(self):
        """A block in the prefix cache holds exactly the (accepted) tokens of its place in
        every running sequence that uses it: a rolled-back guess never reaches the cache."""
        for seq in self.running:
            for i, b in enumerate(seq.block_table):
                block = self.bm.blocks[b]
                if block.hash is not None:
                    assert block.token_ids == tuple(seq.token_ids[i * BS:(i + 1) * BS])
                    assert (i + 1) * BS <= seq.num_computed_tokens or i < seq.num_registered_blocks

    @invariant()
    def tables_cover_tokens(self):
        for seq in self.running:
            assert len(seq.block_table) * BS >= seq.num_tokens
            assert len(set(seq.block_table)) == len(seq.block_table)


BlockManagerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                                 deadline=None)
TestBlockManagerMachine = BlockManagerMachine.TestCase
