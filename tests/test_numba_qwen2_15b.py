"""The Numba runner on Qwen2.5-Coder-1.5B (Q4_K / Q6_K, 28 layers, 1536 wide) against llama.cpp
on the same file, on the host's native kernel path: the larger check of issue 4.

Criteria as test_numba_qwen2.py: teacher-forced on 300 tokens, wherever llama.cpp's top-1 leads
by >= 0.5 ours is the same and mean KL(llama.cpp || ours) <= 5e-3; a greedy 16-token
continuation first differs (if at all) only where llama.cpp's lead is < 0.5.  The file is
~1.1 GB (LOCALINFER_TEST_QWEN2_15B, else pulled into the catalog cache).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")
llama_cpp = pytest.importorskip("llama_cpp")

from parity_checks import kl_per_position, lead, row_leads  # noqa: E402
from test_numba_parity import make_batch, run_chunks  # noqa: E402

pytestmark = pytest.mark.slow

TEXT = (Path(__file__).parent / "data" / "parity_text.txt").read_text()
N_TOKENS = 300
N_GREEDY = 16


def test_qwen2_15b_matches_llama_cpp(qwen2_15b_path: Path) -> None:
    from localinfer.backends.numba_cpu.isa import resolve_isa
    from localinfer.backends.numba_cpu.runner import NumbaModelRunner

    from localinfer.gguf_file import open_gguf
    from localinfer.model_config import ModelConfig

    ref = llama_cpp.Llama(model_path=str(qwen2_15b_path), n_ctx=512, n_batch=512, n_threads=2,
                          logits_all=True, verbose=False)
    tokens = ref.tokenize(TEXT.encode(), add_bos=False, special=True)[:N_TOKENS]
    assert len(tokens) == N_TOKENS
    ref.eval(tokens)
    ref_logits = np.array(ref.scores[:N_TOKENS], dtype=np.float32)
    prompt = ref.tokenize(b"def quicksort(arr):\n", add_bos=False, special=True)
    ref.reset()
    ref.eval(prompt)
    ref_greedy, leads = [], []
    for _ in range(N_GREEDY):
        row = np.array(ref.scores[ref.n_tokens - 1], dtype=np.float32)
        ref_greedy.append(int(row.argmax()))
        leads.append(lead(row))
        ref.eval([ref_greedy[-1]])
    del ref

    g = open_gguf(qwen2_15b_path)
    config = ModelConfig.from_gguf(g)
    assert (config.arch, config.n_layers, config.n_embd) == ("qwen2", 28, 1536)
    isa = resolve_isa("auto")
    runner = NumbaModelRunner(g, config, num_blocks=24, block_size=16, threads=2, isa=isa)
    try:
        ours = run_chunks(runner, tokens, [200, N_TOKENS - 200], list(range(20)))
        greedy, pos, nxt = [], 0, prompt
        for _ in range(N_GREEDY):  # prefill, then one decode step per token
            row = runner.execute(make_batch([(nxt, pos, list(range(20, 24)))]))[-1]
            pos += len(nxt)
            nxt = [int(row.argmax())]
            greedy.append(nxt[0])
    finally:
        runner.close()
        g.close()

    confident = row_leads(ref_logits) >= 0.5
    same = ref_logits.argmax(1) == ours.argmax(1)
    kl = kl_per_position(ref_logits, ours)
    first = next((i for i, (a, b) in enumerate(zip(greedy, ref_greedy, strict=True)) if a != b),
                 N_GREEDY)
    print(f"qwen2.5-coder-1.5b {isa}: mean KL {kl.mean():.2e}, max {kl.max():.2e}, top-1 "
          f"agreement {same.mean():.4f}, greedy identical for {first}/{N_GREEDY}")
    mismatch = np.flatnonzero(confident & ~same)
    assert mismatch.size == 0, f"top-1 differs at confident positions {mismatch.tolist()}"
    assert kl.mean() <= 5e-3, f"mean KL {kl.mean():.2e}, max {kl.max():.2e}"
    if first < N_GREEDY:
        assert leads[first] < 0.5, f"greedy differs at {first} where llama.cpp leads by " \
                                   f"{leads[first]:.2f}"
