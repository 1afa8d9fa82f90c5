"""The Triton backend on real weights: SmolLM2 (llama, Q4_1/Q8_0), Qwen2.5-Coder-0.5B (qwen2,
Q5_0/Q4_K/Q6_K/Q8_0) and gemma-3-270m (Q5_0/Q4_K/Q6_K/Q8_0) cut to their first 2 blocks
(gguf_cut.py: the interpreter runs a whole model far too slowly), teacher-forced against
llama.cpp on the same cut file — the parity criteria of test_numba_parity.py, with the mean-KL
bound doubled: llama.cpp's CPU path rounds activations to 8 bits before each quantized matmul
(q8_0, q8_K for K-quants, as our Numba backend does too); the Triton kernels keep them in f32."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf_cut import cut_blocks
from parity_checks import assert_parity
from test_triton_models import prefill_logits

from localinfer.llm import LLM

TEXT = "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is"


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["smollm2_path", "qwen2_path", "gemma3_path"])
def test_cut_real_model_matches_llama_cpp(fixture, request, tmp_path: Path):
    llama_cpp = pytest.importorskip("llama_cpp")
    path = cut_blocks(request.getfixturevalue(fixture), tmp_path / "cut.gguf", 2)
    llm = LLM(path, backend="triton", kv_cache_mb=4, max_model_len=256)
    tokens = llm.encode(TEXT)
    ours = prefill_logits(llm, tokens)
    llm.close()
    ref_llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, n_batch=256, n_threads=2,
                              logits_all=True, verbose=False)
    ref_llm.eval(tokens)
    ref = np.array(ref_llm.scores[: len(tokens)], dtype=np.float32)
    assert_parity(ref, ours, max_mean_kl=1e-2)
