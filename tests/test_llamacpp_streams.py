"""The llama.cpp backend with one KV stream per sequence (kv_unified off, as llama-server's
slots) on the real SmolLM2 GGUF: the engine honours a stream's length and the number of
streams, a shared prefix is copied across streams (whole stream, then trimmed), and
outputs equal plain llama.cpp's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localinfer import LLM, SamplingParams
from localinfer.errors import ContextLengthExceededError

pytest.importorskip("llama_cpp")

KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 2  # SmolLM2-135M: 30 layers, 3 KV heads of 64, f16
STREAM = 256  # cells per stream in these tests
PROMPTS = ["The capital of France is", "def quicksort(arr):\n", "1, 2, 3, 5, 8, 13,",
           "Once upon a time, in a small village by the sea,"]
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


def streams_llm(path: Path, streams: int, **kw) -> LLM:
    kv_mb = (streams * STREAM + 8) * KV_BYTES_PER_TOKEN / 2**20  # a few cells spare
    options = {"flash_attn": False, "kv_unified": False, **kw.pop("backend_options", {})}
    return LLM(str(path), backend="llamacpp", threads=2, max_model_len=2048,
               kv_cache_mb=kv_mb, backend_options=options, **kw)


@pytest.fixture(scope="module")
def llm(smollm2_path: Path):
    with streams_llm(smollm2_path, 4, max_num_seqs=4) as model:
        yield model


def plain_llamacpp(llama_ref, prompt: list[int], n: int) -> list[int]:
    llama_ref.reset()
    llama_ref.eval(prompt)
    out = []
    for _ in range(n):
        out.append(int(np.asarray(llama_ref.scores[llama_ref.n_tokens - 1]).argmax()))
        llama_ref.eval([out[-1]])
    return out


def test_streams_cap_each_sequence_and_say_so(llm: LLM) -> None:
    runner, engine = llm.engine.runner, llm.engine
    assert not runner.kv_unified and runner.n_seq_max == 4
    assert runner.max_seq_len == STREAM and engine.max_model_len == STREAM
    with pytest.raises(ContextLengthExceededError, match=f"KV cache holds {STREAM} tokens"):
        engine.add_request(list(range(1, STREAM + 2)), GREEDY)
    # a sequence that reaches its stream's end stops there with finish "length"
    prompt = llm.encode("Count: 1 2 3 4 5")
    long = SamplingParams(max_tokens=1000, temperature=0.0, ignore_eos=True)
    r = llm.generate([prompt], long)[0]
    assert r.finish_reason == "length" and len(prompt) + len(r.token_ids) == STREAM


def test_alone_equals_plain_llamacpp(llm: LLM, llama_ref) -> None:
    for text in PROMPTS[:2]:
        prompt = llm.encode(text)
        assert llm.generate([prompt], GREEDY)[0].token_ids == plain_llamacpp(llama_ref, prompt, 16)


def test_shared_prefix_is_copied_across_streams(llm: LLM, smollm2_path: Path) -> None:
    system = {"role": "system", "content": "You are a careful assistant. " * 12}
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    runner = llm.engine.runner
    llm.generate([[system, {"role": "user", "content": "Say hello."}]], params)
    copied, recomputed = runner.prefix_tokens_copied, runner.prefix_tokens_recomputed
    chats = [[system, {"role": "user", "content": u}] for u in ("Name a fruit.", "Count.")]
    later = [llm.generate([c], params)[0] for c in chats]
    cached = sum(r.num_cached_tokens for r in later)
    assert cached >= 2 * 64  # about 70 shared tokens each
    assert runner.prefix_tokens_copied - copied == cached  # every cached token was copied
    assert runner.prefix_tokens_recomputed == recomputed
    assert not runner.kv.live and llm.engine.block_manager.num_used_blocks == 0
    with LLM(str(smollm2_path), backend="llamacpp", threads=2, max_model_len=2048,
             enable_prefix_caching=False, backend_options={"flash_attn": False}) as fresh:
        for chat, r in zip(chats, later, strict=True):
            assert r.token_ids == fresh.generate([chat], params)[0].token_ids


def test_fewer_streams_than_sequences_admit_no_more(smollm2_path: Path, llama_ref) -> None:
    """Two streams, max_num_seqs 4: the scheduler runs two sequences at a time."""
    with streams_llm(smollm2_path, 2, max_num_seqs=4,
                     backend_options={"n_seq_max": 2}) as two:
        engine = two.engine
        assert engine.scheduler.max_running == 2 and two.engine.runner.n_seq_max == 2
        prompts = [two.encode(p) for p in PROMPTS]
        for p in prompts:
            engine.add_request(p, GREEDY)
        most = 0
        while engine.has_unfinished_requests():
            engine.step()
            most = max(most, len(engine.scheduler.running))
        assert most == 2
        assert not engine.runner.kv.live


def test_kv_unified_flag_reaches_the_runner_options() -> None:
    import argparse

    from localinfer.commands.backend_flags import add_backend_arguments, backend_options
    from localinfer.errors import InvalidRequestError

    p = argparse.ArgumentParser()
    add_backend_arguments(p)
    assert backend_options(p.parse_args(["--backend", "llamacpp"]))["kv_unified"] is None
    opts = backend_options(p.parse_args(["--backend", "llamacpp", "--kv-unified", "off"]))
    assert opts["kv_unified"] is False
    with pytest.raises(InvalidRequestError, match="--kv-unified needs --backend llamacpp"):
        backend_options(p.parse_args(["--kv-unified", "on"]))
