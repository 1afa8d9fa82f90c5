"""The bench's kv_cache_mb (bench/runner_ours._kv_mb) gives the engine exactly the main pool it
asks for, also for a gemma3 whose sliding-window layers keep a pool of their own."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf_factory import write_tiny_gemma3, write_tiny_llama

from localinfer.bench.plan import BenchPlan
from localinfer.bench.runner_ours import MAX_BATCHED, _kv_mb
from localinfer.engine.sliding_window import pool_blocks_for
from localinfer.llm import LLM


def _pools(path: Path, tokens: int, max_seqs: int) -> tuple[int, int | None]:
    plan = BenchPlan(model=str(path), threads=1)
    llm = LLM(str(path), backend="numba", threads=1, max_model_len=min(tokens, 4096),
              kv_cache_mb=_kv_mb(plan, tokens, max_seqs), max_num_seqs=max_seqs,
              max_num_batched_tokens=MAX_BATCHED, enable_prefix_caching=False)
    try:
        runner = llm.engine.runner
        return runner.num_blocks, getattr(runner, "num_swa_blocks", None)
    finally:
        llm.close()


# 256 tokens: the sliding pool the engine wants is larger than the main pool (capped at it);
# 4096: smaller, so the budget must not spread the global layers' share over every layer
@pytest.mark.parametrize("tokens", [256, 4096])
@pytest.mark.parametrize("max_seqs", [1, 4])
def test_gemma3_pools_are_sized_as_asked(tmp_path: Path, tokens: int, max_seqs: int) -> None:
    window = 32
    path = write_tiny_gemma3(tmp_path / "g.gguf", window=window)
    blocks = tokens // 16
    main, sliding = _pools(path, tokens, max_seqs)
    assert main == blocks
    assert sliding == pool_blocks_for(window, 16, max_seqs, MAX_BATCHED, blocks)
    if tokens == 4096:
        assert sliding < main  # the sliding layers hold only their windows


def test_llama_pool_is_sized_as_asked(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "l.gguf")
    assert _pools(path, 1024, 4)[0] == 1024 // 16
