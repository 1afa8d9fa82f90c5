"""`localinfer serve --backend llamacpp`: the real uvicorn server over the llama.cpp backend on
SmolLM2, driven by the real openai client (the server tests' harness, another backend), in both KV
layouts (the unified pool the auto rule picks here, and one stream per sequence).

Concurrent streams are held to the llama.cpp backend's parity rule (tests/
test_llamacpp_backend.py): batched llama.cpp decoding is not bitwise batch-invariant on CPU, so
a stream run together with others must equal the same request run alone up to the first
token where the lone run's top-1 led its runner-up by less than 0.5 (read from its logprobs).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("llama_cpp")
pytest.importorskip("uvicorn")
from server_harness import ServerThread, metrics, wait_idle  # noqa: E402

from localinfer.server.config import ServerConfig  # noqa: E402

MODEL = "smollm2-llamacpp"
PROMPTS = ["Name a fruit.", "What is 2+2?", "Say hello in French.", "Name a planet.",
           "What color is the sky?", "Count to five.", "Name a dog breed.", "Spell 'cat'."]
IDLE_BOUND_S = 10.0  # an abort waits for the step in progress on a busy 2-core machine


KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 2  # SmolLM2-135M: 30 layers, 3 KV heads of 64, f16


@pytest.fixture(scope="module", params=["auto", "streams"])
def server(smollm2_path: Path, request):
    # one thread: llama.cpp's spinning thread barrier crawls on a busy, shared 2-core machine
    layout = {}
    if request.param == "streams":  # one KV stream of 512 cells per sequence (-np 16 slots)
        layout = {"backend_options": {"kv_unified": False},
                  "kv_cache_mb": (16 * 512 + 8) * KV_BYTES_PER_TOKEN / 2**20}
    config = ServerConfig(model=str(smollm2_path), served_model_name=MODEL, backend="llamacpp",
                          max_model_len=512, max_num_seqs=16, threads=1, **layout)
    srv = ServerThread(config, smollm2_path).start()
    runner = srv.state.llm.engine.runner
    assert runner.kv_unified == (request.param == "auto") and srv.state.max_model_len == 512
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=300)


def stream_chat(client, prompt: str, max_tokens: int = 16) -> tuple[list[str], list[float]]:
    """Streamed greedy reply: its tokens and each token's top-1 lead over the runner-up."""
    chunks = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
        temperature=0, stream=True, logprobs=True, top_logprobs=2)
    tokens, leads = [], []
    for c in chunks:
        if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content:
            for t in c.choices[0].logprobs.content:
                tokens.append(t.token)
                top = [x.logprob for x in t.top_logprobs]
                leads.append(top[0] - top[1])
    return tokens, leads


def test_chat_stream_non_stream_n2_logprobs(client) -> None:
    kwargs = {"model": MODEL, "messages": [{"role": "user", "content": "Name three colors."}],
              "max_tokens": 12, "temperature": 0}
    whole = client.chat.completions.create(**kwargs)
    assert whole.system_fingerprint.endswith("-llamacpp") and whole.model == MODEL
    assert whole.choices[0].message.content and 0 < whole.usage.completion_tokens <= 12
    chunks = list(client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        whole.usage.completion_tokens

    # n=2 with logprobs: the engine's sampler gives them on this backend too
    r = client.chat.completions.create(**{**kwargs, "temperature": 0.8, "seed": 7}, n=2,
                                       logprobs=True, top_logprobs=3)
    assert [c.index for c in r.choices] == [0, 1]
    for c in r.choices:
        content = c.logprobs.content
        assert content and c.message.content
        for t in content:
            assert t.logprob <= 0 and len(t.top_logprobs) == 3
            assert t.top_logprobs[0].logprob >= t.logprob - 1e-6
    # greedy: the chosen token is the top-1 of its own logprobs
    g = client.chat.completions.create(**kwargs, logprobs=True, top_logprobs=1)
    assert all(t.token == t.top_logprobs[0].token for t in g.choices[0].logprobs.content)


def test_concurrent_streams_equal_alone_up_to_near_ties(client) -> None:
    alone = [stream_chat(client, p) for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: stream_chat(client, p)[0], PROMPTS))
    same = 0
    for got, (ref, leads) in zip(together, alone, strict=True):
        diff = next((i for i, (a, b) in enumerate(zip(got, ref, strict=False)) if a != b), None)
        if diff is None:
            assert len(got) == len(ref)
            same += len(ref)
        else:
            assert leads[diff] < 0.5, f"differs at {diff} where the lone run leads by " \
                                      f"{leads[diff]:.2f}: {got} vs {ref}"
            same += diff
    assert same >= sum(len(r) for r, _ in alone) // 2


def test_disconnect_frees_kv_and_llamacpp_cells(server) -> None:
    url = server.url
    wait_idle(url, metrics(url)["localinfer_kv_blocks_used"], 60)
    baseline = metrics(url)["localinfer_kv_blocks_used"]
    runner = server.state.llm.engine.runner
    body = {"model": MODEL, "prompt": "Tell me a long story.", "max_tokens": 400,
            "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
        lines = r.iter_lines()
        events = 0
        while events < 3:
            events += next(lines).startswith("data:")
        m = metrics(url)
        assert m["localinfer_num_requests_running"] == 1
        assert m["localinfer_kv_blocks_used"] > baseline
        assert len(runner.kv.live) == 1
    closed = time.monotonic()
    wait_idle(url, baseline, IDLE_BOUND_S)
    print(f"disconnect -> idle in {time.monotonic() - closed:.3f} s")
    # llama.cpp keeps cells only for blocks the engine's prefix cache still holds
    assert not runner.kv.live
    with_cells = {b for blocks in runner.kv.cell_blocks().values() for b in blocks}
    assert with_cells <= set(server.state.llm.engine.block_manager.cached_blocks.values())
    assert metrics(url)["localinfer_kv_blocks_total"] == runner.n_cells // runner.block_size
