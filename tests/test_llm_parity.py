"""The whole engine on the real SmolLM2 GGUF against llama.cpp (llama-cpp-python) on the same file.

Criteria (issue 2): teacher-forced over >= 500 positions, wherever llama.cpp's top-1 leads its
runner-up by >= 0.5 our top-1 is the same, and mean KL(llama.cpp || ours) <= 5e-3; greedy
32-token continuations identical up to the first position where llama.cpp's lead is < 0.5.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from parity_checks import kl_per_position, lead, row_leads

from localinfer import LLM, SamplingParams

TEXT = (Path(__file__).parent / "data" / "parity_text.txt").read_text()

CHAT = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
PROMPTS = [
    "The capital of France is",
    "def quicksort(arr):\n",
    "Once upon a time, in a small village by the sea,",
    "1, 2, 3, 5, 8, 13,",
    "The three primary colors are",
    "import numpy as np\nimport",
    "Monday, Tuesday, Wednesday,",
    CHAT.format("Give me three tips for staying healthy."),
    CHAT.format("Name three colors of the rainbow."),
    CHAT.format("What is 2 + 2?"),
    CHAT.format("Explain what a computer is in one sentence."),
    CHAT.format("Write a haiku about the sea."),
]


@pytest.fixture(scope="module")
def llm(smollm2_path: Path):
    with LLM(str(smollm2_path), threads=2, max_model_len=2048) as model:
        yield model


def test_teacher_forced_logits_match_llamacpp(llm: LLM, llama_ref) -> None:
    tokens = llama_ref.tokenize(TEXT.encode(), add_bos=False, special=True)
    assert len(tokens) >= 501
    ours = llm.score(tokens)  # goes through the scheduler: several prefill chunks
    llama_ref.reset()
    llama_ref.eval(tokens)
    ref = np.array(llama_ref.scores[: len(tokens)], dtype=np.float32)
    assert ours.shape == ref.shape
    kl = kl_per_position(ref, ours)
    confident = row_leads(ref) >= 0.5
    same_top1 = ref.argmax(-1) == ours.argmax(-1)
    mismatches = np.flatnonzero(confident & ~same_top1)
    print(f"positions {len(tokens)}, mean KL {kl.mean():.2e}, top-1 agreement {same_top1.mean():.4f}")
    assert mismatches.size == 0, f"confident top-1 differs at {mismatches[:10]}"
    assert kl.mean() <= 5e-3


def llamacpp_greedy(llama_ref, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    llama_ref.reset()
    llama_ref.eval(prompt)
    out, leads = [], []
    for _ in range(n):
        row = np.array(llama_ref.scores[llama_ref.n_tokens - 1], dtype=np.float32)
        tok = int(row.argmax())
        out.append(tok)
        leads.append(lead(row))
        llama_ref.eval([tok])
    return out, leads


def test_greedy_continuations_match_llamacpp(llm: LLM, llama_ref) -> None:
    """Identical up to the first position where llama.cpp's lead is < 0.5 — and stricter: the
    first token where the two differ at all must be such a position."""
    prompts = [llama_ref.tokenize(p.encode(), add_bos=False, special=True) for p in PROMPTS]
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    results = llm.generate(prompts, params)
    agreed = 0
    for prompt, res in zip(prompts, results, strict=True):
        ref, leads = llamacpp_greedy(llama_ref, prompt, 32)
        first_diff = next((i for i, (a, b) in enumerate(zip(res.token_ids, ref, strict=True)) if a != b), 32)
        if first_diff < 32:
            assert leads[first_diff] < 0.5, (
                f"differs at {first_diff} where llama.cpp leads by {leads[first_diff]:.2f}: "
                f"{llm.tokenizer.decode(res.token_ids)!r} vs {llm.tokenizer.decode(ref)!r}"
            )
        agreed += first_diff
    print(f"greedy tokens identical to llama.cpp: {agreed} of {32 * len(prompts)}")
    assert agreed >= 64  # the comparison covered real ground


def test_batched_equals_alone(llm: LLM) -> None:
    prompts = [
        "Write a haiku about the sea.",
        "What is 12 times 12?",
        "List three fruits.",
        "Translate 'good morning' into French.",
        "Why is the sky blue?",
        "Name a famous painter.",
        "What does a CPU do?",
        "Give me a word that rhymes with cat.",
    ]
    chats = [[{"role": "user", "content": p}] for p in prompts]
    params = SamplingParams(max_tokens=24, temperature=0.0)
    together = llm.generate(chats, params)
    for chat, res in zip(chats, together, strict=True):
        alone = llm.generate(chat, params)[0]
        assert alone.token_ids == res.token_ids
        assert alone.text == res.text
    assert all(r.token_ids for r in together)


def test_shared_system_prompt_is_served_from_cache(llm: LLM) -> None:
    system = {"role": "system", "content": "You are a careful assistant. " * 12}
    params = SamplingParams(max_tokens=4, temperature=0.0)
    first = llm.generate([system, {"role": "user", "content": "Say hello."}], params)[0]
    before = llm.engine.stats()
    second = llm.generate([system, {"role": "user", "content": "Say goodbye."}], params)[0]
    after = llm.engine.stats()
    bs = before.block_size
    assert second.num_cached_tokens >= (first.num_prompt_tokens // bs - 1) * bs > 0
    assert after.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens == second.num_cached_tokens
    assert after.kv_blocks_used == before.kv_blocks_used == 0  # everything freed after


def test_chat_answer_is_coherent(llm: LLM) -> None:
    res = llm.generate([{"role": "user", "content": "Explain what a computer is in one sentence."}],
                       SamplingParams(max_tokens=32))[0]
    assert "computer is a device" in res.text.lower()
    assert res.finish_reason in ("stop", "length")


def test_stream_concatenates_to_generate(llm: LLM) -> None:
    chat = [{"role": "user", "content": "Count from one to five."}]
    params = SamplingParams(max_tokens=20)
    deltas = list(llm.stream(chat, params))
    assert deltas[-1].finished
    assert "".join(d.text for d in deltas) == llm.generate(chat, params)[0].text


def test_seeded_sampling_is_reproducible(llm: LLM) -> None:
    params = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, seed=1234)
    a = llm.generate("The weather today", params)[0]
    b = llm.generate("The weather today", params)[0]
    assert a.token_ids == b.token_ids


def test_stop_string_and_max_tokens(llm: LLM) -> None:
    # llama.cpp's greedy answer starts "A computer is a device that processes information",
    # each token with a clear lead, so the stop string's position does not hang on a near-tie
    chat = [{"role": "user", "content": "Explain what a computer is in one sentence."}]
    full = llm.generate(chat, SamplingParams(max_tokens=40))[0].text
    assert "device" in full
    cut = llm.generate(chat, SamplingParams(max_tokens=40, stop=["device"]))[0]
    assert cut.finish_reason == "stop" and "device" not in cut.text
    assert full.startswith(cut.text) and cut.text.strip()
    short = llm.generate(chat, SamplingParams(max_tokens=3))[0]
    assert short.finish_reason == "length" and len(short.token_ids) == 3
