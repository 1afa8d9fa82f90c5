"""Speculative decoding on Qwen2.5-Coder-1.5B (Q4_K / Q6_K, 28 layers): at temperature 0 the
tokens with `ngram` and with the 0.5B as draft model are plain decoding's, token for token,
for one prompt alone and for 8 prompts batched (prefill chunks beside speculating decodes).
The file is ~1.1 GB (LOCALINFER_TEST_QWEN2_15B, else pulled into the catalog cache)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_spec_decode_models import CODE_EDIT

from localinfer.sampling_params import SamplingParams

pytest.importorskip("numba")
pytestmark = pytest.mark.slow

PROMPTS = [CODE_EDIT, "Write a Python function that checks whether a string is a palindrome.",
           "Count from 1 to 15 separated by commas.", "List the planets of the solar system.",
           "Write a SQL query that counts the orders of each customer.",
           "Repeat this sentence twice: the quick brown fox jumps over the lazy dog.",
           "Write a bash loop that prints the numbers 1 to 5.",
           "What does the Python keyword `yield` do? One sentence."]
ALONE = SamplingParams(max_tokens=48, temperature=0.0)
BATCHED = SamplingParams(max_tokens=20, temperature=0.0)


def _decode(model: Path, speculative: str | None) -> tuple[list[int], list[list[int]], object]:
    from localinfer.llm import LLM

    with LLM(str(model), threads=2, max_model_len=1024, max_num_batched_tokens=128,
             speculative=speculative) as llm:
        if llm.engine.speculator is not None:
            llm.engine.speculator.max_decodes = 8  # all 8 guess, not only up to 4
        alone = llm.generate(llm.request(CODE_EDIT), ALONE)[0].token_ids
        batched = [r.token_ids for r in llm.generate([llm.request(p) for p in PROMPTS],
                                                      BATCHED)]
        return alone, batched, llm.engine.stats()


def test_qwen15b_same_tokens_with_ngram_and_with_the_05b_draft(qwen2_15b_path: Path,
                                                               qwen2_path: Path) -> None:
    plain_alone, plain_batched, _ = _decode(qwen2_15b_path, None)
    assert len(plain_alone) == ALONE.max_tokens
    for spec in ("ngram", str(qwen2_path)):
        alone, batched, stats = _decode(qwen2_15b_path, spec)
        assert alone == plain_alone, spec
        assert batched == plain_batched, spec
        # guesses were made and some held: the equality above went through verification
        assert stats.spec_verifications > 0 and stats.spec_accepted_tokens > 10, spec
