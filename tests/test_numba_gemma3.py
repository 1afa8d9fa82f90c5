"""The Numba runner on gemma-3-270m (gemma3: embedding scale, per-head Q/K norms, post-norms,
GELU-tanh gated FFN, head_dim 256, sliding-window layers with their own rope base) against
llama.cpp on the same file, on every kernel path; and the sliding-window attention kernels
against a plain reference.

Criteria (issue 4): teacher-forced over the whole parity text (588 tokens, past the 512-token
window), wherever llama.cpp's top-1 leads by >= 0.5 our top-1 is the same and mean
KL(llama.cpp || ours) <= 5e-3; a greedy 16-token continuation first differs (if at all) only
where llama.cpp's lead is < 0.5.

This small model amplifies rounding: llama.cpp against itself on a copy whose attn_norm weights
are scaled by (1 + 1e-6) (quantized matrices bit-identical) already differs by mean KL ~7e-3, and
flash attention on vs off by 6.9e-3.  So, as in test_numba_quant_parity.py, the KL bound is
max(5e-3, 2 x that floor) and confident top-1 flips may number at most 2 x the perturbed run's + 1.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

from parity_checks import kl_per_position, lead, row_leads  # noqa: E402
from test_numba_parity import make_batch, run_chunks  # noqa: E402
from test_numba_quant_parity import perturbed_copy  # noqa: E402

TEXT = (Path(__file__).parent / "data" / "parity_text.txt").read_text()
BLOCKS = 48  # 768 slots


@pytest.fixture(scope="module")
def gemma_ref(gemma3_path: Path):
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(model_path=str(gemma3_path), n_ctx=1024, n_batch=512, n_threads=2,
                           logits_all=True, verbose=False)


@pytest.fixture(scope="module")
def gemma_floor(gemma3_path: Path, tmp_path_factory: pytest.TempPathFactory):
    """llama.cpp's teacher-forced logits on the file and on its rounding-perturbed copy."""
    llama_cpp = pytest.importorskip("llama_cpp")
    pert = perturbed_copy(gemma3_path, tmp_path_factory.mktemp("gemma_pert") / "pert.gguf")
    out = []
    for path in (gemma3_path, pert):
        ref = llama_cpp.Llama(model_path=str(path), n_ctx=1024, n_batch=512, n_threads=2,
                              logits_all=True, verbose=False)
        tokens = ref.tokenize(TEXT.encode(), add_bos=True, special=True)
        ref.eval(tokens)
        out.append(np.array(ref.scores[: len(tokens)], dtype=np.float32))
        ref.close()
    pert.unlink()
    return tokens, out[0], out[1]


def compare(ref: np.ndarray, other: np.ndarray) -> tuple[float, list[int]]:
    """-> (mean KL(ref || other), positions where ref leads by >= 0.5 and top-1s differ)."""
    kl = kl_per_position(ref, other)
    confident = row_leads(ref) >= 0.5
    same = ref.argmax(1) == other.argmax(1)
    return float(kl.mean()), np.flatnonzero(confident & ~same).tolist()


@pytest.fixture(scope="module", params=["native", "generic"])
def gemma_runner(request, gemma3_path: Path):
    from localinfer.backends.numba_cpu.isa import resolve_isa
    from localinfer.backends.numba_cpu.runner import NumbaModelRunner

    from localinfer.gguf_file import open_gguf
    from localinfer.model_config import ModelConfig

    isa = resolve_isa("auto") if request.param == "native" else "generic"
    if request.param == "native" and isa == "generic":
        pytest.skip("this host has no native kernel path")
    g = open_gguf(gemma3_path)
    config = ModelConfig.from_gguf(g)
    assert config.arch == "gemma3"
    assert (config.head_dim, config.sliding_window, config.rope_base_swa) == (256, 512, 1e4)
    assert [i for i, s in enumerate(config.swa_layers) if not s] == [5, 11, 17]
    r = NumbaModelRunner(g, config, num_blocks=BLOCKS, block_size=16, threads=2, isa=isa)
    assert r.isa == isa
    yield r
    r.close()
    g.close()


