"""Engine-side logit_bias and prompt logprobs with the fake paged-KV model: a bias bans and
forces tokens, composes with penalties and speculative verification; prompt logprobs equal
the teacher-forced logits' log-softmax, across prefill chunks and preemptions."""

from __future__ import annotations

import numpy as np
import pytest
from engine_fakes import N_VOCAB, make_engine
from test_llm_engine import run

from localinfer.engine.sampler import apply_logit_bias, penalized
from localinfer.errors import InvalidRequestError
from localinfer.sampling_params import SamplingParams

PROMPT = [1 + (7 * j) % 60 for j in range(23)]  # 23 tokens: several prefill chunks of 8
SPEC_PROMPT = [3, 5, 9, 13, 5, 9, 13, 5, 9]


def tokens(prompt, params, **kw) -> list[int]:
    return next(iter(run(make_engine(**kw), [prompt], params).values()))[0]


def greedy(max_tokens=6, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kw)


def test_minus_100_bans_the_greedy_choice_and_plus_100_forces_a_token():
    plain = tokens(PROMPT, greedy())
    banned = tokens(PROMPT, greedy(logit_bias={plain[0]: -100}))
    assert banned[0] != plain[0]
    forced = tokens(PROMPT, greedy(logit_bias={7: 100}))
    assert forced == [7] * 6
    # sampling too: +100 leaves the other tokens e^-100 of the mass
    drawn = tokens(PROMPT, SamplingParams(max_tokens=6, temperature=1.0, seed=3,
                                          ignore_eos=True, logit_bias={11: 100}))
    assert drawn == [11] * 6


def test_bias_is_applied_before_penalties():
    # a +100 bias on a token repeated in the context, with a strong repetition penalty:
    # the penalty divides the biased logit (llama.cpp's chain: bias, then penalties)
    row = np.zeros(N_VOCAB, np.float32)
    row[4] = 1.0
    p = SamplingParams(logit_bias={4: 9.0}, repetition_penalty=2.0)
    assert penalized(row, p, [4])[4] == pytest.approx(5.0)
    assert row[4] == 1.0  # the runner's row is untouched


def test_bias_never_readmits_a_masked_token():
    row = np.full(N_VOCAB, -np.inf, np.float32)
    row[2] = 0.0  # what a structured-output mask leaves
    apply_logit_bias(row, {5: 100.0, 2: -3.0})
    assert np.isneginf(row[5]) and row[2] == -3.0 and int(np.argmax(row)) == 2


def test_speculation_verifies_against_the_biased_distribution():
    spec = {"speculative": "ngram", "num_speculative_tokens": 4, "order": 1}
    plain = tokens(SPEC_PROMPT, greedy(40), order=1)
    bias = {plain[1]: -100, plain[3]: 100}
    biased = tokens(SPEC_PROMPT, greedy(40, logit_bias=bias), order=1)
    assert biased != plain
    engine = make_engine(**spec)
    (got,) = run(engine, [SPEC_PROMPT], greedy(40, logit_bias=bias)).values()
    assert got[0] == biased  # exactly plain decoding under the bias
    assert engine.stats().spec_verifications > 0  # and it did speculate


@pytest.mark.parametrize("bias", [{N_VOCAB: 1.0}, {3: 100.5}, {3: float("nan")}, {-1: 0.0},
                                  {"3": 1.0}, {3: True}])
def test_bad_logit_bias_is_refused(bias):
    engine = make_engine()
    with pytest.raises(InvalidRequestError, match="logit_bias"):
        engine.add_request([1, 2, 3], SamplingParams(logit_bias=bias))


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def score(prompt: list[int]) -> np.ndarray:
    engine = make_engine()
    engine.add_request(prompt, SamplingParams(max_tokens=1), prompt_logits=True)
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.prompt_logits is not None:
                return out.prompt_logits
    raise AssertionError("no prompt logits")


def prompt_logprobs(engine, prompt, k=3, max_tokens=4):
    seq_id = engine.add_request(prompt, greedy(max_tokens, prompt_logprobs=k))
    got, generated = None, []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.seq_id == seq_id:
                generated += out.token_ids
                if out.prompt_logprobs is not None:
                    assert got is None, "prompt logprobs are handed out once"
                    assert out.token_ids, "with the first sampled token"
                    got = out.prompt_logprobs
    return got, generated


def test_prompt_logprobs_equal_the_teacher_forced_log_softmax():
    expected = log_softmax(score(PROMPT))
    got, generated = prompt_logprobs(make_engine(max_num_batched_tokens=8), PROMPT)
    assert len(got) == len(PROMPT) - 1  # the first token has no context
    for p, item in enumerate(got):
        assert item.token_id == PROMPT[p + 1]
        assert item.logprob == pytest.approx(expected[p, PROMPT[p + 1]], abs=1e-5)
        top_ids = [t for t, _ in item.top]
        assert top_ids == np.argsort(-expected[p], kind="stable")[:3].tolist()
    assert generated == tokens(PROMPT, greedy(4))  # generation is unchanged


def test_prompt_logprobs_bypass_the_prefix_cache_and_survive_preemption():
    engine = make_engine(max_num_batched_tokens=8)
    first, _ = prompt_logprobs(engine, PROMPT)
    again, _ = prompt_logprobs(engine, PROMPT)  # its blocks are cached now: still scored
    assert [i.logprob for i in again] == [i.logprob for i in first]
    tight = make_engine(num_blocks=14, block_size=4, max_num_batched_tokens=32)
    prompts = [[1 + (7 * i + j) % 60 for j in range(3 + 5 * i)] for i in range(8)]
    ids = [tight.add_request(p, greedy(16, prompt_logprobs=0)) for p in prompts]
    got: dict[int, list] = {}
    while tight.has_unfinished_requests():
        for out in tight.step():
            if out.prompt_logprobs is not None:
                got[out.seq_id] = out.prompt_logprobs
    assert tight.stats().num_preemptions > 0
    for seq_id, p in zip(ids, prompts, strict=True):
        expected = log_softmax(score(p))
        assert [i.token_id for i in got[seq_id]] == p[1:]
        assert [i.logprob for i in got[seq_id]] == pytest.approx(
            [expected[j, p[j + 1]] for j in range(len(p) - 1)], abs=1e-5)
