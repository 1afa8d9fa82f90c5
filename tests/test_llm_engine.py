"""LLMEngine with a fake paged-KV runner: batch invariance, preemption, prefix reuse,
stop strings, aborts, prompt logits and request validation."""

from __future__ import annotations

import numpy as np
import pytest
from engine_fakes import N_VOCAB, make_engine

from localinfer.engine.llm_engine import LLMEngine
from localinfer.engine.text_stream import TextStream
from localinfer.errors import ContextLengthExceededError, InvalidRequestError
from localinfer.sampling_params import SamplingParams


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


def test_logprobs_per_token():
    engine = make_engine()
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=3)
    engine.add_request([5, 6, 7], params)
    seen = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.token_ids:
                assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids)
                lp = out.logprobs[0]
                assert lp.token_id == out.token_ids[0]
                assert len(lp.top) == 3 and lp.top[0][0] == lp.token_id  # greedy = most likely
                assert lp.top[0][1] >= lp.top[1][1] >= lp.top[2][1]
                assert lp.logprob <= 0.0
                seen.append(lp)
    assert len(seen) == 4
    with pytest.raises(InvalidRequestError, match="logprobs"):
        SamplingParams(logprobs=21)
