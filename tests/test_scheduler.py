"""Scheduler: batch layout, chunked prefill, limits, decode-first order, preemption, prefix reuse."""

from __future__ import annotations

from localinfer.engine.block_manager import BlockManager
from localinfer.engine.config import EngineConfig
from localinfer.engine.scheduler import Scheduler
from localinfer.engine.sequence import Sequence, SequenceStatus
from localinfer.sampling_params import SamplingParams


def make(num_blocks=64, block_size=4, **kw) -> Scheduler:
    config = EngineConfig(block_size=block_size, num_blocks=num_blocks, **kw)
    return Scheduler(config, BlockManager(num_blocks, block_size), eog_token_ids={0})


def seq(seq_id: int, n: int, first: int = 1, **params) -> Sequence:
    tokens = [first + i % 50 for i in range(n)]
    return Sequence(seq_id, f"r{seq_id}", tokens, SamplingParams(**params))


def run_step(s: Scheduler, token: int = 7):
    batch = s.schedule()
    assert batch is not None
    sampled = {}
    for i, sid in enumerate(batch.seq_ids):
        if batch.context_lens[i] == s.seqs[sid].num_tokens:
            sampled[sid] = [token]
    s.postprocess(batch, sampled)
    return batch


def test_batch_layout_and_slot_mapping():
    s = make(block_size=4)
    s.add(seq(0, 6))
    s.add(seq(1, 3))
    b = s.schedule()
    assert b.seq_ids == [0, 1] and b.seq_starts == [0, 6, 9]
    assert b.positions == [0, 1, 2, 3, 4, 5, 0, 1, 2]
    assert b.context_lens == [6, 3] and b.logits_indices == [5, 8]
    t0, t1 = b.block_tables
    assert len(t0) == 2 and len(t1) == 1
    assert b.slot_mapping[:6] == [t0[p // 4] * 4 + p % 4 for p in range(6)]
    assert b.slot_mapping[6:] == [t1[0] * 4 + p for p in range(3)]


def test_chunked_prefill_under_token_budget():
    s = make(max_num_batched_tokens=8)
    s.add(seq(0, 20))
    sizes = []
    while True:
        b = run_step(s)
        sizes.append(b.num_tokens)
        if b.logits_indices:
            break
        assert b.num_tokens <= 8
    assert sizes == [8, 8, 4]
    assert s.seqs[0].num_output_tokens == 1


def test_decodes_first_and_long_prompt_does_not_starve_them():
    s = make(max_num_batched_tokens=8)
    s.add(seq(0, 3))
    run_step(s)  # seq 0 prefilled and sampled its first token
    s.add(seq(1, 40))
    for _ in range(4):
        b = run_step(s)
        assert b.seq_ids[0] == 0 and b.seq_starts[1] == 1  # the decode goes first, 1 token
        assert b.num_tokens == 8  # prefill chunk fills the rest of the budget
    assert s.seqs[0].num_output_tokens == 5


def test_max_num_seqs():
    s = make(max_num_seqs=3)
    for i in range(5):
        s.add(seq(i, 4))
    b = s.schedule()
    assert b.seq_ids == [0, 1, 2] and len(s.waiting) == 2


def test_preempts_newest_when_out_of_blocks():
    s = make(num_blocks=4, block_size=4)
    s.add(seq(0, 4, max_tokens=30))
    s.add(seq(1, 4, first=20, max_tokens=30))
    run_step(s)  # both prefilled, two blocks each needed soon
    assert s.block_manager.num_used_blocks == 2
    for _ in range(5):
        run_step(s)
    assert s.num_preemptions >= 1
    newest = s.seqs[1]
    assert newest.status is SequenceStatus.WAITING and newest.block_table == []
    assert newest.num_output_tokens > 0  # kept: they are recomputed on readmission
    bm = s.block_manager
    assert bm.num_used_blocks + bm.num_free_blocks == bm.num_blocks


def test_finish_by_eos_max_tokens_and_context_limit():
    s = make(max_model_len=10)
    s.add(seq(0, 4, max_tokens=2))
    s.add(seq(1, 8, max_tokens=50))
    run_step(s, token=5)
    run_step(s, token=5)
    assert 0 not in s.seqs and 1 not in s.seqs  # 4+2 tokens: length; 8+2 = 10: length
    s.add(seq(2, 4))
    run_step(s, token=0)
    assert 2 not in s.seqs and s.block_manager.num_used_blocks == 0


def test_abort_frees_blocks_at_once():
    s = make()
    s.add(seq(0, 10))
    s.add(seq(1, 10))
    run_step(s)
    s.abort(0)
    assert s.block_manager.num_used_blocks == 3 and 0 not in s.seqs
    s.abort(1)
    assert s.block_manager.num_used_blocks == 0 and not s.has_unfinished()


def test_shared_system_prompt_reuses_blocks():
    s = make(num_blocks=64, block_size=16)
    system = [3 + i % 40 for i in range(64)]
    s.add(Sequence(0, "a", system + [1, 2, 3], SamplingParams()))
    run_step(s)
    used_after_first = s.block_manager.num_used_blocks
    s.add(Sequence(1, "b", system + [4, 5, 6], SamplingParams()))
    b = run_step(s)
    second = s.seqs[1]
    assert second.num_cached_tokens == 64
    assert s.block_manager.num_used_blocks - used_after_first == 1  # only the tail block is new
    i = b.seq_ids.index(1)
    assert b.seq_starts[i + 1] - b.seq_starts[i] == 3  # only the new tokens are prefilled
    assert s.block_manager.prefix_hit_tokens == 64
