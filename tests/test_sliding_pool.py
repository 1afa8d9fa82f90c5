"""The sliding-window KV pool (engine/sliding_window.py) sized from the window, on a tiny gemma3
(window 32, 16-token blocks, layers alternating sliding and global) that the suite writes:
a small pool gives the same tokens as a full-size one, stays bounded by the window however long
a sequence grows, a pool too small for every running sequence preempts and still finishes
them with the same tokens, and LLM spends the KV budget on the global layers."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("numba")

from gguf_factory import write_tiny_gemma3  # noqa: E402

from localinfer.engine.config import EngineConfig, cdiv  # noqa: E402
from localinfer.engine.sliding_window import (  # noqa: E402
    min_pool_blocks,
    pool_blocks_for,
    size_kv_pools,
)
from localinfer.errors import InvalidRequestError  # noqa: E402
from localinfer.sampling_params import SamplingParams  # noqa: E402

WINDOW, BS, BLOCKS = 32, 16, 64


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gemma3(tmp_path_factory.mktemp("gemma3") / "tiny.gguf", window=WINDOW)


@pytest.fixture(scope="module")
def model(tiny_gemma3: Path):
    from localinfer.gguf_file import open_gguf
    from localinfer.model_config import ModelConfig
    from localinfer.tokenizer import Tokenizer

    g = open_gguf(tiny_gemma3)
    config = ModelConfig.from_gguf(g)
    assert config.sliding_window == WINDOW and config.swa_layers == (True, False, True, False)
    yield g, config, Tokenizer.from_gguf(g.metadata)
    g.close()


def _runner(model, num_swa_blocks: int | None):
    from localinfer.backends.numba_cpu.runner import NumbaModelRunner

    g, config, _ = model
    return NumbaModelRunner(g, config, num_blocks=BLOCKS, block_size=BS, threads=2,
                            num_swa_blocks=num_swa_blocks)


def _run(model, num_swa_blocks: int | None, prompts: list[list[int]], n_out: int,
         **config_kw):
    """Seeded sampled tokens of every prompt (run together), the engine and the sliding
    pool's peak use."""
    from localinfer.engine.llm_engine import LLMEngine

    runner = _runner(model, num_swa_blocks)
    engine = LLMEngine(runner, model[2], EngineConfig(
        max_model_len=BLOCKS * BS, block_size=BS, num_blocks=BLOCKS, **config_kw))
    ids = [engine.add_request(p, SamplingParams(max_tokens=n_out, temperature=1.0, seed=7 + i,
                                                ignore_eos=True))
           for i, p in enumerate(prompts)]
    out: dict[int, list[int]] = {i: [] for i in ids}
    engine.num_steps = 0  # for the tests: chunks shrunk to the pool take more steps
    while engine.has_unfinished_requests():
        engine.num_steps += 1
        for o in engine.step():
            out[o.seq_id].extend(o.token_ids)
    runner.close()
    return [out[i] for i in ids], engine


def _prompt(n: int, first: int = 5) -> list[int]:
    return [first + (i * 7) % 250 for i in range(n)]


def test_pool_size_follows_the_window() -> None:
    # 4 sequences of window 32 with 16-token blocks and 64 tokens a step: far below 64 blocks
    assert pool_blocks_for(WINDOW, BS, 4, 64, BLOCKS) == (4 * (32 + 29) + 64) // 16 == 19
    assert pool_blocks_for(WINDOW, BS, 64, 512, BLOCKS) == BLOCKS  # never above the main pool
    assert min_pool_blocks(WINDOW, BS, BLOCKS) == cdiv(WINDOW + BS - 1, BS) == 3


def test_small_pool_gives_the_same_tokens_and_stays_in_the_window(model) -> None:
    """One sequence to 400 tokens (12 windows): the sliding pool never holds more than the
    window's blocks plus the block being written, and the tokens equal a full-size pool's."""
    prompt = _prompt(40)
    small = min_pool_blocks(WINDOW, BS, BLOCKS)
    (toks,), engine = _run(model, small, [prompt], 360)
    assert engine.sliding is not None and engine.sliding.num_blocks == small
    assert engine.sliding.peak_used <= small
    assert engine.sliding.num_used_blocks == 0  # all returned when the request finished
    assert engine.scheduler.num_preemptions == 0  # one sequence always fits its window
    (full,), engine_full = _run(model, None, [prompt], 360)
    assert engine_full.sliding.num_blocks == BLOCKS
    assert len(toks) == 360 and toks == full
    assert len(set(toks)) > 20  # the sampled text varies: equality means something


def test_long_prompt_in_chunks_with_a_small_pool(model) -> None:
    """A 300-token prompt through 64-token chunks, then decode: chunks shrink to the pool."""
    prompt = _prompt(300, first=11)
    small = min_pool_blocks(WINDOW, BS, BLOCKS) + 1
    (toks,), engine = _run(model, small, [prompt], 40, max_num_batched_tokens=64)
    assert engine.sliding.peak_used <= small
    (full,), engine_full = _run(model, None, [prompt], 40, max_num_batched_tokens=64)
    assert toks == full
    assert engine.num_steps > engine_full.num_steps  # some chunks were cut to the free blocks


