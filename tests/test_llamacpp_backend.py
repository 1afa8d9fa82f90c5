"""The llama.cpp backend (localinfer's scheduler and block manager over llama.cpp's decoder) on
the real SmolLM2 GGUF: parity with plain llama.cpp and with the Numba backend, batching,
prefix copies, preemption, and the errors when llama-cpp-python is missing or too old.

Batched llama.cpp decoding is not bitwise batch-invariant on CPU (a row's matmul and
attention sums run through other kernels when several sequences share a step), so batched
and preempted runs are held to the parity rule of tests/test_llm_parity.py: identical up to
the first position where plain llama.cpp's top-1 leads its runner-up by less than 0.5.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from localinfer import LLM, SamplingParams
from localinfer.errors import BackendUnavailableError

pytest.importorskip("llama_cpp")

CHAT = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
PROMPTS = [
    "The capital of France is",
    "def quicksort(arr):\n",
    "Once upon a time, in a small village by the sea,",
    "1, 2, 3, 5, 8, 13,",
    CHAT.format("Give me three tips for staying healthy."),
    CHAT.format("Name three colors of the rainbow."),
    CHAT.format("What is 2 + 2?"),
    CHAT.format("Write a haiku about the sea."),
]
N = 24
GREEDY = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(smollm2_path: Path):
    # flash attention off, as in llama-cpp-python's Llama (the reference): bit-equal logits
    with LLM(str(smollm2_path), backend="llamacpp", threads=2, max_model_len=2048,
             backend_options={"flash_attn": False}) as model:
        yield model


@pytest.fixture(scope="module")
def prompts(llama_ref) -> list[list[int]]:
    return [llama_ref.tokenize(p.encode(), add_bos=False, special=True) for p in PROMPTS]


@pytest.fixture(scope="module")
def reference(llama_ref, prompts) -> list[tuple[list[int], list[float]]]:
    """Plain llama.cpp (Llama.eval, one token at a time): greedy tokens and top-1 leads."""
    out = []
    for prompt in prompts:
        llama_ref.reset()
        llama_ref.eval(prompt)
        tokens, leads = [], []
        for _ in range(N):
            row = np.array(llama_ref.scores[llama_ref.n_tokens - 1], dtype=np.float32)
            top2 = np.partition(row, -2)[-2:]
            tokens.append(int(row.argmax()))
            leads.append(float(top2[1] - top2[0]))
            llama_ref.eval([tokens[-1]])
        out.append((tokens, leads))
    return out


def assert_same_until_near_tie(got: list[int], ref: list[int], leads: list[float]) -> int:
    """Equal up to the first difference, which must sit where llama.cpp leads by < 0.5."""
    diff = next((i for i, (a, b) in enumerate(zip(got, ref, strict=True)) if a != b), len(ref))
    if diff < len(ref):
        assert leads[diff] < 0.5, f"differs at {diff} where llama.cpp leads by {leads[diff]:.2f}"
    return diff


def test_greedy_alone_equals_plain_llamacpp(llm: LLM, prompts, reference) -> None:
    for prompt, (ref, _) in zip(prompts, reference, strict=True):
        assert llm.generate([prompt], GREEDY)[0].token_ids == ref
    runner = llm.engine.runner
    assert runner.decode_calls > 0 and runner.tokens_decoded > 0


def test_batched_8_equals_alone_up_to_near_ties(llm: LLM, prompts, reference) -> None:
    runner = llm.engine.runner
    calls = runner.decode_calls
    together = llm.generate(prompts, GREEDY)
    # one llama_decode per engine step: 8 prefills together, then 8 tokens per decode step
    assert runner.decode_calls - calls == N
    same = [assert_same_until_near_tie(r.token_ids, ref, leads)
            for r, (ref, leads) in zip(together, reference, strict=True)]
    print(f"batched tokens identical to alone: {sum(same)} of {N * len(prompts)}")
    assert sum(same) >= N * len(prompts) // 2


def test_greedy_matches_numba_where_llamacpp_is_confident(
    smollm2_path: Path, prompts, reference
) -> None:
    with LLM(str(smollm2_path), backend="numba", threads=2, max_model_len=2048) as numba_llm:
        for prompt, (ref, leads) in zip(prompts[:4], reference[:4], strict=True):
            got = numba_llm.generate([prompt], GREEDY)[0].token_ids
            assert_same_until_near_tie(got, ref, leads)


def test_shared_system_prompt_is_copied_not_recomputed(llm: LLM) -> None:
    system = {"role": "system", "content": "You are a careful assistant. " * 12}
    params = SamplingParams(max_tokens=4, temperature=0.0)
    runner = llm.engine.runner
    first = llm.generate([system, {"role": "user", "content": "Say hello."}], params)[0]
    copied, recomputed = runner.prefix_tokens_copied, runner.prefix_tokens_recomputed
    decoded = runner.tokens_decoded
    users = ["Say goodbye.", "Count to three.", "Name a fruit."]
    later = llm.generate([[system, {"role": "user", "content": u}] for u in users], params)
    cached = sum(r.num_cached_tokens for r in later)
    assert cached >= 3 * (first.num_prompt_tokens // 16 - 1) * 16 > 0
    assert runner.prefix_tokens_copied - copied == cached  # every cached token was a seq_cp
    assert runner.prefix_tokens_recomputed == recomputed
    prompt_tokens = sum(r.num_prompt_tokens for r in later)
    assert runner.tokens_decoded - decoded == prompt_tokens - cached + 3 * 3
    assert not runner.kv.live and llm.engine.block_manager.num_used_blocks == 0


def test_evicted_prefix_is_recomputed_in_the_same_decode(smollm2_path: Path) -> None:
    """With one llama.cpp sequence id, a finished request's cached blocks lose their cells
    when the next request needs the id; the engine still serves them from its prefix cache,
    so the runner recomputes them in front of the new tokens (logits rows shifted past them)
    and the reply equals the same request on a fresh runner."""
    system = {"role": "system", "content": "You are a careful assistant. " * 6}
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    second = [system, {"role": "user", "content": "Name a fruit."}]
    with LLM(str(smollm2_path), backend="llamacpp", threads=2, max_model_len=2048,
             backend_options={"flash_attn": False, "n_seq_max": 1}) as one_id:
        runner = one_id.engine.runner
        one_id.generate([[system, {"role": "user", "content": "Say hello."}]], params)
        got = one_id.generate([second], params)[0]
        assert got.num_cached_tokens >= 32
        assert runner.kv.evicted_holders == 1 and runner.prefix_tokens_copied == 0
        assert runner.prefix_tokens_recomputed == got.num_cached_tokens
    with LLM(str(smollm2_path), backend="llamacpp", threads=2, max_model_len=2048,
             enable_prefix_caching=False, backend_options={"flash_attn": False}) as fresh:
        assert got.token_ids == fresh.generate([second], params)[0].token_ids


def test_preemption_keeps_outputs_and_cleans_llamacpp_cache(
    smollm2_path: Path, prompts, reference
) -> None:
    # 12 blocks of 16 tokens for 8 sequences of up to ~60 tokens: preemption is certain
    kv_mb = 12 * 16 * LLM_KV_BYTES_PER_TOKEN / 2**20
    with LLM(str(smollm2_path), backend="llamacpp", threads=2, max_model_len=2048,
             kv_cache_mb=kv_mb, backend_options={"flash_attn": False}) as small:
        assert small.engine.block_manager.num_blocks == 12
        results = small.generate(prompts, GREEDY)
        engine, runner = small.engine, small.engine.runner
        assert engine.scheduler.num_preemptions > 0
        for r, (ref, leads) in zip(results, reference, strict=True):
            assert_same_until_near_tie(r.token_ids, ref, leads)
        # nothing live; llama.cpp holds cells only for blocks the engine still caches
        assert not runner.kv.live
        bm = engine.block_manager
        holders = runner.kv.cell_blocks()
        assert set(holders) == set(runner.kv.retired)
        bs = bm.block_size
        for seq in range(runner.n_seq_max):
            blocks = holders.get(seq, set())
            assert all(bm.blocks[b].hash is not None for b in blocks)
            top = max((runner.kv.records[b].index + 1) * bs - 1 for b in blocks) if blocks else -1
            assert runner.seq_pos_max(seq) == top
        assert sum(len(b) for b in holders.values()) <= bm.num_blocks


LLM_KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 2  # SmolLM2-135M: 30 layers, 3 KV heads of 64, f16


def test_missing_llama_cpp_is_a_clear_error(smollm2_path: Path) -> None:
    code = (
        "import sys\nsys.modules['llama_cpp'] = None\n"
        "from localinfer import LLM\nfrom localinfer.errors import BackendUnavailableError\n"
        "try:\n"
        f"    LLM({str(smollm2_path)!r}, backend='llamacpp')\n"
        "except BackendUnavailableError as exc:\n    print('ERR', exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("ERR"), out.stderr[-2000:]
    assert "llama-cpp-python" in out.stdout and "localinfer[llamacpp]" in out.stdout


def test_missing_function_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import llama_cpp
    from localinfer.backends.llamacpp import bindings

    monkeypatch.delattr(llama_cpp, "llama_memory_seq_cp")
    with pytest.raises(BackendUnavailableError, match="lacks llama_memory_seq_cp"):
        bindings.load()


def test_other_architectures_run_where_numba_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    qwen = Path("/work/models/qwen/qwen2.5-coder-0.5b-instruct.gguf")
    if not qwen.exists():
        pytest.skip("qwen2.5-coder-0.5b not pulled")
    from localinfer import model_config
    from localinfer.errors import UnsupportedModelError

    # every real model here now runs on Numba too: pretend qwen2 is an architecture it lacks
    monkeypatch.setattr(model_config, "SUPPORTED_ARCHITECTURES", ("llama",))
    with pytest.raises(UnsupportedModelError):
        LLM(str(qwen), backend="numba")
    with LLM(str(qwen), backend="llamacpp", threads=2, max_model_len=512) as model:
        res = model.generate(["The capital of France is"],
                             SamplingParams(max_tokens=4, temperature=0.0))[0]
        assert "Paris" in res.text


def test_only_llamacpp_errors_reach_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    """ggml's levels: 3 WARN and 2 INFO stay quiet, 4 ERROR prints, and a 5 CONT line
    follows the message it continues."""
    from localinfer.backends.llamacpp import bindings

    for level, text in ((2, b"info\n"), (3, b"warn "), (5, b"warn tail\n"), (4, b"error "),
                        (5, b"error tail\n"), (3, b"warn again\n")):
        bindings._forward(level, text, None)
    assert capsys.readouterr().err == "error error tail\n"


def test_structured_output_is_enforced_on_llamacpp_logits(llm: LLM) -> None:
    """The engine masks whatever logits a runner returns: llama.cpp's own buffer too."""
    import json

    from localinfer.structured import StructuredOutput

    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"], "additionalProperties": False}
    params = [SamplingParams(max_tokens=48, structured=StructuredOutput(json=schema)),
              SamplingParams(max_tokens=8, structured=StructuredOutput(choice=["yes", "no"])),
              SamplingParams(max_tokens=16, structured=StructuredOutput(regex=r"[0-9]{3}"))]
    prompts = [CHAT.format("Describe a person as JSON."), CHAT.format("Is water wet?"),
               CHAT.format("Pick a number.")]
    outs = [llm.generate([llm.tokenizer.encode(p, parse_special=True)], sp)[0]
            for p, sp in zip(prompts, params, strict=True)]
    person = json.loads(outs[0].text)
    assert set(person) == {"name", "age"} and 0 <= person["age"] <= 120
    assert outs[1].text in ("yes", "no")
    assert len(outs[2].text) == 3 and outs[2].text.isdigit()
    assert all(o.finish_reason == "stop" for o in outs)