@pytest.mark.slow
def test_teacher_forced_logits_match_llama_cpp(gemma_runner, gemma_floor) -> None:
    tokens, ref, pert = gemma_floor
    n = len(tokens)
    assert n > 512 + 16  # the last chunk's queries see only part of the context
    ours = run_chunks(gemma_runner, tokens, [400, n - 400], list(range(BLOCKS)))
    kl, flips = compare(ref, ours)
    floor_kl, floor_flips = compare(ref, pert)
    print(f"{gemma_runner.isa}: mean KL {kl:.2e} (llama.cpp perturbed: {floor_kl:.2e}), "
          f"confident top-1 flips {flips} (perturbed: {floor_flips})")
    assert len(flips) <= 2 * len(floor_flips) + 1, f"top-1 differs at confident {flips}"
    assert kl <= max(5e-3, 2 * floor_kl), f"mean KL {kl:.2e}, floor {floor_kl:.2e}"


@pytest.mark.slow
def test_greedy_continuation_matches_llama_cpp(gemma_runner, gemma_ref) -> None:
    prompt = gemma_ref.tokenize(b"The old lighthouse keeper climbed", add_bos=True, special=True)
    table = list(range(40, 44))
    ours, pos, nxt = [], 0, prompt
    for _ in range(16):  # prefill, then one decode step per token
        row = gemma_runner.execute(make_batch([(nxt, pos, table)]))[-1]
        pos += len(nxt)
        nxt = [int(row.argmax())]
        ours.append(nxt[0])
    gemma_ref.reset()
    gemma_ref.eval(prompt)
    ref, leads = [], []
    for _ in range(16):
        row = np.array(gemma_ref.scores[gemma_ref.n_tokens - 1], dtype=np.float32)
        ref.append(int(row.argmax()))
        leads.append(lead(row))
        gemma_ref.eval([ref[-1]])
    first = next((i for i, (a, b) in enumerate(zip(ours, ref, strict=True)) if a != b), 16)
    print(f"{gemma_runner.isa}: greedy identical for {first} of 16 tokens")
    if first < 16:
        assert leads[first] < 0.5, f"differs at {first} where llama.cpp leads by {leads[first]:.2f}"


# -- sliding-window attention kernels ---------------------------------------------------------

def _reference_attention(q, k, v, positions, window):
    """q (n, heads, hd), k/v (ctx, hd) one kv head, f16-rounded like the kernels."""
    f16 = lambda a: a.astype(np.float16).astype(np.float64)  # noqa: E731
    out = np.zeros(q.shape)
    for i, p in enumerate(positions):
        lo = max(0, p + 1 - window) if window else 0
        s = f16(q[i]) @ f16(k[lo:p + 1]).T
        e = np.exp(s - s.max(-1, keepdims=True))
        out[i] = f16(e / e.sum(-1, keepdims=True)) @ f16(v[lo:p + 1])
    return out


