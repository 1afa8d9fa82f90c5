"""Speculative decoding with a fake paged-KV model: the same greedy tokens as plain decoding
(alone, batched, with prefill chunks, penalties, preemption), exact cuts at stops inside an
accepted run, KV rollback, the n-gram proposer, adaptive k, and the rejection sampler's
distribution (a chi-square test)."""

from __future__ import annotations

import numpy as np
import pytest
from engine_fakes import EOS, FakeDetokenizer, FakeRunner, FakeTokenizer, make_engine, piece
from test_llm_engine import run

import localinfer.engine.llm_engine as llm_engine
from localinfer.engine.adaptive_k import (
    DRAFT_MIN_BACKOFF,
    MIN_BACKOFF,
    MISSES_TO_PAUSE,
    AdaptiveK,
)
from localinfer.engine.block_manager import _ROOT_HASH
from localinfer.engine.config import EngineConfig
from localinfer.engine.llm_engine import LLMEngine
from localinfer.engine.ngram_proposer import NgramProposer, find_continuation
from localinfer.engine.proposer import Proposer, make_proposer
from localinfer.engine.sequence import Sequence
from localinfer.engine.verifier import verify
from localinfer.errors import InvalidRequestError
from localinfer.sampling_params import SamplingParams

# prompts whose text repeats in places, so lookup has something to find, of mixed lengths
PROMPTS = [[1 + (7 * i + j) % 60 for j in range(3 + 5 * i)] + [5, 9, 13, 5, 9] * (i % 3)
           for i in range(6)]
GREEDY = SamplingParams(max_tokens=40, ignore_eos=True)
SPEC = {"speculative": "ngram", "num_speculative_tokens": 4}


def generate(prompts, params=GREEDY, *, order=1, **kw):
    engine = make_engine(order=order, **kw)
    return run(engine, prompts, params), engine


def verified_runs(monkeypatch) -> list[list[int]]:
    """Record what every verification returns (accepted guesses + the next token)."""
    runs: list[list[int]] = []

    def spy(rows, seq, guesses):
        out = verify(rows, seq, guesses)
        runs.append(list(out))
        return out

    monkeypatch.setattr(llm_engine, "verify", spy)
    return runs


# -- greedy: identical tokens ------------------------------------------------------------------

@pytest.mark.parametrize("order", [1, 2, None])
def test_greedy_speculation_gives_plain_tokens_alone(order):
    for prompt in PROMPTS[:4]:
        plain, _ = generate([prompt], order=order)
        spec, engine = generate([prompt], order=order, **SPEC)
        assert spec == plain
    if order == 1:  # the text cycles: lookup must have been right, many times
        stats = engine.stats()
        assert stats.spec_verifications > 0 and stats.spec_accepted_tokens > 10
        assert engine.runner.num_steps < 40


def test_greedy_speculation_batched_with_prefill_chunks_and_preemption():
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    plain = [generate([p], params)[0][0] for p in PROMPTS]
    # a small token budget: prefill chunks share steps with speculating decodes
    spec, engine = generate(PROMPTS, params, max_num_batched_tokens=12,
                            speculative_max_decodes=8, **SPEC)
    assert [spec[i] for i in range(len(PROMPTS))] == plain
    assert engine.stats().spec_accepted_tokens > 0
    # a small pool: sequences are preempted (and recomputed) between speculative steps
    tight, engine = generate(PROMPTS, params, num_blocks=24, max_num_batched_tokens=32,
                             speculative_max_decodes=8, **SPEC)
    assert [tight[i] for i in range(len(PROMPTS))] == plain
    stats = engine.stats()
    assert stats.num_preemptions > 0 and stats.spec_accepted_tokens > 0


def test_greedy_with_repetition_penalty_counts_accepted_guesses():
    params = SamplingParams(max_tokens=40, ignore_eos=True, repetition_penalty=1.3,
                            penalty_last_n=6)
    for prompt in PROMPTS[:3]:
        plain, _ = generate([prompt], params)
        spec, _ = generate([prompt], params, **SPEC)
        assert spec == plain


def test_no_speculation_when_many_sequences_decode():
    _, engine = generate(PROMPTS[:4], max_num_batched_tokens=256, speculative_max_decodes=3,
                         **SPEC)
    assert engine.stats().spec_verifications == 0


