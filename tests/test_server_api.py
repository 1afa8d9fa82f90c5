"""The server through the real openai client: chat, completions, streaming, n, logprobs."""

from __future__ import annotations

import httpx
import pytest

openai = pytest.importorskip("openai")

CHAT = [{"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                         timeout=120)


def test_chat_completion(client) -> None:
    r = client.chat.completions.create(model="smollm2-test", messages=CHAT, max_tokens=12,
                                       temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.model == "smollm2-test" and r.created > 0
    assert r.system_fingerprint.startswith("localinfer-")
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_matches_non_stream_and_reports_usage(client) -> None:
    kwargs = {"model": "smollm2-test", "messages": CHAT, "max_tokens": 12, "temperature": 0}
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason
    assert all(f is None for f in finishes[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_completion_and_stream(client) -> None:
    kwargs = {"model": "smollm2-test", "prompt": "The capital of France is", "max_tokens": 8,
              "temperature": 0}
    whole = client.completions.create(**kwargs)
    assert whole.object == "text_completion" and whole.choices[0].text
    chunks = list(client.completions.create(**kwargs, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_max_tokens_ends_with_length(client) -> None:
    r = client.completions.create(model="smollm2-test", prompt="One, two, three, four,",
                                  max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3
    r = client.chat.completions.create(model="smollm2-test", messages=CHAT,
                                       max_completion_tokens=2, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 2


def test_stop_string(client) -> None:
    prompt = "1, 2, 3, 4, 5, 6, 7, 8,"
    free = client.completions.create(model="smollm2-test", prompt=prompt, max_tokens=12,
                                     temperature=0).choices[0].text
    assert " 10" in free, free  # the model counts on
    r = client.completions.create(model="smollm2-test", prompt=prompt, max_tokens=12,
                                  temperature=0, stop=[" 10"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == free[: free.index(" 10")]
    chunks = list(client.completions.create(model="smollm2-test", prompt=prompt,
                                            max_tokens=12, temperature=0, stop=" 10",
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text


def test_n_choices(client) -> None:
    r = client.chat.completions.create(model="smollm2-test", messages=CHAT, max_tokens=6,
                                       temperature=0, n=2)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].message.content == r.choices[1].message.content  # greedy
    assert r.usage.completion_tokens == 2 * (r.usage.completion_tokens // 2) > 0
    sampled = client.chat.completions.create(model="smollm2-test", messages=CHAT,
                                             max_tokens=6, temperature=1.0, n=2, seed=7)
    again = client.chat.completions.create(model="smollm2-test", messages=CHAT,
                                           max_tokens=6, temperature=1.0, n=2, seed=7)
    assert [c.message.content for c in sampled.choices] == [
        c.message.content for c in again.choices]  # seeds derived from the request's seed
    chunks = list(client.completions.create(model="smollm2-test", prompt="Hello", n=2,
                                            max_tokens=4, temperature=0, stream=True))
    texts = ["".join(c.choices[0].text for c in chunks if c.choices[0].index == i)
             for i in (0, 1)]
    assert texts[0] == texts[1]


def test_chat_logprobs(client) -> None:
    r = client.chat.completions.create(model="smollm2-test", messages=CHAT, max_tokens=4,
                                       temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 3
        assert item.top_logprobs[0].logprob >= item.top_logprobs[-1].logprob
        assert item.token == item.top_logprobs[0].token  # greedy picks the most likely
    text = "".join(i.token for i in content if i.token != "<|im_end|>")
    assert text == r.choices[0].message.content


def test_completion_logprobs_streamed(client) -> None:
    chunks = list(client.completions.create(model="smollm2-test", prompt="Hello, my name is",
                                            max_tokens=4, temperature=0, logprobs=2,
                                            stream=True))
    lps = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
    tokens = [t for lp in lps for t in lp.tokens]
    assert len(tokens) == 4 and all(len(top) == 2 for lp in lps for top in lp.top_logprobs)


def test_token_id_prompt_and_tokenize(server, client) -> None:
    ids = httpx.post(f"{server.url}/tokenize", json={"prompt": "Hello world"}).json()
    assert ids["count"] == len(ids["tokens"]) > 0 and ids["max_model_len"] == 512
    text = httpx.post(f"{server.url}/detokenize", json={"tokens": ids["tokens"]}).json()
    assert text["prompt"].endswith("Hello world")
    by_text = client.completions.create(model="smollm2-test", prompt="Hello world",
                                        max_tokens=4, temperature=0)
    by_ids = client.completions.create(model="smollm2-test", prompt=ids["tokens"],
                                       max_tokens=4, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    chat = httpx.post(f"{server.url}/tokenize", json={"messages": CHAT}).json()
    assert chat["count"] > 5


def test_models_health_metrics(server, client) -> None:
    assert [m.id for m in client.models.list()] == ["smollm2-test"]
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    text = httpx.get(f"{server.url}/metrics").text
    for name in ("localinfer_time_to_first_token_seconds_bucket",
                 "localinfer_time_per_output_token_seconds_bucket",
                 "localinfer_e2e_request_latency_seconds_bucket",
                 "localinfer_http_requests_total", "localinfer_num_requests_waiting",
                 "localinfer_num_requests_running", "localinfer_kv_blocks_used",
                 "localinfer_kv_blocks_total", "localinfer_prefix_cache_hit_rate",
                 "localinfer_prompt_tokens_total", "localinfer_generation_tokens_total"):
        assert name in text, name



def test_bench_serve_load_generator(server, capsys, tmp_path) -> None:
    from localinfer import cli

    out = tmp_path / "serve.json"
    rc = cli.main(["bench", "serve", "--url", server.url, "--concurrency", "1,2",
                   "--requests", "2", "--prompt-len", "16", "--max-tokens", "4",
                   "--json", str(out)])
    assert rc == 0
    table = capsys.readouterr().out
    assert "output tok/s" in table and "TTFT p99" in table
    import json

    runs = json.loads(out.read_text())
    assert [r["concurrency"] for r in runs] == [1, 2]
    assert all(r["failed"] == 0 and r["mean_output_tokens"] == 4 for r in runs)
    assert all(12 <= r["mean_prompt_tokens"] <= 24 for r in runs)