@pytest.mark.parametrize("isa", ["generic", "native"])
@pytest.mark.parametrize("window", [0, 5, 16, 37])
def test_attention_window_matches_reference(isa: str, window: int) -> None:
    from localinfer.backends.numba_cpu.dispatch import attend
    from localinfer.backends.numba_cpu.isa import Isa, resolve_isa
    from numba import njit

    if isa == "native":
        isa = resolve_isa("auto")
        if isa == "generic":
            pytest.skip("this host has no native kernel path")

    @njit
    def run(isa, qkv, heads, hd, positions, seq, tables, bs, slots, kp, vp, scratch, out, w):
        attend(isa, qkv, heads, 1, hd, positions, seq, tables, bs, slots, kp, vp,
               np.float32(1.0), scratch, out, w)

    rng = np.random.default_rng(window)
    heads, hd, bs, n = 2, 32, 16, 70
    qkv = rng.standard_normal((n, (heads + 2) * hd)).astype(np.float32)
    positions = np.arange(n, dtype=np.int64)
    order = rng.permutation(8)  # scattered physical blocks
    tables = order[None].astype(np.int64)
    slots = np.array([order[p // bs] * bs + p % bs for p in range(n)], np.int64)
    if isa == "generic":
        kp = np.zeros((8, bs, 1, hd), np.uint16)
        vp = np.zeros((8, bs, 1, hd), np.uint16)
    else:
        kp = np.zeros((8, 1, hd, bs), np.uint16)
        vp = np.zeros((8, 1, bs, hd), np.uint16)
    scratch = np.zeros((2, heads, 4 * hd + 8 * bs + 64), np.float32)
    out = np.zeros((n, heads * hd), np.float32)
    run(Isa(isa), qkv, heads, hd, positions, np.zeros(n, np.int64), tables, bs, slots, kp, vp,
        scratch, out, window)
    q = qkv[:, : heads * hd].reshape(n, heads, hd)
    ref = _reference_attention(q, qkv[:, heads * hd:(heads + 1) * hd], qkv[:, (heads + 1) * hd:],
                               positions, window)
    np.testing.assert_allclose(out.reshape(n, heads, hd), ref, atol=2e-3)


# -- sliding-window KV pool (engine/sliding_window.py) ------------------------------------------

def _generate(runner, tokenizer, prompt: list[int], n_out: int):
    from localinfer.engine.config import EngineConfig
    from localinfer.engine.llm_engine import LLMEngine
    from localinfer.sampling_params import SamplingParams

    engine = LLMEngine(runner, tokenizer, EngineConfig(
        max_model_len=runner.num_blocks * 16, block_size=16, num_blocks=runner.num_blocks))
    engine.add_request(prompt, SamplingParams(max_tokens=n_out, temperature=0.0,
                                              ignore_eos=True))
    out: list[int] = []
    peak = 0
    while engine.has_unfinished_requests():
        for o in engine.step():
            out.extend(o.token_ids)
        if engine.sliding is not None:
            peak = max(peak, engine.sliding.num_used_blocks)
    return out, engine, peak


@pytest.mark.slow
def test_sliding_pool_frees_blocks_and_keeps_outputs(gemma3_path: Path) -> None:
    """A generation past the window: the sliding layers hold at most the window's blocks
    (plus the block being written) while the global pool grows, and the tokens equal those of
    a run whose sliding layers keep every block."""
    from localinfer.backends.numba_cpu.runner import NumbaModelRunner

    from localinfer.gguf_file import open_gguf
    from localinfer.model_config import ModelConfig
    from localinfer.tokenizer import Tokenizer

    g = open_gguf(gemma3_path)
    config = ModelConfig.from_gguf(g)
    tokenizer = Tokenizer.from_gguf(g.metadata)
    runner = NumbaModelRunner(g, config, num_blocks=64, block_size=16, threads=2)
    try:
        prompt = tokenizer.encode(TEXT, add_special=True)[:200]
        n_out = 520  # 720 tokens: 208 past the 512-token window
        freed, engine, peak = _generate(runner, tokenizer, prompt, n_out)
        assert engine.sliding is not None and engine.sliding.window == 512
        bound = 512 // 16 + 1  # blocks a window of 512 can touch
        assert peak <= bound, f"sliding pool peaked at {peak} blocks (bound {bound})"
        assert engine.sliding.num_used_blocks == 0  # all returned when the request finished
        assert len(prompt) + n_out > 16 * (bound + 8)  # the global table outgrew the bound
        runner.sliding_window = 0  # the same runner, sliding layers reading full tables
        full, engine_full, _ = _generate(runner, tokenizer, prompt, n_out)
        assert engine_full.sliding is None
        assert freed == full
    finally:
        runner.close()
        g.close()