# -- cuts inside an accepted run ---------------------------------------------------------------

def _cut_inside(runs: list[list[int]], last: int) -> bool:
    """Some verification yielded the output's last token before its own end."""
    return any(last in r[:-1] for r in runs)


def repeating_prompt() -> tuple[list[int], list[int], int]:
    """A prompt that pastes the text its greedy continuation will be (an order-2 model's
    text depends on its last two tokens only), as a code edit does: lookup guesses right
    from the first step. Returns it, that continuation, and the index of the
    continuation's first token that it has not produced before, at least 2 tokens in."""
    out = generate([PROMPTS[1]], SamplingParams(max_tokens=60, ignore_eos=True),
                   order=2, num_blocks=128)[0][0][0]
    prompt = out[8:48] + PROMPTS[1] + out[:10]
    cont = generate([prompt], order=2)[0][0][0]
    assert cont == out[10:50]
    j = next(j for j in range(2, len(cont)) if cont[j] not in cont[:j])
    return prompt, cont, j


def test_stop_token_inside_accepted_run_cuts_exactly(monkeypatch):
    prompt, cont, j = repeating_prompt()
    params = SamplingParams(max_tokens=40, stop_token_ids=[cont[j]], ignore_eos=True)
    expect, _ = generate([prompt], params, order=2)
    assert expect[0][0] == cont[: j + 1] and expect[0][2] == "stop"
    runs = verified_runs(monkeypatch)
    got, _ = generate([prompt], params, order=2, **SPEC)
    assert got == expect
    assert _cut_inside(runs, cont[j]), runs


def test_stop_string_inside_accepted_run_cuts_exactly(monkeypatch):
    prompt, cont, j = repeating_prompt()
    stop = piece(cont[j - 1]) + piece(cont[j])
    params = SamplingParams(max_tokens=40, stop=[stop], ignore_eos=True)
    expect, _ = generate([prompt], params, order=2)
    assert expect[0][2] == "stop" and stop not in expect[0][1]
    runs = verified_runs(monkeypatch)
    got, _ = generate([prompt], params, order=2, **SPEC)
    assert got == expect
    assert _cut_inside(runs, expect[0][0][-1]), runs


@pytest.mark.parametrize("max_tokens", [17, 23, 31])
def test_max_tokens_inside_accepted_run_cuts_exactly(monkeypatch, max_tokens):
    prompt, _, _ = repeating_prompt()
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    expect, _ = generate([prompt], params, order=2)
    runs = verified_runs(monkeypatch)
    got, _ = generate([prompt], params, order=2, **SPEC)
    assert got == expect and len(got[0][0]) == max_tokens and got[0][2] == "length"
    # guesses are capped by what max_tokens leaves, so no run overshoots it (the last token
    # comes from a plain decode when the cap is 0); the first token came from the prefill
    assert sum(len(r) for r in runs) <= max_tokens - 1
    assert max(len(r) for r in runs) > 2


def test_eos_inside_accepted_run_stops_there():
    params = SamplingParams(max_tokens=40)
    for prompt in PROMPTS:
        expect, _ = generate([prompt + [EOS, 3]], params)
        got, _ = generate([prompt + [EOS, 3]], params, **SPEC)
        assert got == expect


# -- rollback ----------------------------------------------------------------------------------

