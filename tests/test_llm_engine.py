"""LLMEngine with a fake paged-KV runner: batch invariance, preemption, prefix reuse,
stop strings, aborts, prompt logits and request validation."""

from __future__ import annotations

import numpy as np
import pytest

from localinfer.engine.batch import ScheduledBatch
from localinfer.engine.config import EngineConfig
from localinfer.engine.llm_engine import LLMEngine
from localinfer.engine.text_stream import TextStream
from localinfer.errors import ContextLengthExceededError, InvalidRequestError
from localinfer.sampling_params import SamplingParams

N_VOCAB = 64
EOS = 0


class FakeRunner:
    """Logits are a fixed function of the whole context, which it reads back from the KV
    slots the batch names, as a paged KV cache would; reading a slot that was never written
    (or that holds another position) fails the test."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.kv: dict[int, tuple[int, int]] = {}  # slot -> (position, hash of context)
        self.num_steps = 0

    def execute(self, batch: ScheduledBatch) -> np.ndarray:
        self.num_steps += 1
        bs = batch.block_size
        ctx: list[int] = []
        for i in range(batch.num_seqs):
            table = batch.block_tables[i]
            for flat in range(batch.seq_starts[i], batch.seq_starts[i + 1]):
                pos = batch.positions[flat]
                assert batch.slot_mapping[flat] == table[pos // bs] * bs + pos % bs
                prev = 0
                if pos > 0:
                    slot = table[(pos - 1) // bs] * bs + (pos - 1) % bs
                    assert slot in self.kv, f"read of unwritten KV slot {slot}"
                    stored_pos, prev = self.kv[slot]
                    assert stored_pos == pos - 1, "KV slot holds another position"
                h = hash((prev, batch.token_ids[flat], pos)) & 0xFFFFFFFF
                self.kv[batch.slot_mapping[flat]] = (pos, h)
                ctx.append(h)
            assert batch.context_lens[i] == batch.positions[batch.seq_starts[i + 1] - 1] + 1
        rows = [fake_logits(ctx[j]) for j in batch.logits_indices]
        return np.stack(rows) if rows else np.zeros((0, N_VOCAB), np.float32)


def fake_logits(h: int) -> np.ndarray:
    x = np.random.default_rng(h).standard_normal(N_VOCAB).astype(np.float32) * 3
    x[EOS] -= 6.0  # generations rarely end on their own
    return x


class FakeTokenizer:
    n_vocab = N_VOCAB
    eog_ids = frozenset({EOS})


def piece(token_id: int) -> str:
    return "<eos>" if token_id == EOS else chr(ord("a") + token_id % 26)


class FakeDetokenizer:
    def __init__(self, tokenizer: FakeTokenizer) -> None:
        self.text = ""

    def add(self, token_id: int) -> str:
        self.text += piece(token_id)
        return piece(token_id)

    def flush(self) -> str:
        return ""


def make_engine(num_blocks=64, block_size=4, **kw) -> LLMEngine:
    config = EngineConfig(block_size=block_size, num_blocks=num_blocks, **kw)
    return LLMEngine(FakeRunner(num_blocks, block_size), FakeTokenizer(), config, FakeDetokenizer)


def run(engine: LLMEngine, prompts, params) -> dict[int, tuple[list[int], str, str]]:
    ids = [engine.add_request(p, params) for p in prompts]
    toks = {i: [] for i in ids}
    text = {i: "" for i in ids}
    reason = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            toks[out.seq_id] += out.token_ids
            text[out.seq_id] += out.text
            if out.finished:
                reason[out.seq_id] = out.finish_reason
    bm = engine.block_manager
    assert bm.num_used_blocks == 0 and bm.num_free_blocks == bm.num_blocks
    return {i: (toks[i], text[i], reason[i]) for i in ids}


PROMPTS = [[1 + (7 * i + j) % 60 for j in range(3 + 5 * i)] for i in range(8)]
GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


def alone(prompt, params=GREEDY, **kw):
    return next(iter(run(make_engine(**kw), [prompt], params).values()))


def test_batch_invariance_greedy():
    together = run(make_engine(max_num_batched_tokens=16), PROMPTS, GREEDY)
    for seq_id, prompt in enumerate(PROMPTS):
        assert together[seq_id] == alone(prompt)
        assert len(together[seq_id][0]) == 12 and together[seq_id][2] == "length"


def test_preemption_leaves_outputs_unchanged():
    engine = make_engine(num_blocks=14, block_size=4, max_num_batched_tokens=32)
    params = SamplingParams(max_tokens=16, ignore_eos=True)  # 38 + 16 fit 56 slots
    got = run(engine, PROMPTS, params)
    assert engine.stats().num_preemptions > 0
    for seq_id, prompt in enumerate(PROMPTS):
        assert got[seq_id] == alone(prompt, params)


def test_seeded_sampling_is_batch_invariant():
    params = SamplingParams(max_tokens=10, temperature=0.9, top_p=0.9, seed=5, ignore_eos=True)
    together = run(make_engine(num_blocks=16, max_num_batched_tokens=8), PROMPTS, params)
    for seq_id, prompt in enumerate(PROMPTS):
        assert together[seq_id] == alone(prompt, params)


def test_prefix_cache_reuse_and_stats():
    engine = make_engine(num_blocks=64, block_size=16)
    system = [1 + i % 60 for i in range(64)]
    first = run(engine, [system + [5, 6]], GREEDY)
    seq_id = engine.add_request(system + [5, 6], GREEDY)
    out = engine.step()[0]
    assert out.num_cached_tokens == 64
    while engine.has_unfinished_requests():
        out2 = engine.step()
        out.token_ids += out2[0].token_ids if out2 else []
    assert out.token_ids == first[0][0]
    stats = engine.stats()
    assert stats.prefix_cache_hit_tokens == 64 and seq_id == 1
    assert stats.generation_tokens_total == 24 and stats.kv_blocks_used == 0


def test_stop_string_is_held_back_and_cut():
    toks, text, _ = alone(PROMPTS[0])
    stop = text[3:5]
    params = SamplingParams(max_tokens=12, ignore_eos=True, stop=[stop])
    toks2, text2, reason = alone(PROMPTS[0], params)
    assert reason == "stop" and text2 == text[: text.find(stop)]
    params = SamplingParams(max_tokens=12, ignore_eos=True, stop=[stop],
                            include_stop_str_in_output=True)
    assert alone(PROMPTS[0], params)[1] == text[: text.find(stop) + len(stop)]


class ScriptedDetokenizer:
    def __init__(self, pieces):
        self.pieces = pieces

    def add(self, token_id):
        return self.pieces[token_id]

    def flush(self):
        return ""


def test_text_stream_never_emits_a_possible_stop_prefix():
    stream = TextStream(ScriptedDetokenizer(["Hel", "lo ", "wor", "ld", "END"]), ["lo wx", "ld"])
    assert stream.add(0) == "He"  # "l" may start "lo wx"
    assert stream.add(1) == "l"  # "lo " may still start "lo wx"
    assert stream.add(2) == "lo wor"
    assert stream.add(3) == "" and stream.stopped
    stream = TextStream(ScriptedDetokenizer(["ab", "c"]), ["cd"])
    assert stream.add(0) + stream.add(1) + stream.finish() == "abc"


def test_eos_finishes_with_stop_and_is_not_rendered():
    engine = make_engine()
    params = SamplingParams(max_tokens=3, stop_token_ids=[*range(1, N_VOCAB)])
    (toks, text, reason), = run(engine, [PROMPTS[1]], params).values()
    assert reason == "stop" and len(toks) == 1 and text == ""


def test_abort_frees_blocks_and_reports():
    engine = make_engine()
    a = engine.add_request(PROMPTS[5], GREEDY)
    engine.add_request(PROMPTS[6], GREEDY)
    engine.step()
    used = engine.stats().kv_blocks_used
    engine.abort_request(a)
    assert engine.stats().kv_blocks_used < used
    outs = engine.step()
    assert any(o.seq_id == a and o.finished and o.finish_reason == "abort" for o in outs)
    engine.abort_request(a)  # twice: ignored
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.stats().kv_blocks_used == 0


def test_prompt_logits_for_score():
    engine = make_engine(max_num_batched_tokens=8)
    prompt = PROMPTS[4]  # 23 tokens: three chunks
    seq_id = engine.add_request(prompt, SamplingParams(max_tokens=1), prompt_logits=True)
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    (out,) = outs
    assert out.seq_id == seq_id and out.prompt_logits.shape == (len(prompt), N_VOCAB)
    assert out.token_ids == [int(np.argmax(out.prompt_logits[-1]))]


def test_context_limit_and_validation():
    engine = make_engine(max_model_len=12)
    with pytest.raises(ContextLengthExceededError) as e:
        engine.add_request(list(range(1, 14)), GREEDY)
    assert e.value.n_prompt == 13 and e.value.n_ctx == 12
    with pytest.raises(InvalidRequestError):
        engine.add_request([], GREEDY)
    with pytest.raises(InvalidRequestError):
        engine.add_request([1, N_VOCAB], GREEDY)
    (toks, _, reason), = run(engine, [list(range(1, 9))], GREEDY).values()
    assert reason == "length" and len(toks) == 4  # 8 + 4 = max_model_len


def test_prompt_longer_than_kv_pool_is_rejected():
    engine = make_engine(num_blocks=2, block_size=4, max_model_len=100)
    with pytest.raises(ContextLengthExceededError, match="KV cache holds 8"):
        engine.add_request(list(range(1, 10)), GREEDY)