def test_concurrent_sequences_preempt_when_the_pool_is_short(model) -> None:
    """Six sequences in a pool that holds about two windows: the scheduler shrinks chunks,
    waits and preempts, and every sequence ends with the tokens of a full-size pool."""
    prompts = [_prompt(20 + 9 * i, first=3 + i) for i in range(6)]
    small = 2 * min_pool_blocks(WINDOW, BS, BLOCKS)
    toks, engine = _run(model, small, prompts, 80, max_num_batched_tokens=64)
    assert engine.sliding.peak_used <= small
    assert engine.sliding.num_used_blocks == 0
    assert engine.block_manager.num_used_blocks == 0
    assert engine.scheduler.num_preemptions > 0, "the pool was meant to run short"
    full, engine_full = _run(model, None, prompts, 80, max_num_batched_tokens=64)
    assert engine_full.scheduler.num_preemptions == 0
    assert all(len(t) == 80 for t in toks)
    assert toks == full


def test_default_pool_never_preempts(model) -> None:
    """The pool pool_blocks_for sizes for max_num_seqs sequences: no preemption, bounded."""
    prompts = [_prompt(30 + 5 * i, first=2 + i) for i in range(4)]
    size = pool_blocks_for(WINDOW, BS, 4, 64, BLOCKS)
    toks, engine = _run(model, size, prompts, 70, max_num_seqs=4, max_num_batched_tokens=64)
    assert engine.scheduler.num_preemptions == 0
    assert engine.sliding.peak_used <= size < BLOCKS
    full, _ = _run(model, None, prompts, 70, max_num_seqs=4, max_num_batched_tokens=64)
    assert toks == full


def test_pool_smaller_than_one_window_is_rejected(model) -> None:
    from localinfer.engine.llm_engine import LLMEngine

    runner = _runner(model, min_pool_blocks(WINDOW, BS, BLOCKS) - 1)
    try:
        with pytest.raises(InvalidRequestError, match="sliding-window KV pool"):
            LLMEngine(runner, model[2], EngineConfig(block_size=BS, num_blocks=BLOCKS))
    finally:
        runner.close()


def test_kv_budget_counts_sliding_layers_by_their_pool(model, tiny_gemma3: Path) -> None:
    """kv-cache-mb pays for 2 global layers x the main pool + 2 sliding layers x the sliding
    pool, so the same budget holds more context than if every layer kept every block; the
    default pool's memory is below that of full-size sliding layers."""
    from localinfer.llm import LLM

    config = model[1]
    per_layer = 2 * config.n_kv_heads * config.head_dim * 2  # f16 K and V per token
    mb = 0.25
    budget = int(mb * 2**20)
    without = budget // (4 * per_layer * BS)  # blocks if all 4 layers shared one pool
    with LLM(tiny_gemma3, threads=2, max_model_len=1024, kv_cache_mb=mb, max_num_seqs=2,
             max_num_batched_tokens=64) as llm:
        runner, engine = llm.engine.runner, llm.engine
        num_swa = pool_blocks_for(WINDOW, BS, 2, 64, 1 << 30)
        assert runner.num_swa_blocks == engine.sliding.num_blocks == num_swa
        assert engine.block_manager.num_blocks == (budget - 2 * per_layer * BS * num_swa) // (
            2 * per_layer * BS)
        assert engine.block_manager.num_blocks > 1.5 * without
        assert runner.kv_cache_bytes <= budget
        assert runner.kv_cache_bytes == 2 * per_layer * BS * (engine.block_manager.num_blocks
                                                              + num_swa)
        res = llm.generate([_prompt(50), _prompt(70, 9)],
                           SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
        assert [len(r.token_ids) for r in res] == [40, 40]
    with LLM(tiny_gemma3, threads=2, max_model_len=1024) as llm:
        runner = llm.engine.runner
        full = 4 * per_layer * BS * runner.num_blocks  # every layer over the main pool
        num_swa = pool_blocks_for(WINDOW, BS, 16, 512, runner.num_blocks)  # LLM's defaults
        assert runner.num_swa_blocks == num_swa < runner.num_blocks
        assert runner.kv_cache_bytes == 2 * per_layer * BS * (runner.num_blocks + num_swa) < full


def test_size_kv_pools_tight_budget_and_fixed_blocks() -> None:
    """A budget below the full sliding pool splits it evenly (as without a sliding pool);
    a fixed num_blocks keeps its size and gets the window's pool."""
    per = 1024  # bytes per token of each layer group
    config = EngineConfig(block_size=BS, max_num_seqs=16, kv_cache_mb=10 * 2 * per * BS / 2**20)
    assert size_kv_pools(config, WINDOW, per, per) == (10, 10)
    config = EngineConfig(block_size=BS, num_blocks=200, max_num_seqs=2,
                          max_num_batched_tokens=64)
    assert size_kv_pools(config, WINDOW, per, per) == (200, (2 * 61 + 64) // 16)
    with pytest.raises(InvalidRequestError, match="kv_cache_mb"):
        size_kv_pools(EngineConfig(block_size=BS, kv_cache_mb=1e-6), WINDOW, per, per)