class OracleProposer(Proposer):
    """Guesses the true continuation (from a plain run) for a random number of tokens, then
    wrong ones: every verification accepts a known prefix and rejects the rest."""

    def __init__(self, truth: dict[tuple[int, ...], list[int]], seed: int) -> None:
        self.truth = truth
        self.rng = np.random.default_rng(seed)

    def propose(self, seqs, ks):
        out = []
        for seq, k in zip(seqs, ks, strict=True):
            full = self.truth[tuple(seq.prompt_token_ids)]
            right = full[seq.num_tokens : seq.num_tokens + int(self.rng.integers(0, k + 1))]
            wrong = [(t + 1) % 64 for t in full[seq.num_tokens + len(right):][: k - len(right)]]
            out.append(right + wrong)
        return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rollback_frees_guess_blocks_and_never_caches_rejected_tokens(seed):
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    prompts = PROMPTS[:4]
    plain = [generate([p], params, order=None)[0][0][0] for p in prompts]
    truth = {tuple(p): p + out for p, out in zip(prompts, plain, strict=True)}
    # a pool just large enough: guesses must fit in it, and freed guess blocks get reused
    engine = make_engine(order=None, num_blocks=40, block_size=4, max_num_batched_tokens=16,
                         **SPEC)
    engine.speculator.proposer = OracleProposer(truth, seed)
    bm = engine.block_manager
    ids = [engine.add_request(p, params) for p in prompts]
    outputs = {i: list(p) for i, p in zip(ids, prompts, strict=True)}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.seq_id] += out.token_ids
        # every cached block holds the accepted tokens of some request at its place
        valid = set()
        for tokens in outputs.values():
            parent = _ROOT_HASH
            for i in range(len(tokens) // 4):
                block = tuple(tokens[4 * i : 4 * i + 4])
                parent = hash((parent, block))
                valid.add((parent, block))
        for h, b in bm.cached_blocks.items():
            assert (h, bm.blocks[b].token_ids) in valid
        held = {b for s in engine.scheduler.running for b in s.block_table}
        assert bm.num_used_blocks == len(held)  # nothing leaked by a rollback
        for s in engine.scheduler.running:  # no block kept past the accepted tokens
            assert len(s.block_table) <= -(-s.num_tokens // 4)
    assert [outputs[i][len(p):] for i, p in zip(ids, prompts, strict=True)] == plain
    assert bm.num_used_blocks == 0
    rollbacks = engine.runner.rollbacks
    assert sum(len(freed) for _, _, freed in rollbacks) > 5
    stats = engine.stats()
    assert 0 < stats.spec_accepted_tokens < stats.spec_proposed_tokens


def test_rollback_in_a_sliding_window_pool():
    """A model with sliding-window layers (gemma3) keeps a second pool: guesses take blocks
    there too, and a rollback returns them."""
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    prompts = PROMPTS[:3]
    plain = [generate([p], params, order=None)[0][0][0] for p in prompts]
    truth = {tuple(p): p + out for p, out in zip(prompts, plain, strict=True)}
    config = EngineConfig(block_size=4, num_blocks=64, max_num_batched_tokens=16, **SPEC)
    runner = FakeRunner(64, 4)
    runner.sliding_window, runner.num_swa_blocks = 8, 24
    engine = llm_engine.LLMEngine(runner, FakeTokenizer(), config, FakeDetokenizer)
    engine.speculator.proposer = OracleProposer(truth, 5)
    sliding = engine.sliding
    assert sliding is not None
    ids = [engine.add_request(p, params) for p in prompts]
    got = {i: [] for i in ids}
    while engine.has_unfinished_requests():
        for out in engine.step():
            got[out.seq_id] += out.token_ids
        live = [b for s in engine.scheduler.running for b in sliding.tables.get(s.seq_id, [])
                if b >= 0]
        assert sliding.num_used_blocks == len(live) == len(set(live))
        for s in engine.scheduler.running:
            assert len(sliding.tables.get(s.seq_id, [])) <= -(-s.num_tokens // 4)
    assert [got[i] for i in ids] == plain
    assert sliding.num_used_blocks == 0 and engine.block_manager.num_used_blocks == 0
    assert engine.stats().spec_accepted_tokens < engine.stats().spec_proposed_tokens


def test_runner_without_rollback_refuses_speculation():
    class NoRollback(FakeRunner):
        supports_speculation = False

    config = EngineConfig(block_size=4, num_blocks=16, speculative="ngram")
    with pytest.raises(InvalidRequestError, match="cannot roll back"):
        llm_engine.LLMEngine(NoRollback(16, 4), FakeTokenizer(), config)


def test_speculative_setting_is_checked_clearly():
    with pytest.raises(InvalidRequestError, match="needs the target model's runner"):
        make_proposer("qwen2.5-coder-0.5b")
    with pytest.raises(InvalidRequestError, match="'ngram' or a draft MODEL"):
        EngineConfig(speculative=" ")
    with pytest.raises(InvalidRequestError, match="num_speculative_tokens"):
        EngineConfig(speculative="ngram", num_speculative_tokens=0)


# -- the n-gram proposer -----------------------------------------------------------------------

def test_ngram_finds_the_longest_most_recent_match():
    tokens = np.array([1, 2, 3, 9, 9, 7, 2, 3, 8, 8, 1, 2, 3, 5, 5, 4, 1, 2, 3], np.int32)
    # tail [1, 2, 3]: a 3-gram at 0..2 and at 10..12 (most recent wins); [2, 3] alone at 6..7
    start, n = find_continuation(tokens, len(tokens), 1, 4, 3)
    assert (start, n) == (13, 3) and tokens[start : start + n].tolist() == [5, 5, 4]
    # a 4-gram beats a more recent 3-gram: tail [0, 1, 2, 3] occurs only at 0..3
    tokens = np.array([0, 1, 2, 3, 6, 6, 1, 2, 3, 7, 0, 1, 2, 3], np.int32)
    assert find_continuation(tokens, len(tokens), 1, 4, 2) == (4, 2)
    # the continuation stops at the sequence's end
    tokens = np.array([4, 5, 6, 4, 5], np.int32)
    assert find_continuation(tokens, 5, 1, 4, 8) == (2, 3)
    # no match of min_n tokens: nothing
    assert find_continuation(np.array([1, 2, 3, 4], np.int32), 4, 1, 4, 3)[1] == 0
    assert find_continuation(np.array([1, 2, 9, 2], np.int32), 4, 2, 4, 3)[1] == 0
    assert find_continuation(np.array([1, 2, 9, 2], np.int32), 4, 1, 4, 3) == (2, 2)


def test_ngram_proposer_follows_a_growing_sequence():
    proposer = NgramProposer()
    seq = Sequence(0, "r0", [1, 2, 3, 4, 1, 2], SamplingParams())
    assert proposer.propose([seq], [3]) == [[3, 4, 1]]
    for t in range(100, 200):  # grows past the first buffer
        seq.append_token(t)
    seq.append_token(149)
    seq.append_token(150)
    assert proposer.propose([seq], [2]) == [[151, 152]]
    proposer.free(seq)
    assert proposer.propose([seq], [1]) == [[151]]
    periodic = Sequence(1, "r1", [9, 1, 2, 3, 1, 2, 3, 1, 2], SamplingParams())
    assert proposer.propose([periodic], [7]) == [[3, 1, 2, 3, 1, 2, 3]]
    seq.append_token(7)  # no earlier [150, 7]: a 1-gram match alone is not enough
    assert proposer.propose([seq], [3]) == [[]]
    assert NgramProposer(min_n=1).propose([seq], [1]) == [[]]  # no 7 before either


# -- adaptive k --------------------------------------------------------------------------------

def test_adaptive_k_pauses_under_constant_rejection_and_probes_again():
    state = AdaptiveK(8)
    assert state.want() == 8
    state.record(8, 3)
    assert state.k == 4  # held for 3: ask one more than that
    state.record(4, 4)
    assert state.k == 8  # all held: double
    for _ in range(MISSES_TO_PAUSE):
        state.record(state.want(), 0)
    wants = [state.want() for _ in range(8)]
    assert wants == [0] * 8  # paused
    assert state.want() == 1  # then a probe of one guess
    for _ in range(MISSES_TO_PAUSE):
        state.record(1, 0)
    assert [state.want() for _ in range(16)] == [0] * 16  # a longer pause each time
    state.want()
    state.record(1, 1)
    assert state.want() == 2


def test_adaptive_k_fills_the_runners_token_groups_for_a_cheap_proposer():
    """With token_group 4, 1 + k is rounded up to a multiple of 4 (within K): the guesses a
    step of 4 tokens computes cost no more than one guess would. A draft is never rounded."""
    state = AdaptiveK(8, group=4)
    assert state.want() == 8  # 9 would round to 12: K caps it
    state.record(8, 3)
    assert state.k == 4 and state.want() == 7  # 5 tokens -> 8
    state.record(7, 0)
    assert state.k == 1 and state.want() == 3  # 2 tokens -> 4
    state.record(3, 3)
    assert state.k == 2 and state.want() == 3  # k doubles; 3 tokens -> 4 again
    state.record(3, 3)
    assert state.k == 4 and state.want() == 7
    assert AdaptiveK(8, group=1, k=1).want() == 1
    dear = AdaptiveK(8, dear=True, group=4, k=1)
    assert dear.want() == 1  # a guess more is a draft's forward pass more


def test_speculator_sizes_guesses_to_the_runners_token_group():
    from localinfer.engine.speculator import Speculator

    tokens = list(range(1, 30)) + list(range(1, 10))  # the tail 7 8 9 recurs: 10.. follow
    for group, after_miss in ((1, [10]), (4, [10, 11, 12])):
        speculator = Speculator(NgramProposer(), 8, token_group=group)
        seq = Sequence(0, "r0", tokens, SamplingParams(max_tokens=50))
        (_, guesses), = speculator.propose([seq], 16, 1000)
        assert guesses == list(range(10, 18))
        speculator.record(seq, 8, 0)  # all rejected: k drops to 1
        assert speculator.propose([seq], 16, 1000) == [(seq, after_miss)]
    # the engine hands the runner's group to its speculator
    runner = FakeRunner(16, 4)
    runner.token_group = 4
    engine = LLMEngine(runner, FakeTokenizer(), EngineConfig(block_size=4, num_blocks=16,
                                                              **SPEC), FakeDetokenizer)
    assert engine.speculator is not None and engine.speculator.token_group == 4


def test_a_drafts_probe_that_loses_pauses_again_at_once():
    state = AdaptiveK(8, dear=True)
    for _ in range(MISSES_TO_PAUSE):
        state.record(state.want(), 0)
    assert [state.want() for _ in range(DRAFT_MIN_BACKOFF)] == [0] * DRAFT_MIN_BACKOFF
    assert state.want() == 1
    state.record(1, 0)  # the probe lost: paused again, for longer
    assert [state.want() for _ in range(2 * DRAFT_MIN_BACKOFF)] == [0] * (2 * DRAFT_MIN_BACKOFF)
    state.want()
    state.record(1, 1)  # a probe that pays: guessing again, further
    assert state.want() == 2 and not state.probing
    for _ in range(MISSES_TO_PAUSE - 1):
        state.record(2, 0)
    assert state.want() > 0  # out of probing, a pause takes MISSES_TO_PAUSE losses again


class _Grammar:
    """A guide whose grammar accepts the first `n` of any guesses."""

    def __init__(self, n: int) -> None:
        self.n = n

    def valid_prefix(self, tokens: list[int]) -> int:
        return min(self.n, len(tokens))


def test_speculator_cuts_constrained_guesses_to_the_grammar_and_respects_limits():
    from localinfer.engine.speculator import Speculator

    speculator = Speculator(NgramProposer(), 4, max_decodes=3)
    tokens = [1, 2, 3, 4, 5, 1, 2]
    free = Sequence(0, "r0", list(tokens), SamplingParams(max_tokens=50))
    guided = Sequence(1, "r1", list(tokens), SamplingParams(max_tokens=50), guide=_Grammar(2))
    refused = Sequence(3, "r3", list(tokens), SamplingParams(max_tokens=50), guide=_Grammar(0))
    assert speculator.propose([free, guided, refused], 16, 1000) == [
        (free, [3, 4, 5, 1]), (guided, [3, 4])]
    speculator.max_decodes = 2
    # k is capped by the step's budget, by max_tokens and by the context left after the
    # token the step samples anyway
    assert speculator.propose([free], 2, 1000) == [(free, [3, 4])]
    short = Sequence(2, "r2", list(tokens), SamplingParams(max_tokens=3), num_prompt_tokens=6)
    assert speculator.propose([short], 16, 1000) == [(short, [3])]
    assert speculator.propose([free], 16, len(tokens) + 3) == [(free, [3, 4])]
    # more decoding sequences than max_decodes: nobody guesses
    assert speculator.propose([free, short, guided], 16, 1000) == []


def test_speculation_stops_spending_when_guesses_fail():
    # order None: the text never repeats, so lookup guesses are (almost) always wrong
    params = SamplingParams(max_tokens=120, ignore_eos=True)
    _, engine = generate([PROMPTS[2]], params, order=None, num_blocks=128, **SPEC)
    stats = engine.stats()
    assert stats.spec_accepted_tokens <= 3
    assert stats.spec_proposed_tokens < 40  # not 4 per step for 120 steps


# -- sampling: the distribution is the target's ------------------------------------------------

# the chi-square distribution's 1 - 1e-4 quantiles, by degrees of freedom
CHI2_CRIT_1E4 = {1: 15.14, 2: 18.42, 3: 21.11, 4: 23.51, 5: 25.74, 6: 27.86, 7: 29.88}


def chi2_crit_1e4(df: int) -> float:
    """The chi-square distribution's 1 - 1e-4 quantile (Wilson-Hilferty past the table)."""
    if df in CHI2_CRIT_1E4:
        return CHI2_CRIT_1E4[df]
    h = 2 / (9 * df)
    return df * (1 - h + 3.719 * np.sqrt(h)) ** 3


def _expected(logits: np.ndarray, temperature: float, top_p: float) -> np.ndarray:
    """The plain sampler's distribution, computed independently: softmax at the temperature
    over the smallest set of likeliest tokens reaching top_p."""
    order = np.argsort(-logits, kind="stable")
    p = np.exp(logits[order] - logits.max())
    p /= p.sum()
    keep = order[: int(np.searchsorted(np.cumsum(p), top_p)) + 1]
    q = np.zeros_like(logits, dtype=np.float64)
    q[keep] = np.exp((logits[keep] - logits.max()) / temperature)
    return q / q.sum()


def _chi2(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    alive = probs > 0
    n = counts.sum()
    exp = probs[alive] * n
    assert counts[~alive].sum() == 0, "a token outside the target's support was sampled"
    return float(((counts[alive] - exp) ** 2 / exp).sum()), int(alive.sum()) - 1


def test_rejection_sampling_preserves_the_target_distribution():
    """Verify a fixed guess 20000 times with seeded generators: the first token must follow
    the target's distribution at temperature 0.8 with top-p 0.9 whether the guess is likely,
    unlikely or outside the nucleus, and the token after an accepted guess the second
    row's. Each chi-square test's false-alarm rate is 1e-4."""
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((2, 8)).astype(np.float32) * 1.5
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=8)
    p0 = _expected(rows[0].astype(np.float64), 0.8, 0.9)
    p1 = _expected(rows[1].astype(np.float64), 0.8, 0.9)
    likely, unlikely = int(np.argmax(p0)), int(np.argsort(p0)[-3])
    outside = int(np.argmin(rows[0]))
    assert p0[outside] == 0 and 0 < p0[unlikely] < p0[likely]
    n = 20000
    for guess in (likely, unlikely, outside):
        first = np.zeros(8, np.int64)
        second = np.zeros(8, np.int64)
        for i in range(n):
            seq = Sequence(0, "r", [1, 2], params, generator=np.random.default_rng(i))
            out = verify(rows, seq, [guess])
            first[out[0]] += 1
            if out[0] == guess:
                second[out[1]] += 1
        stat, df = _chi2(first, p0)
        assert stat < chi2_crit_1e4(df), (guess, stat, first, p0 * n)
        if guess != outside:
            stat, df = _chi2(second, p1)
            assert stat < chi2_crit_1e4(df), (guess, stat, second, p1 * second.sum())
        else:
            assert second.sum() == 0


def test_engine_sampling_with_speculation_matches_plain_distribution():
    """End to end (proposer, verification inside the batch, rollback, per-request seeds):
    3000 seeded requests at temperature 0.8 with top-p 0.9 on a prompt whose text repeats,
    with and without speculation; the joint distribution of each request's 2nd and 3rd
    tokens must be the same (two-sample chi-square, false-alarm rate 1e-4)."""
    prompt = PROMPTS[1] + generate([PROMPTS[1]])[0][0][0][:12]  # ends in its greedy cycle
    n = 3000

    def tally(**kw) -> tuple[dict[tuple[int, int], int], LLMEngine]:
        engine = make_engine(order=1, num_blocks=4096, block_size=4, max_num_seqs=256,
                             max_num_batched_tokens=2048, **kw)
        for i in range(n):
            engine.add_request(prompt, SamplingParams(max_tokens=6, temperature=0.8,
                                                      top_p=0.9, seed=i, ignore_eos=True))
        toks: dict[int, list[int]] = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                toks.setdefault(out.seq_id, []).extend(out.token_ids)
        counts: dict[tuple[int, int], int] = {}
        for t in toks.values():
            counts[t[1], t[2]] = counts.get((t[1], t[2]), 0) + 1
        return counts, engine

    plain, _ = tally()
    spec, engine = tally(speculative_max_decodes=n, **SPEC)
    stats = engine.stats()
    assert stats.spec_accepted_tokens > 500  # guesses were verified, and often held
    # categories expected at least 10 times in both; the rest pooled into one
    keys = sorted(set(plain) | set(spec))
    big = [k for k in keys if plain.get(k, 0) + spec.get(k, 0) >= 20]
    a = np.array([plain.get(k, 0) for k in big] + [n - sum(plain.get(k, 0) for k in big)])
    b = np.array([spec.get(k, 0) for k in big] + [n - sum(spec.get(k, 0) for k in big)])
    keep = (a + b) > 0
    a, b = a[keep], b[keep]
    expected = (a + b) / 2
    stat = float((((a - expected) ** 2 + (b - expected) ** 2) / expected).sum())
    df = len(a) - 1
    assert stat < chi2_crit_1e4(df), (stat, df)


def test_sampled_speculation_completes_and_keeps_max_tokens():
    params = SamplingParams(max_tokens=30, temperature=0.7, seed=3, ignore_eos=True)
    got, engine = generate(PROMPTS[:2], params, **SPEC)
    assert all(len(toks) == 30 for toks, _, _ in got.values())
    assert engine.stats().spec_accepted_tokens > 0
    again, _ = generate(PROMPTS[:2], params, **SPEC)
    assert again == got  # seeded: reproducible


# -- surfaces ----------------------------------------------------------------------------------

def test_metrics_expose_speculative_counters():
    pytest.importorskip("prometheus_client")
    from localinfer.server.metrics import ServerMetrics

    _, engine = generate([PROMPTS[1]], **SPEC)
    stats = engine.stats()
    metrics = ServerMetrics()
    metrics.watch_engines(lambda: [("m", stats, 0, 0)])
    text = metrics.render().decode()
    label = '{model="m"}'
    assert (f"localinfer_spec_decode_num_draft_tokens_total{label} "
            f"{stats.spec_proposed_tokens:.1f}") in text
    assert (f"localinfer_spec_decode_num_accepted_tokens_total{label} "
            f"{stats.spec_accepted_tokens:.1f}") in text
    assert (f"localinfer_spec_decode_num_verifications_total{label} "
            f"{stats.spec_verifications:.1f}") in text
    assert "localinfer_spec_decode_acceptance_rate" in text
    assert stats.spec_accepted_tokens > 0


def test_a_verification_that_costs_more_than_it_accepts_counts_as_a_miss():
    from localinfer.engine.adaptive_k import VERIFY_COST

    cheap, dear = AdaptiveK(4), AdaptiveK(4)
    for _ in range(MISSES_TO_PAUSE):
        cheap.record(2, 1)  # an n-gram lookup: one of two guesses held, it paid
        dear.record(2, 1, proposer_steps=1.5)  # a draft's 1.5 steps of work for one token
    assert cheap.want() > 0
    assert dear.want() == 0 and dear.paused  # paused like a lookup that keeps missing
    paid = AdaptiveK(4)
    for _ in range(MISSES_TO_PAUSE):
        paid.record(4, 3, proposer_steps=2.0)  # 3 tokens for 2 + 4 * VERIFY_COST steps
    assert 2.0 + 4 * VERIFY_COST < 3 and paid.want() > 0


def test_speculator_weighs_the_proposers_time_against_a_decode_step():
    import time

    from localinfer.engine.proposer import Proposer
    from localinfer.engine.speculator import Speculator

    class SlowDraft(Proposer):
        def propose(self, seqs, ks):
            time.sleep(0.03)  # a draft model's forward passes
            return [[7] * k for k in ks]

    def rounds(step_seconds):
        speculator = Speculator(SlowDraft(), 2)
        speculator.observe_step(step_seconds)
        seq = Sequence(0, "r0", [1, 2, 3], SamplingParams(max_tokens=50))
        for i in range(1 + MISSES_TO_PAUSE):
            (_, guesses), = speculator.propose([seq], 16, 1000)
            speculator.record(seq, len(guesses), 1)
            if i == 0:  # a first proposal (a draft prefilling the prompt) is not weighed
                assert seq.adaptive_k.misses == 0
        return seq.adaptive_k

    assert rounds(1.0).paused == 0  # 30 ms of drafting against 1 s steps: one token pays
    assert rounds(0.01).paused > 0  # against 10 ms steps: three steps' worth for one token


def test_break_even_drafting_counts_as_a_miss():
    """A draft whose accepted guesses only pay for themselves (gain ~0 a verification) is
    paused: what the cost model does not see makes break-even a loss in practice."""
    from localinfer.engine.adaptive_k import MARGIN, VERIFY_COST

    even = AdaptiveK(4, dear=True)
    for _ in range(MISSES_TO_PAUSE):
        even.record(2, 1, proposer_steps=1.0 - 2 * VERIFY_COST)  # gain exactly 0
    assert even.want() == 0 and even.paused
    lookup = AdaptiveK(4)  # a lookup's cost is all measured: break-even is not a loss
    for _ in range(MISSES_TO_PAUSE):
        lookup.record(2, 1, proposer_steps=1.0 - 2 * VERIFY_COST)
    assert lookup.want() > 0
    ahead = AdaptiveK(4, dear=True)
    for _ in range(MISSES_TO_PAUSE):
        ahead.record(2, 1, proposer_steps=1.0 - 2 * VERIFY_COST - 2 * MARGIN)
    assert ahead.want() > 0


def test_speculator_measures_what_a_guess_adds_to_a_step():
    from localinfer.engine.adaptive_k import VERIFY_COST
    from localinfer.engine.ngram_proposer import NgramProposer
    from localinfer.engine.speculator import Speculator

    speculator = Speculator(NgramProposer(), 4)
    speculator.observe_step(0.13, guessed=2)  # no plain step timed yet: the model's cost
    assert speculator.guess_cost == VERIFY_COST
    assert abs(speculator.step_seconds - 0.13 / (1 + 2 * VERIFY_COST)) < 1e-9
    for _ in range(40):  # plain steps of 100 ms, steps with 2 guesses of 130 ms
        speculator.observe_step(0.10)
        speculator.observe_step(0.13, guessed=2)
    assert abs(speculator.step_seconds - 0.10) < 1e-6
    assert abs(speculator.guess_cost - 0.15) < 1e-3  # 30 ms over 2 guesses of a 100 ms step
    # the measured cost is what a verification is charged
    seq = Sequence(0, "r0", [1, 2, 3, 1, 2], SamplingParams(max_tokens=50))
    seq.adaptive_k = AdaptiveK(4, verifications=1)  # net 0 so far; a moving average of 0.3
    speculator.record(seq, 4, 1)
    assert abs(seq.adaptive_k.net - 0.3 * (1 - 4 * 0.15)) < 1e-3


def test_a_drafts_empty_proposals_count_as_misses_and_lookups_do_not():
    """A draft's forward pass that found no guess it was sure of is spent time: three in a
    row pause the sequence. An n-gram lookup that found nothing costs nothing: it keeps
    looking every step."""
    import time

    from localinfer.engine.proposer import Proposer
    from localinfer.engine.speculator import Speculator

    class Unsure(Proposer):
        def propose(self, seqs, ks):
            time.sleep(0.005)  # a draft's forward pass
            return [[] for _ in seqs]

    class Draft(Unsure):
        runs_a_model = True

    def calls(proposer):
        speculator = Speculator(proposer, 4)
        speculator.observe_step(0.01)
        seq = Sequence(0, "r0", [1, 2, 3], SamplingParams(max_tokens=50))
        asked = 0
        for _ in range(1 + MISSES_TO_PAUSE + 4):
            if seq.adaptive_k is None or seq.adaptive_k.paused == 0:
                asked += 1
            assert speculator.propose([seq], 16, 1000) == []
        return seq.adaptive_k, asked

    state, asked = calls(Draft())
    assert state.paused > 0 and asked == MISSES_TO_PAUSE
    # a draft's pauses start longer than a lookup's: each probe first catches up the pause
    assert state.dear and state.min_backoff == DRAFT_MIN_BACKOFF > MIN_BACKOFF
    assert state.paused == DRAFT_MIN_BACKOFF - (1 + MISSES_TO_PAUSE + 4 - MISSES_TO_PAUSE)
    state, asked = calls(Unsure())
    assert state.paused == 0 and state.verifications == 0 and asked == 1 + MISSES_TO_PAUSE + 4
